// HTTP fuzzing of a real `switchyard serve` (its own process, with its worker): seeded cases over paths, methods,
// headers, bodies, encodings (test/fuzz/http-cases.ts), sent pipelined in batches over many keep-alive connections at
// once, while connection behaviours (half-closed sockets, garbage, idle connections, slow senders, oversized bodies) run
// beside them on sockets of their own, a bounded number at a time. Every case must get a status of its expected class
// (or a closed socket where node itself refuses), a slow or idle connection must be cut by the server's timeouts, the
// server must never exit and must answer /healthz every `checkEvery` cases and at the end, and bystander streams run
// for the whole time and must each finish intact. `npm run fuzz:http -- --cases 1000000` ends with one JSON line
// {"cases","crashes","bystanderBroken","maxRssMb",...}; test/api/http/fuzz.test.ts runs a bounded budget in npm test.
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { connectClient, type SwitchyardClient as Client } from '../../api/client.ts';
import { createWallClock, type Clock } from '../../runtime/clock.ts';
import { serve, type Served } from '../e2e/harness.ts';
import { drawCase, rng, type Behaviour, type Case, type Framed } from './http-cases.ts';
import { GARBLED, STALLED, keepAlive, runBehaviour } from './http-wire.ts';

/** The fuzz run's result. */
export interface FuzzResult {
  cases: number;
  /** The server process exited, or failed a /healthz check. */
  crashes: number;
  bystanderBroken: number;
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
}

const MODEL = 'llama-3-8b';
/** The server's timeouts in the fuzz: an idle or slow connection is cut within them (plus the check interval). */
const HEADERS_TIMEOUT_MS = 1_000;
const REQUEST_TIMEOUT_MS = 2_000;
/** A framed request with no progress for this long counts as stalled (the server's timeouts are far shorter). */
const STALL_MS = 30_000;

/** Runs `cases` cases against a fresh `serve` process. */
export async function runHttpFuzz(opts: FuzzOptions): Promise<FuzzResult> {
  const clock = createWallClock();
  const t0 = clock.now();
  const served: Served = await serve([
    '--time-scale',
    '0.05',
    '--headers-timeout-ms',
    String(HEADERS_TIMEOUT_MS),
    '--request-timeout-ms',
    String(REQUEST_TIMEOUT_MS),
    '--drain-ms',
    '0',
  ]);
  const port = Number(new URL(served.url).port);
  const result: FuzzResult = {
    cases: 0,
    crashes: 0,
    bystanderBroken: 0,
    maxRssMb: 0,
    unexpected: [],
    unexpectedCount: 0,
    bystanders: 0,
    healthChecks: 0,
    healthFailed: 0,
    byKind: {},
    seconds: 0,
  };
  let exited = false;
  let stopping = false;
  served.proc.once('exit', () => {
    exited = true;
    if (!stopping) result.crashes++;
  });
  let client: Client | null = null;
  try {
    await served.waitReady(MODEL);
    client = await connectClient(served.wsUrl, {});
    const bystanders = bystand(client, result);
    await fuzz(port, served.proc.pid, clock, opts, result, () => exited);
    await bystanders.stop();
    if (result.bystanders === 0) result.bystanderBroken++;
  } finally {
    client?.close();
    result.seconds = Math.round((clock.now() - t0) / 100) / 10;
    stopping = true;
    await served.stop();
  }
  return result;
}

/** Bystanders stream one after another for the whole run; each must end done with every token it asked for. */
function bystand(client: Client, result: FuzzResult): { stop(): Promise<void> } {
  let stop = false;
  const running = (async () => {
    while (!stop) {
      const s = client.stream({ model: MODEL, prompt: `bystander ${result.bystanders}`, maxTokens: 200 });
      let n = 0;
      try {
        for await (const c of s) n += c.n;
        const end = await s.result;
        if (!end.ok || end.usage.completionTokens !== 200 || n !== 200) {
          result.bystanderBroken++;
          note(result, `bystander: ended ${end.ok ? 'done' : end.error.message} after ${n} tokens`);
        }
      } catch (e) {
        result.bystanderBroken++;
        note(result, `bystander: ${(e as Error).message}`);
      }
      result.bystanders++;
    }
  })();
  return {
    stop: () => {
      stop = true;
      return running;
    },
  };
}

/** Set by the command line: each unexpected case is printed as it happens (the first 20), not only at the end. */
let echoNotes = false;

function note(result: FuzzResult, line: string): void {
  result.unexpectedCount++;
  if (result.unexpected.length < 20) {
    result.unexpected.push(line);
    if (echoNotes) process.stderr.write(`unexpected: ${line}\n`);
  }
}

/** The cases themselves: keep-alive lanes, the two behaviour pools, health checks and the RSS sampler. */
async function fuzz(
  port: number,
  pid: number | undefined,
  clock: Clock,
  opts: FuzzOptions,
  result: FuzzResult,
  exited: () => boolean,
): Promise<void> {
  const r = rng(opts.seed ?? 1);
  const stopAt = clock.now() + (opts.maxMs ?? Infinity);
  let drawn = 0;
  const draw = (): Case | null => {
    if (drawn >= opts.cases || exited() || clock.now() >= stopAt) return null;
    drawn++;
    return drawCase(r);
  };
  const health = healthChecker(port, clock, opts.checkEvery ?? 1000, result);
  const record = (kind: string, ok: (s: number) => boolean, status: number, what: string): void => {
    result.cases++;
    result.byKind[kind] = (result.byKind[kind] ?? 0) + 1;
    if (!ok(status)) {
      const why = status === STALLED ? 'stalled' : status === GARBLED ? 'garbled answer' : String(status);
      note(result, `${kind} -> ${why}: ${JSON.stringify(what.slice(0, 160))}`);
    }
    health.counted(result.cases);
  };
  const bound = (b: Behaviour): number => (b.slow ? REQUEST_TIMEOUT_MS + 3_000 + b.pieces * b.everyMs : 15_000);
  const pools = {
    quick: pool(opts.quickBehaviours ?? 16, (b) => runBehaviour(port, b, clock, bound(b))),
    slow: pool(opts.slowBehaviours ?? 160, (b) => runBehaviour(port, b, clock, bound(b))),
  };
  const onBehaviour = (b: Behaviour, status: number): void => record(b.kind, b.ok, status, b.bytes);
  const stopSampling = ticker(clock, 500, () => {
    result.maxRssMb = Math.max(result.maxRssMb, rssOf(pid));
  });
  const began = clock.now();
  const progress = opts.progressMs
    ? ticker(clock, opts.progressMs, () => progressLine(result, drawn, (clock.now() - began) / 1000, pid))
    : null;
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
      if (got.garbled !== undefined && result.unexpected.length < 20) {
        result.unexpected.push(`garbled: ${got.garbled}`);
        if (echoNotes) process.stderr.write(`garbled: ${got.garbled}\n`);
      }
      for (const a of got.answered) record(a.c.kind, a.c.ok, a.status, a.c.bytes);
      retry.push(...got.requeue);
    }
    conn.close();
  };
  const lanes = opts.connections ?? 32;
  await Promise.all(Array.from({ length: lanes }, lane));
  // Requests sent again by a lane that has already stopped.
  while (retry.length > 0) await lane();
  await Promise.all([pools.quick.idle(), pools.slow.idle()]);
  stopSampling();
  progress?.();
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

/** Calls `fn` every `ms` until the returned stop is called (which calls it once more). */
function ticker(clock: Clock, ms: number, fn: () => void): () => void {
  let t = clock.setTimeout(function tick() {
    fn();
    t = clock.setTimeout(tick, ms);
  }, ms);
  return () => {
    clock.clearTimeout(t);
    fn();
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

/** CPU seconds a process has used (Linux /proc, user + system), 0 when unknown. */
function cpuOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
}

/** Resident set of a process in MiB (Linux /proc), 0 when unknown. */
function rssOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return Math.round(Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024);
  } catch {
    return 0;
  }
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
    },
    strict: true,
  });
  const n = (s: string): number => Number(s);
  const cases = n(values.cases);
  const maxSeconds = n(values['max-seconds']);
  const ints = [cases, n(values.connections), n(values.pipeline), n(values['check-every'])];
  if (!ints.every((x) => Number.isSafeInteger(x) && x >= 1) || !(maxSeconds > 0)) {
    process.stderr.write(
      'usage: npm run fuzz:http -- [--cases 1000000] [--seed 1] [--max-seconds 3600] [--connections 32] ' +
        '[--pipeline 16] [--check-every 1000]\n',
    );
    process.exit(2);
  }
  echoNotes = true;
  runHttpFuzz({
    cases,
    seed: n(values.seed),
    maxMs: maxSeconds * 1000,
    connections: n(values.connections),
    pipeline: n(values.pipeline),
    checkEvery: n(values['check-every']),
    progressMs: 10_000,
  }).then(
    (r) => {
      process.stderr.write(`by kind: ${JSON.stringify(r.byKind)}\n`);
      const { unexpected, unexpectedCount, byKind, ...line } = r;
      void unexpected;
      void byKind;
      process.stdout.write(`${JSON.stringify({ ...line, unexpected: unexpectedCount })}\n`);
      const failed = r.crashes > 0 || r.bystanderBroken > 0 || unexpectedCount > 0 || r.cases < cases;
      process.exitCode = failed ? 1 : 0;
    },
    (e: unknown) => {
      process.stderr.write(`http-fuzz: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exitCode = 1;
    },
  );
}
