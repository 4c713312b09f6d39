// WebSocket fuzzing of a real `switchyard serve`: seeded hostile submits and cancels (test/fuzz/ws-cases.ts) over JSON
// and msgpack connections at once, each frame's answers checked against what the protocol's decoder makes of its bytes:
// a refused frame gets one `error` (invalid_request), every decoded submit one `rejected` with a typed code or a stream
// (`accepted`, contiguous tokens, one `done` or typed `error`); long streams are cancelled and must end `cancelled`.
// After each batch of cases the server must answer /healthz and have no request left live; a bystander streams for
// the whole run. `npm run fuzz:ws -- --cases 1000000` ends with one JSON line; test/api/ws-fuzz.test.ts runs a few.
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createWallClock, type Clock } from '../../runtime/clock.ts';
import { createRng, type Rng } from '../../runtime/rng.ts';
import { OUTCOME_CODES } from '../../machines/outcomes.ts';
import {
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
  decodeClientFrame,
  decodeServerFrame,
  encodeFrame,
  type FrameFormat,
  type ServerMessage,
} from '../../transport/client-protocol.ts';
import { connectWs, type WsPeer } from '../../transport/ws.ts';
import type { Served } from '../e2e/harness.ts';
import { drawWsCase, type WsCase } from './ws-cases.ts';
import {
  cpuOf,
  echo,
  keepNote,
  healthy,
  leakedAfterBatch,
  rssOf,
  reporter,
  withLiveServer,
  ticker,
  type Bystander,
} from './live.ts';

/** The result of a fuzz run; the command prints it as one JSON line (`unexpected` as a count). */
export interface WsFuzzResult {
  cases: number;
  /** The server process exited, or failed a /healthz check. */
  crashes: number;
  unexpected: number;
  /** Most requests found live after a batch had ended (the bystander's aside). */
  leakedRequests: number;
  bystanderBroken: number;
  maxRssMb: number;
  /** Cases msgpack could not encode (skipped on msgpack connections). */
  skipped: number;
  /** Requests accepted, cancelled by the fuzzer, and streams that ended done. */
  accepted: number;
  cancelled: number;
  streamed: number;
  bystanders: number;
  healthChecks: number;
  seconds: number;
  /** The first unexpected answers (at most 20). */
  notes: string[];
}

/** Options of a run. */
export interface WsFuzzOptions {
  cases: number;
  seed?: number;
  /** Connections, alternately JSON and msgpack. Default 32. */
  connections?: number;
  /** Cases between two checks of /healthz and of live requests. Default 2000. */
  batch?: number;
  /** Streams whose maxTokens exceed this are cancelled once accepted (others may run to their end). Default 32. */
  cancelAbove?: number;
  progressMs?: number;
  maxMs?: number;
}

/** A case with no answer for this long has stalled. */
const STALL_MS = 30_000;
const CODES = new Set(Object.keys(OUTCOME_CODES));

/** What one case still waits for. */
interface Waiting {
  frameErrors: number;
  submits: Map<string, { live: boolean; tokens: number; cancelled: boolean; maxTokens: number }>;
}

/** Runs `cases` cases against a fresh `serve` process. */
export async function runWsFuzz(opts: WsFuzzOptions): Promise<WsFuzzResult> {
  const clock = createWallClock();
  const t0 = clock.now();
  const result: WsFuzzResult = {
    cases: 0,
    crashes: 0,
    unexpected: 0,
    leakedRequests: 0,
    bystanderBroken: 0,
    maxRssMb: 0,
    skipped: 0,
    accepted: 0,
    cancelled: 0,
    streamed: 0,
    bystanders: 0,
    healthChecks: 0,
    seconds: 0,
    notes: [],
  };
  const stopSampling = ticker(clock, 500, () => {
    result.maxRssMb = Math.max(result.maxRssMb, rssOf(pid));
  });
  let pid: number | undefined;
  const report = reporter(result, (why) => note(result, why));
  try {
    result.bystanders = await withLiveServer(0.005, 1000, report, async (run) => {
      pid = run.served.proc.pid;
      await fuzz(run.served, clock, opts, result, run.bystander, run.exited);
    });
    if (result.bystanders === 0) result.bystanderBroken++;
  } finally {
    stopSampling();
    result.seconds = Math.round((clock.now() - t0) / 100) / 10;
  }
  return result;
}

function note(result: WsFuzzResult, line: string): void {
  result.unexpected++;
  keepNote(result.notes, line);
}

/** The lanes, run batch by batch with the checks between batches. */
async function fuzz(
  served: Served,
  clock: Clock,
  opts: WsFuzzOptions,
  result: WsFuzzResult,
  bystander: Bystander,
  exited: () => boolean,
): Promise<void> {
  const root = createRng(opts.seed ?? 1);
  const n = opts.connections ?? 32;
  const lanes: Lane[] = [];
  for (let i = 0; i < n; i++)
    lanes.push(
      await openLane(served, clock, i % 2 === 0 ? 'json' : 'msgpack', root.fork(`lane ${i}`), i, opts, result),
    );
  const stopAt = clock.now() + (opts.maxMs ?? Infinity);
  const began = clock.now();
  const progress = opts.progressMs
    ? ticker(clock, opts.progressMs, () => progressLine(result, (clock.now() - began) / 1000, served.proc.pid))
    : null;
  const batch = opts.batch ?? 2000;
  for (let done = 0; done < opts.cases && !exited() && clock.now() < stopAt;) {
    const size = Math.min(batch, opts.cases - done);
    let left = size;
    await Promise.all(
      lanes.map(async (lane) => {
        while (left > 0 && !exited()) {
          left--;
          await lane.run();
        }
      }),
    );
    done += size;
    if (exited()) break;
    result.healthChecks++;
    if (!(await healthy(served))) {
      result.crashes++;
      note(result, `/healthz failed after ${result.cases} cases`);
    }
    const leaked = await leakedAfterBatch(served, clock, bystander);
    if (leaked > 0) {
      result.leakedRequests = Math.max(result.leakedRequests, leaked);
      note(result, `${leaked} requests still live after ${result.cases} cases`);
    }
  }
  progress?.();
  for (const lane of lanes) lane.close();
}

/** One connection sending one case at a time. */
interface Lane {
  run(): Promise<void>;
  close(): void;
}

async function openLane(
  served: Served,
  clock: Clock,
  format: FrameFormat,
  r: Rng,
  index: number,
  opts: WsFuzzOptions,
  result: WsFuzzResult,
): Promise<Lane> {
  const cancelAbove = opts.cancelAbove ?? 32;
  let peer: WsPeer | null = null;
  let waiting: Waiting | null = null;
  let current: WsCase | null = null;
  let finish: (() => void) | null = null;
  let seq = 0;
  const what = (): string => `${format} ${current?.kind}: ${current?.changes.join(', ')}`;
  const settle = (): void => {
    if (waiting && waiting.frameErrors === 0 && waiting.submits.size === 0) finish?.();
  };
  const onMessage = (m: ServerMessage): void => {
    if (m.type === 'hello') return;
    const w = waiting;
    const bad = (why: string): void => note(result, `${why} <- ${what()}`);
    if (w === null) return bad(`${m.type} while no case was waiting`);
    if (m.type === 'error' && m.id === undefined) {
      if (w.frameErrors === 0) bad(`frame error ${m.code}: ${m.message}`);
      else if (m.code !== 'invalid_request') bad(`frame error with code ${m.code}`);
      w.frameErrors = Math.max(0, w.frameErrors - 1);
      return settle();
    }
    const s = w.submits.get(m.id!);
    if (s === undefined) return bad(`${m.type} for ${m.id}, which no submit of the case is waiting on`);
    if (m.type === 'rejected' || m.type === 'error') {
      const ok = CODES.has(m.code) && m.code !== 'internal' && (m.code !== 'cancelled' || s.cancelled);
      if (!ok) bad(`${m.type} ${m.code}: ${m.message}`);
      if (m.type === 'rejected' && s.live) bad('rejected after accepted');
      if (m.type === 'error' && !s.live) bad(`error ${m.code} before accepted`);
      if (m.code === 'cancelled') result.cancelled++;

      w.submits.delete(m.id!);
    } else if (m.type === 'accepted') {
      if (s.live) bad('accepted twice');
      s.live = true;
      result.accepted++;
      if (s.maxTokens > cancelAbove || r.int(8) === 0) {
        s.cancelled = true;
        peer?.send(encodeFrame({ type: 'cancel', id: m.id }, format));
      }
    } else if (m.type === 'tokens') {
      if (!s.live || m.seq !== s.tokens) bad(`tokens seq ${m.seq} after ${s.tokens} (live ${s.live})`);
      s.tokens = m.seq + m.n;
    } else if (m.type === 'done') {
      if (!s.live || m.usage.completionTokens !== s.tokens)
        bad(`done with ${m.usage.completionTokens} tokens after ${s.tokens} streamed`);
      result.streamed++;
      w.submits.delete(m.id);
    }
    settle();
  };
  const connect = async (): Promise<WsPeer> => {
    const protocol = format === 'json' ? SUBPROTOCOL_JSON : SUBPROTOCOL_MSGPACK;
    const c = await connectWs(served.wsUrl, { clock, protocols: [protocol] });
    if (!c.ok) throw new Error(`ws-fuzz: lane ${index} cannot connect: ${c.error.message}`);
    const p = c.peer;
    p.onMessage((data) => {
      const d = decodeServerFrame(data, format);
      if (!d.ok) return note(result, `server frame not valid: ${d.error.message} <- ${what()}`);
      for (const m of d.messages) onMessage(m);
    });
    p.onClose((code, reason) => {
      if (p !== peer) return;
      peer = null;
      if (waiting !== null) note(result, `connection closed (${code} ${reason}) <- ${what()}`);
      finish?.();
    });
    return p;
  };
  peer = await connect();
  return {
    run: async () => {
      const c = drawWsCase(r, `l${index}.${seq++}`);
      const data = format === 'json' ? c.json : c.msgpack;
      result.cases++;
      if (data === null) {
        result.skipped++;
        return;
      }
      if (peer === null) {
        const p = await connect().catch(() => null);
        if (p === null) return note(result, `lane ${index} could not connect again`);
        peer = p;
      }
      const expected = decodeClientFrame(data, format);
      const w: Waiting = { frameErrors: expected.ok ? 0 : 1, submits: new Map() };
      if (expected.ok)
        for (const m of expected.messages)
          if (m.type === 'submit')
            w.submits.set(m.id, { live: false, tokens: 0, cancelled: false, maxTokens: m.maxTokens });
      waiting = w;
      current = c;
      await new Promise<void>((resolve) => {
        const stall = clock.setTimeout(() => {
          note(result, `stalled (${w.frameErrors} frame errors, ${w.submits.size} submits unanswered) <- ${what()}`);
          finish?.();
        }, STALL_MS);
        finish = () => {
          clock.clearTimeout(stall);
          finish = null;
          resolve();
        };
        if (!peer!.send(data)) finish();
        else settle();
      });
      waiting = null;
    },
    close: () => {
      const p = peer;
      peer = null;
      p?.close();
    },
  };
}

function progressLine(result: WsFuzzResult, seconds: number, pid: number | undefined): void {
  const rate = result.cases / Math.max(0.001, seconds);
  process.stderr.write(
    `ws-fuzz: ${seconds.toFixed(0)} s, ${result.cases} cases, ${rate.toFixed(0)}/s, server cpu ${cpuOf(pid).toFixed(0)} s, ` +
      `accepted ${result.accepted}, unexpected ${result.unexpected}, leaked ${result.leakedRequests}, ` +
      `rss ${result.maxRssMb} MiB\n`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: {
      cases: { type: 'string', default: '1000000' },
      seed: { type: 'string', default: '1' },
      connections: { type: 'string', default: '32' },
      batch: { type: 'string', default: '2000' },
      'max-seconds': { type: 'string', default: '3600' },
    },
    strict: true,
  });
  const ints = [values.cases, values.seed, values.connections, values.batch].map(Number);
  const maxSeconds = Number(values['max-seconds']);
  if (!ints.every((x) => Number.isSafeInteger(x) && x >= 1) || !(maxSeconds > 0)) {
    process.stderr.write(
      'usage: npm run fuzz:ws -- [--cases 1000000] [--seed 1] [--connections 32] [--batch 2000] [--max-seconds 3600]\n',
    );
    process.exit(2);
  }
  const [cases, seed, connections, batch] = ints as [number, number, number, number];
  echo.notes = true;
  runWsFuzz({ cases, seed, connections, batch, maxMs: maxSeconds * 1000, progressMs: 10_000 }).then(
    (r) => {
      const { notes: _notes, ...line } = r;
      process.stdout.write(`${JSON.stringify(line)}\n`);
      const failed =
        r.crashes > 0 || r.unexpected > 0 || r.leakedRequests > 0 || r.bystanderBroken > 0 || r.cases < cases;
      process.exitCode = failed ? 1 : 0;
    },
    (e: unknown) => {
      process.stderr.write(`ws-fuzz: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exitCode = 1;
    },
  );
}
