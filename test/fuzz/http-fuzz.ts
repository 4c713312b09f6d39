// HTTP fuzzing of a real `switchyard serve` (its own process, with its worker): seeded cases over paths, methods,
// headers, bodies, encodings (test/fuzz/http-cases.ts), sent pipelined in batches over many keep-alive connections at
// once, while connection behaviours (half-closed sockets, garbage, idle connections, slow senders, oversized bodies) run
// beside them on sockets of their own, a bounded number at a time. Every case must get a status of its expected class
// (or a closed socket where node itself refuses), a slow or idle connection must be cut by the server's timeouts, the
// server must never exit and must answer /healthz every `checkEvery` cases and at the end, and bystander streams run
// for the whole time and must each finish intact. With `--semantic` the cases are well-framed requests whose fields
// and headers carry hostile values (test/fuzz/http-semantic.ts), run in batches after each of which no request may be
// left live. `npm run fuzz:http -- --cases 1000000` ends with one JSON line
// {"cases","crashes","unexpected","leakedRequests","bystanderBroken","maxRssMb",...}; test/api/http/fuzz.test.ts runs
// a bounded budget of each in npm test.
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createWallClock, type Clock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import type { Served } from '../e2e/harness.ts';
import { drawCase, rng, type Behaviour, type Case, type Framed } from './http-cases.ts';
import { drawSemantic } from './http-semantic.ts';
import { GARBLED, STALLED, keepAlive, runBehaviour } from './http-wire.ts';
import {
  REQUEST_TIMEOUT_MS,
  cpuOf,
  echo,
  keepNote,
  leakedAfterBatch,
  rssOf,
  reporter,
  withLiveServer,
  ticker,
  type Bystander,
} from './live.ts';

/** The fuzz run's result. */
export interface FuzzResult {
  cases: number;
  /** The server process exited, or failed a /healthz check. */
  crashes: number;
  bystanderBroken: number;
  /** Most requests found live after a batch of cases had ended (the bystander's aside). */
  leakedRequests: number;
  maxRssMb: number;
  /** Cases whose answer was outside the expected class, with what came back (at most 20 kept). */
  unexpected: string[];
  /** How many cases were outside the expected class (all of them, not only those kept). */
  unexpectedCount: number;
  bystanders: number;
  healthChecks: number;
  healthFailed: number;
  /** Cases per kind (framed requests and connection behaviours). */
  byKind: Record<string, number>;
  seconds: number;
}

/** Options of a fuzz run. */
export interface FuzzOptions {
  cases: number;
  seed?: number;
  /** Keep-alive connections sending batches at once. Default 32. */
  connections?: number;
  /** Requests per pipelined batch. Default 16. */
  pipeline?: number;
  /** Connection behaviours running at once: quick ones and slow ones (idle, slow senders). Defaults 16 and 160. */
  quickBehaviours?: number;
  slowBehaviours?: number;
  /** Check /healthz after every this many cases (and at the end). Default 1000. */
  checkEvery?: number;
  /** No batch is sent while a health check is owed or running: each check follows its group of cases. */
  gated?: boolean;
  /** Stop drawing cases after this long (ms); `cases` in the result is the exact count run. */
  maxMs?: number;
  /** Print progress to stderr every this many ms. */
  progressMs?: number;
  /** Well-framed requests with hostile field and header values (http-semantic.ts) instead of the raw cases. */
  semantic?: boolean;
  /** Cases between two checks that no request is left live (semantic mode; the raw mode checks at its end). */
  batch?: number;
}

/** A framed request with no progress for this long counts as stalled (the server's timeouts are far shorter). */
const STALL_MS = 30_000;

/** Runs `cases` cases against a fresh `serve` process. */
export async function runHttpFuzz(opts: FuzzOptions): Promise<FuzzResult> {
  const clock = createWallClock();
  const t0 = clock.now();
  const result: FuzzResult = {
    cases: 0,
    crashes: 0,
    bystanderBroken: 0,
    leakedRequests: 0,
    maxRssMb: 0,
    unexpected: [],
    unexpectedCount: 0,
    bystanders: 0,
    healthChecks: 0,
    healthFailed: 0,
    byKind: {},
    seconds: 0,
  };
  const report = reporter(result, (why) => note(result, why));
  try {
    // Semantic cases are mostly whole completions: simulated time runs faster so that each takes little of the run.
    result.bystanders = await withLiveServer(opts.semantic ? 0.005 : 0.05, 200, report, (run) =>
      batches(run.served, clock, opts, result, run.bystander, run.exited),
    );
    if (result.bystanders === 0) result.bystanderBroken++;
  } finally {
    result.seconds = Math.round((clock.now() - t0) / 100) / 10;
  }
  return result;
}

/**
 * The cases in batches (semantic mode; the raw mode is one batch), the server's RSS sampled meanwhile. After each batch
 * every request must have ended: `switchyard_live_requests` back to the bystander's own.
 */
async function batches(
  served: Served,
  clock: Clock,
  opts: FuzzOptions,
  result: FuzzResult,
  bystander: Bystander,
  exited: () => boolean,
): Promise<void> {
  const port = Number(new URL(served.url).port);
  const pid = served.proc.pid;
  const raw = rng(opts.seed ?? 1);
  const semantic = createRng(opts.seed ?? 1);
  const draw = opts.semantic ? (): Case => drawSemantic(semantic) : (): Case => drawCase(raw);
  const stopAt = clock.now() + (opts.maxMs ?? Infinity);
  const stopSampling = ticker(clock, 500, () => {
    result.maxRssMb = Math.max(result.maxRssMb, rssOf(pid));
  });
  const began = clock.now();
  let drawn = 0;
  const progress = opts.progressMs
    ? ticker(clock, opts.progressMs, () => progressLine(result, drawn, (clock.now() - began) / 1000, pid))
    : null;
  const size = opts.semantic ? (opts.batch ?? 2000) : opts.cases;
  try {
    await batchesOf(size);
  } finally {
    stopSampling();
    progress?.();
  }
  async function batchesOf(size: number): Promise<void> {
    for (let done = 0; done < opts.cases && !exited() && clock.now() < stopAt; done += size) {
      const cases = Math.min(size, opts.cases - done);
      let left = cases;
      const next = (): Case | null => {
        if (left <= 0 || exited() || clock.now() >= stopAt) return null;
        left--;
        drawn++;
        return draw();
      };
      await fuzz(port, clock, opts, result, exited, next);
      if (exited()) break;
      const leaked = await leakedAfterBatch(served, clock, bystander);
      if (leaked > 0) {
        result.leakedRequests = Math.max(result.leakedRequests, leaked);
        note(result, `${leaked} requests still live after ${result.cases} cases`);
      }
    }
  }
}

function note(result: FuzzResult, line: string): void {
  result.unexpectedCount++;
  keepNote(result.unexpected, line);
}

/** One batch of cases: keep-alive lanes, the two behaviour pools and the health checks. */
async function fuzz(
  port: number,
  clock: Clock,
  opts: FuzzOptions,
  result: FuzzResult,
  exited: () => boolean,
  draw: () => Case | null,
): Promise<void> {
  const health = healthChecker(port, clock, opts.checkEvery ?? 1000, result);
  const record = (c: Case, status: number): void => {
    result.cases++;
    result.byKind[c.kind] = (result.byKind[c.kind] ?? 0) + 1;
    if (!c.ok(status)) {
      const why = status === STALLED ? 'stalled' : status === GARBLED ? 'garbled answer' : String(status);
      const what =
        c.type === 'framed' && c.what !== undefined ? c.what.slice(0, 200) : JSON.stringify(c.bytes.slice(0, 160));
      note(result, `${c.kind} -> ${why}: ${what}`);
    }
    health.counted(result.cases);
  };
  const bound = (b: Behaviour): number => (b.slow ? REQUEST_TIMEOUT_MS + 3_000 + b.pieces * b.everyMs : 15_000);
  const pools = {
    quick: pool(opts.quickBehaviours ?? 16, (b) => runBehaviour(port, b, clock, bound(b))),
    slow: pool(opts.slowBehaviours ?? 160, (b) => runBehaviour(port, b, clock, bound(b))),
  };
  const onBehaviour = (b: Behaviour, status: number): void => record(b, status);
  const retry: Framed[] = [];
  const pipeline = opts.pipeline ?? 16;
  const lane = async (): Promise<void> => {
    const conn = keepAlive(port, clock, STALL_MS);
    for (;;) {
      // A batch: requests sent again first, then new ones; one the server is expected to close after goes last.
      const batch: Framed[] = [];
      let closer: Framed | null = null;
      for (let i = 0; i < retry.length && batch.length < pipeline;) {
        const c = retry[i]!;
        if (c.closes && closer !== null) {
          i++;
          continue;
        }
        retry.splice(i, 1);
        if (c.closes) closer = c;
        else batch.push(c);
      }
      while (batch.length < pipeline && closer === null) {
        const c = draw();
        if (c === null) break;
        if (c.type === 'behaviour') {
          const p = c.slow ? pools.slow : pools.quick;
          await p.room();
          p.run(c, onBehaviour);
        } else if (c.closes) closer = c;
        else batch.push(c);
      }
      if (closer) batch.push(closer);
      if (batch.length === 0) break;
      if (opts.gated) await health.settled();
      const got = await conn.send(batch);
      if (got.garbled !== undefined) keepNote(result.unexpected, `garbled: ${got.garbled}`, 'garbled');
      for (const a of got.answered) record(a.c, a.status);
      retry.push(...got.requeue);
    }
    conn.close();
  };
  const lanes = opts.connections ?? 32;
  await Promise.all(Array.from({ length: lanes }, lane));
  // Requests sent again by a lane that has already stopped.
  while (retry.length > 0) await lane();
  await Promise.all([pools.quick.idle(), pools.slow.idle()]);
  await health.final();
  if (exited()) result.crashes = Math.max(result.crashes, 1);
}

/** A bounded pool of behaviours: `room()` resolves when one more may start without the backlog growing past 2x. */
function pool(
  size: number,
  exec: (b: Behaviour) => Promise<number>,
): {
  room(): Promise<void>;
  run(b: Behaviour, done: (b: Behaviour, status: number) => void): void;
  idle(): Promise<void>;
} {
  let active = 0;
  const queue: { b: Behaviour; done: (b: Behaviour, status: number) => void }[] = [];
  const waiters: (() => void)[] = [];
  const start = (): void => {
    while (active < size && queue.length > 0) {
      const { b, done } = queue.shift()!;
      active++;
      void exec(b).then((status) => {
        active--;
        done(b, status);
        start();
        while (waiters.length > 0 && queue.length < size) waiters.shift()!();
      });
    }
  };
  return {
    room: () => (queue.length < size ? Promise.resolve() : new Promise<void>((res) => waiters.push(res))),
    run: (b, done) => {
      queue.push({ b, done });
      start();
    },
    idle: async () => {
      while (active > 0 || queue.length > 0) await new Promise<void>((res) => waiters.push(res));
    },
  };
}

/**
 * /healthz on a connection of its own after every `every` cases (one at a time, none skipped) and at the end; 200 or
 * it counts as a crash. `settled()` resolves once every check owed so far is done (the lanes wait on it when gated).
 */
function healthChecker(
  port: number,
  clock: Clock,
  every: number,
  result: FuzzResult,
): { counted(cases: number): void; settled(): Promise<void>; final(): Promise<void> } {
  const probe: Behaviour = {
    type: 'behaviour',
    kind: 'slow-complete',
    bytes: 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n',
    ok: (s) => s === 200,
    halfClose: false,
    pieces: 1,
    everyMs: 0,
    slow: false,
  };
  let owed = 0;
  let running: Promise<void> | null = null;
  const drain = async (): Promise<void> => {
    while (owed > 0) {
      owed--;
      const status = await runBehaviour(port, probe, clock, 10_000);
      result.healthChecks++;
      if (status !== 200) {
        result.healthFailed++;
        result.crashes++;
        note(result, `/healthz -> ${status} after ${result.cases} cases`);
      }
    }
    running = null;
  };
  const owe = (): void => {
    owed++;
    running ??= drain();
  };
  let next = every;
  return {
    counted: (cases) => {
      while (cases >= next) {
        next += every;
        owe();
      }
    },
    settled: async () => {
      while (running) await running;
    },
    final: async () => {
      while (running) await running;
      owe();
      await running;
    },
  };
}

function progressLine(result: FuzzResult, drawn: number, seconds: number, pid: number | undefined): void {
  const rate = result.cases / Math.max(0.001, seconds);
  const cpu = `server cpu ${cpuOf(pid).toFixed(0)} s, fuzzer cpu ${(process.cpuUsage().user / 1e6).toFixed(0)} s`;
  process.stderr.write(
    `http-fuzz: ${seconds.toFixed(0)} s, ${result.cases} cases (${drawn} drawn), ${rate.toFixed(0)}/s, ${cpu}, ` +
      `unexpected ${result.unexpectedCount}, ` +
      `health ${result.healthChecks - result.healthFailed}/${result.healthChecks}, bystanders ${result.bystanders}, ` +
      `rss ${result.maxRssMb} MiB\n`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: {
      cases: { type: 'string', default: '1000000' },
      seed: { type: 'string', default: '1' },
      'max-seconds': { type: 'string', default: '3600' },
      connections: { type: 'string', default: '32' },
      pipeline: { type: 'string', default: '16' },
      'check-every': { type: 'string', default: '1000' },
      semantic: { type: 'boolean', default: false },
      batch: { type: 'string', default: '2000' },
    },
    strict: true,
  });
  const n = (s: string): number => Number(s);
  const cases = n(values.cases);
  const maxSeconds = n(values['max-seconds']);
  const ints = [cases, n(values.connections), n(values.pipeline), n(values['check-every']), n(values.batch)];
  if (!ints.every((x) => Number.isSafeInteger(x) && x >= 1) || !(maxSeconds > 0)) {
    process.stderr.write(
      'usage: npm run fuzz:http -- [--cases 1000000] [--seed 1] [--max-seconds 3600] [--connections 32] ' +
        '[--pipeline 16] [--check-every 1000] [--semantic [--batch 2000]]\n',
    );
    process.exit(2);
  }
  echo.notes = true;
  runHttpFuzz({
    cases,
    seed: n(values.seed),
    maxMs: maxSeconds * 1000,
    connections: n(values.connections),
    pipeline: n(values.pipeline),
    checkEvery: n(values['check-every']),
    semantic: values.semantic,
    batch: n(values.batch),
    progressMs: 10_000,
  }).then(
    (r) => {
      process.stderr.write(`by kind: ${JSON.stringify(r.byKind)}\n`);
      const { unexpected, unexpectedCount, byKind, ...line } = r;
      void unexpected;
      void byKind;
      process.stdout.write(`${JSON.stringify({ ...line, unexpected: unexpectedCount })}\n`);
      const failed =
        r.crashes > 0 || r.bystanderBroken > 0 || unexpectedCount > 0 || r.leakedRequests > 0 || r.cases < cases;
      process.exitCode = failed ? 1 : 0;
    },
    (e: unknown) => {
      process.stderr.write(`http-fuzz: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exitCode = 1;
    },
  );
}
