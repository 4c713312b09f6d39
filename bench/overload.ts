// `npm run bench:overload`: load and overload on the live server. Starts `switchyard serve` (cost-model executor in
// real time, modest capacity) in its own process, measures its capacity with a closed loop, then drives it open loop
// over /v1/ws (a tenth of the arrivals over HTTP /v1/completions): steady load, then 3x capacity, then steady again. Checks that
// the excess is answered `overloaded` with a retry hint at once, that every request gets exactly one terminal frame,
// and how long TTFT takes to come back. Prints a table and ends with one JSON line.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createWallClock } from '../runtime/clock.ts';
import { createRng } from '../runtime/rng.ts';
import {
  SUBPROTOCOL_MSGPACK,
  decodeServerFrame,
  encodeFrame,
  type ServerMessage,
} from '../transport/client-protocol.ts';
import { connectWs, type WsPeer } from '../transport/ws.ts';
import { percentile } from './live-loadgen.ts';
import { startServeProcess, type ServeProcess } from './lib/serve-process.ts';
import { printFigures, quick, writeChartData } from './lib/data.ts';

const clock = createWallClock();
const now = (): number => performance.now();
const sleep = (ms: number): Promise<void> => new Promise((r) => clock.setTimeout(r, ms));
const r2 = (x: number): number => Math.round(x * 100) / 100;

const MODEL = 'llama-3-8b';
const PROMPT_TOKENS = 64;
const MAX_TOKENS = 32;
// Two single-GPU replicas of 16 running sequences each; waiting is bounded at 400 ms and 64 queued per class, so
// capacity is modest and the excess must be shed rather than queued.
const CONFIG = `
name: bench-overload
node: { gpu: H100-SXM, gpus: 8 }
routing: { ejection: { failures: 1000 } }
models:
  - name: ${MODEL}
    profile: ${MODEL}
    tp: 1
    replicas: 2
    batching: { maxRunning: 16 }
    classes:
      interactive: { maxQueueMs: 400, maxQueued: 64 }
`;

/** Phase lengths (ms). */
const PHASES = quick
  ? { calibrate: 3_000, steady: 8_000, overload: 4_000, recovery: 8_000 }
  : { calibrate: 8_000, steady: 60_000, overload: 30_000, recovery: 30_000 };
/** Steady load as a fraction of measured capacity; overload is three times capacity. */
const STEADY_FRACTION = 0.5;
const OVERLOAD_FACTOR = 3;
/** Share of each phase's arrivals sent over HTTP (/v1/completions) instead of /v1/ws. */
const HTTP_SHARE = 0.1;
/** Rolling window for recovery (ms), stepped every 250 ms. */
const WINDOW_MS = 2_000;

type Phase = 'steady' | 'overload' | 'recovery';

/** One request as the client saw it. */
interface Req {
  phase: Phase;
  sentAt: number;
  firstAt: number;
  endAt: number;
  end: 'done' | 'rejected' | 'error' | null;
  code: string;
  retryAfterMs: number | undefined;
  terminals: number;
  nextSeq: number;
  gaps: number;
  late: number;
}

/** One HTTP sample. */
interface HttpReq {
  phase: Phase;
  sentAt: number;
  endAt: number;
  status: number;
  retryAfter: string | null;
}

/** Starts `switchyard serve` and resolves with its URLs once the model is ready. */
async function startServe(): Promise<ServeProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-overload-'));
  const config = join(dir, 'overload.yaml');
  writeFileSync(config, CONFIG);
  return startServeProcess(['--config', config, '--executor', 'cost-model', '--time-scale', '1']);
}

/** A pool of WebSocket connections; submits of one tick leave as one frame per connection. */
async function openPool(
  url: string,
  n: number,
  onMsg: (m: ServerMessage) => void,
  onLost: (why: string) => void,
): Promise<{ submit(id: string): void; close(): void }> {
  const conns: { peer: WsPeer; pending: unknown[] }[] = [];
  for (let i = 0; i < n; i++) {
    const r = await connectWs(url, { clock, protocols: [SUBPROTOCOL_MSGPACK], maxPayload: 64 * 1024 * 1024 });
    if (!r.ok) throw new Error(`cannot connect to ${url}: ${r.error.message}`);
    const c = { peer: r.peer, pending: [] as unknown[] };
    r.peer.onClose((code, reason) => {
      if (code !== 1000 && code !== 1005) onLost(`connection closed by the server (${code} ${reason})`);
    });
    r.peer.onMessage((data) => {
      const f = decodeServerFrame(data, 'msgpack');
      if (!f.ok) return onLost(`bad frame: ${f.error.message}`);
      for (const m of f.messages) onMsg(m);
    });
    conns.push(c);
  }
  let next = 0;
  return {
    submit: (id) => {
      const c = conns[next++ % conns.length]!;
      if (c.pending.length === 0) {
        queueMicrotask(() => {
          const p = c.pending;
          c.pending = [];
          c.peer.send(encodeFrame(p, 'msgpack'));
        });
      }
      c.pending.push({
        type: 'submit',
        id,
        model: MODEL,
        promptTokens: PROMPT_TOKENS,
        maxTokens: MAX_TOKENS,
        text: false,
      });
    },
    close: () => {
      for (const c of conns) c.peer.close(1000);
    },
  };
}

/** Closed loop at `concurrency`: completed requests per second once warm, i.e. the server's capacity. */
async function calibrate(wsUrl: string, concurrency: number, ms: number): Promise<number> {
  let done = 0;
  let seq = 0;
  let running = true;
  const outcomes = new Map<string, number>();
  const pool = await openPool(
    wsUrl,
    4,
    (m) => {
      if (m.type === 'done') done++;
      else if (m.type === 'rejected' || m.type === 'error') outcomes.set(m.code, (outcomes.get(m.code) ?? 0) + 1);
      if (m.type === 'done' || m.type === 'rejected' || (m.type === 'error' && m.id !== undefined)) {
        // A finished slot starts the next request at once; a refused one retries after the server's hint, as a
        // well-behaved client does (retrying at once turns the calibration into a rejection storm that eats the CPU).
        const delay = m.type === 'done' ? 0 : Math.max(20, m.type === 'rejected' ? (m.retryAfterMs ?? 100) : 100);
        if (running) clock.setTimeout(() => running && pool.submit(`cal${++seq}`), delay);
      }
    },
    () => {},
  );
  for (let i = 0; i < concurrency; i++) pool.submit(`cal${++seq}`);
  await sleep(ms / 3);
  const d0 = done;
  const t0 = now();
  await sleep((2 * ms) / 3);
  const rate = (done - d0) / ((now() - t0) / 1000);
  running = false;
  await sleep(1_000);
  pool.close();
  process.stderr.write(`bench:overload: calibration ${done} done, ${JSON.stringify(Object.fromEntries(outcomes))}\n`);
  return rate;
}

async function main(): Promise<void> {
  process.stderr.write(
    `bench:overload: starting switchyard serve (cost-model executor, real time)${quick ? ' [quick]' : ''}...\n`,
  );
  const srv = await startServe();
  try {
    await run(srv.url, srv.wsUrl);
  } finally {
    await srv.stop();
  }
}

async function run(url: string, wsUrl: string): Promise<void> {
  // One request per running slot (two replicas of 16): every slot stays full and nothing waits or is refused. With four
  // per slot (as before), the excess was refused at hundreds per second and queued requests expired, and on a busy
  // machine the closed loop then measured half the capacity (32 against 64-80 req/s in one window), so "3x capacity"
  // was not an overload at all and nothing was shed.
  const capacity = await calibrate(wsUrl, 2 * 16, PHASES.calibrate);
  const steadyRate = STEADY_FRACTION * capacity;
  const overloadRate = OVERLOAD_FACTOR * capacity;
  process.stderr.write(
    `bench:overload: capacity ${capacity.toFixed(1)} req/s; steady ${steadyRate.toFixed(1)}, overload ${overloadRate.toFixed(1)} req/s\n`,
  );
  await sleep(1_000);

  const reqs = new Map<string, Req>();
  const http: HttpReq[] = [];
  let unknown = 0;
  const connectionLosses: string[] = [];
  const pool = await openPool(
    wsUrl,
    8,
    (m) => {
      if (m.type === 'hello' || (m.type === 'error' && m.id === undefined)) return;
      const r = reqs.get(m.id!);
      if (!r) {
        unknown++;
        return;
      }
      const t = now();
      if (m.type === 'accepted') return;
      if (m.type === 'tokens') {
        if (r.end !== null) r.late++;
        if (m.seq !== r.nextSeq) r.gaps++;
        r.nextSeq = m.seq + m.n;
        if (r.firstAt < 0) r.firstAt = t;
        return;
      }
      r.terminals++;
      if (r.end !== null) return;
      r.end = m.type;
      r.endAt = t;
      if (m.type !== 'done') {
        r.code = m.code;
        r.retryAfterMs = m.retryAfterMs;
      }
    },
    (why) => connectionLosses.push(why),
  );

  const rng = createRng(8).fork('overload');
  const t0 = now();
  const ends = {
    steady: PHASES.steady,
    overload: PHASES.steady + PHASES.overload,
    recovery: PHASES.steady + PHASES.overload + PHASES.recovery,
  };
  const phaseAt = (t: number): Phase => (t < ends.steady ? 'steady' : t < ends.overload ? 'overload' : 'recovery');
  const rateOf = (p: Phase): number => (p === 'overload' ? overloadRate : steadyRate);
  let n = 0;
  let nextAt = 0;
  const inflightHttp: Promise<void>[] = [];
  const sendHttp = (phase: Phase): void => {
    const h: HttpReq = { phase, sentAt: now(), endAt: -1, status: 0, retryAfter: null };
    http.push(h);
    inflightHttp.push(
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'x'.repeat(PROMPT_TOKENS * 4), max_tokens: MAX_TOKENS }),
      })
        .then(async (res) => {
          h.status = res.status;
          h.retryAfter = res.headers.get('retry-after');
          h.endAt = now();
          await res.arrayBuffer();
        })
        .catch(() => {}),
    );
  };
  let lastReport = 0;
  for (;;) {
    const t = now() - t0;
    if (t >= ends.recovery) break;
    while (nextAt <= t) {
      const phase = phaseAt(nextAt);
      nextAt += rng.exponential(1000 / rateOf(phase));
      if (rng.next() < HTTP_SHARE) {
        sendHttp(phase);
        continue;
      }
      const id = `o${n++}`;
      reqs.set(id, {
        phase,
        sentAt: now(),
        firstAt: -1,
        endAt: -1,
        end: null,
        code: '',
        retryAfterMs: undefined,
        terminals: 0,
        nextSeq: 0,
        gaps: 0,
        late: 0,
      });
      pool.submit(id);
    }
    if (t - lastReport > 5_000) {
      lastReport = t;
      process.stderr.write(`bench:overload: ${(t / 1000).toFixed(0)} s, ${phaseAt(t)}, ${n} sent\n`);
    }
    await sleep(1);
  }
  // Let the tail finish: every request must end (done, rejected or error) on its own.
  const drainUntil = now() + 20_000;
  while ([...reqs.values()].some((r) => r.end === null) && now() < drainUntil) await sleep(50);
  await Promise.race([Promise.all(inflightHttp), sleep(Math.max(0, drainUntil - now()))]);
  pool.close();

  const all = [...reqs.values()];
  const lost = all.filter((r) => r.terminals === 0).length + http.filter((h) => h.status === 0).length;
  const duplicated = all.filter((r) => r.terminals > 1 || r.late > 0).length;
  const gaps = all.reduce((s, r) => s + r.gaps, 0);
  const shed = all.filter((r) => r.end === 'rejected' && r.code === 'overloaded');
  const shedMs = shed.map((r) => r.endAt - r.sentAt);
  const noHint = shed.filter((r) => !(r.retryAfterMs !== undefined && r.retryAfterMs > 0)).length;
  const otherFailures = all.filter(
    (r) => r.end !== null && r.end !== 'done' && !(r.end === 'rejected' && r.code === 'overloaded'),
  );
  const ttftOf = (rs: Req[]): number[] =>
    rs.filter((r) => r.end === 'done' && r.firstAt >= 0).map((r) => r.firstAt - r.sentAt);
  const rel = (r: { sentAt: number }): number => r.sentAt - t0;
  // Steady state: the steady phase after its first fifth (warm-up).
  const steadyReqs = all.filter((r) => r.phase === 'steady' && rel(r) >= ends.steady / 5);
  const steadyP99 = percentile(ttftOf(steadyReqs), 99);
  const threshold = 1.2 * steadyP99;
  // Rolling p99 TTFT by send time, from the start of the overload to the end.
  const timeline: { t: number; ttftP99Ms: number; sentPerS: number; shedPerS: number }[] = [];
  let recoveryAt = -1;
  for (let w = 0; w + WINDOW_MS <= ends.recovery; w += 250) {
    const inW = all.filter((r) => rel(r) >= w && rel(r) < w + WINDOW_MS);
    const p99 = percentile(ttftOf(inW), 99);
    timeline.push({
      t: r2(w / 1000),
      ttftP99Ms: r2(p99),
      sentPerS: r2(inW.length / (WINDOW_MS / 1000)),
      shedPerS: r2(inW.filter((r) => r.end === 'rejected').length / (WINDOW_MS / 1000)),
    });
    if (recoveryAt < 0 && w >= ends.overload && p99 > 0 && p99 <= threshold) recoveryAt = w;
  }
  const recoveryS = recoveryAt < 0 ? -1 : r2((recoveryAt - ends.overload) / 1000);
  const recoveryWindows = timeline.filter((x) => x.t * 1000 >= recoveryAt && recoveryAt >= 0);
  const stayed =
    recoveryWindows.length === 0
      ? 0
      : recoveryWindows.filter((x) => x.ttftP99Ms <= threshold).length / recoveryWindows.length;
  const httpShed = http.filter((h) => h.status === 429);
  const httpShedMs = httpShed.map((h) => h.endAt - h.sentAt);
  const httpNoRetryAfter = httpShed.filter((h) => !(Number(h.retryAfter) >= 1)).length;
  const byPhase = (p: Phase): Req[] => all.filter((r) => r.phase === p);
  const count = (rs: Req[], e: Req['end']): number => rs.filter((r) => r.end === e).length;
  // What the server really served while overloaded (WebSocket and HTTP): the closed-loop capacity is noisy on a shared machine.
  const servedRps =
    (count(byPhase('overload'), 'done') + http.filter((h) => h.phase === 'overload' && h.status === 200).length) /
    (PHASES.overload / 1000);
  const phaseRow = (p: Phase, secs: number): string => {
    const rs = byPhase(p);
    const t = ttftOf(rs);
    return `${p.padEnd(10)} ${String(rs.length).padStart(7)} ${(rs.length / secs).toFixed(1).padStart(8)} ${String(count(rs, 'done')).padStart(7)} ${String(count(rs, 'rejected')).padStart(8)} ${String(count(rs, 'error')).padStart(6)} ${percentile(t, 50).toFixed(1).padStart(9)} ${percentile(t, 99).toFixed(1).padStart(9)}`;
  };

  const out: string[] = [];
  out.push(
    `live overload: switchyard serve, ${MODEL} x2 replicas (cost-model executor, real time), prompt ${PROMPT_TOKENS} / output ${MAX_TOKENS} tokens`,
  );
  out.push(
    `capacity (closed loop) ${capacity.toFixed(1)} req/s; steady ${steadyRate.toFixed(1)} req/s for ${PHASES.steady / 1000} s, overload ${overloadRate.toFixed(1)} req/s for ${PHASES.overload / 1000} s, steady again for ${PHASES.recovery / 1000} s`,
  );
  out.push('');
  out.push(
    `${'phase'.padEnd(10)} ${'sent'.padStart(7)} ${'req/s'.padStart(8)} ${'done'.padStart(7)} ${'rejected'.padStart(8)} ${'error'.padStart(6)} ${'TTFT p50'.padStart(9)} ${'TTFT p99'.padStart(9)}`,
  );
  out.push(phaseRow('steady', PHASES.steady / 1000));
  out.push(phaseRow('overload', PHASES.overload / 1000));
  out.push(phaseRow('recovery', PHASES.recovery / 1000));
  out.push('');
  out.push(
    `served while overloaded: ${servedRps.toFixed(1)} req/s, so the offered load was ${(overloadRate / Math.max(1e-9, servedRps)).toFixed(2)}x what the server really served`,
  );
  out.push(
    `shed (overloaded) over /v1/ws: ${shed.length}, answered in p50 ${percentile(shedMs, 50).toFixed(2)} ms, p99 ${percentile(shedMs, 99).toFixed(2)} ms, max ${percentile(shedMs, 100).toFixed(2)} ms (target p99 <= 10 ms); without retryAfterMs: ${noHint}`,
  );
  out.push(
    `shed over HTTP: ${httpShed.length} x 429, p99 ${percentile(httpShedMs, 99).toFixed(2)} ms, without a Retry-After >= 1: ${httpNoRetryAfter}; HTTP samples ${http.length}`,
  );
  out.push(
    `lost (no terminal frame): ${lost}; duplicated (second terminal or tokens after it): ${duplicated}; sequence gaps: ${gaps}; frames for unknown ids: ${unknown}; other failures: ${otherFailures.length}${otherFailures[0] ? ` (first: ${otherFailures[0].code})` : ''}`,
  );
  out.push(
    `steady p99 TTFT ${steadyP99.toFixed(1)} ms; recovery: rolling ${WINDOW_MS / 1000} s p99 back within 1.2x (${threshold.toFixed(1)} ms) ${recoveryS < 0 ? 'NEVER' : `${recoveryS} s`} after the overload ended (target <= 5 s); ${(stayed * 100).toFixed(0)} % of later windows within`,
  );
  if (shed.length === 0) out.push('NOTHING WAS SHED: the overload phase did not overload the server (no shed figure)');
  if (connectionLosses.length > 0)
    out.push(`connections lost: ${connectionLosses.length} (first: ${connectionLosses[0]})`);
  out.push('');
  process.stdout.write(`${out.join('\n')}\n`);
  writeChartData({
    timeline,
    overloadStartS: ends.steady / 1000,
    overloadEndS: ends.overload / 1000,
    steadyTtftP99Ms: r2(steadyP99),
  });
  const shedP99Ms = r2(percentile(shedMs, 99));
  printFigures({
    shedP99Ms,
    lost,
    duplicated,
    recoveryS,
    capacityRps: r2(capacity),
    steadyRps: r2(steadyRate),
    overloadRps: r2(overloadRate),
    steadyTtftP99Ms: r2(steadyP99),
    overloadTtftP99Ms: r2(percentile(ttftOf(byPhase('overload')), 99)),
    servedRpsOverload: r2(servedRps),
    effectiveOverloadFactor: r2(overloadRate / Math.max(1e-9, servedRps)),
    expiredInOverload: byPhase('overload').filter((r) => r.code === 'expired').length,
    shed: shed.length,
    shedWithoutRetryAfter: noHint,
    httpShed: httpShed.length,
    httpShedP99Ms: r2(percentile(httpShedMs, 99)),
    httpWithoutRetryAfter: httpNoRetryAfter,
    seqGaps: gaps,
    otherFailures: otherFailures.length,
    requests: all.length + http.length,
    // Nothing shed is no evidence: the overload phase did not overload.
    meetsShed: shed.length > 0 && shedP99Ms <= 10,
    meetsRecovery: recoveryS >= 0 && recoveryS <= 5,
    quick,
  });
}

main().then(
  () => process.exit(0),
  (e: unknown) => {
    process.stderr.write(`bench:overload failed: ${e instanceof Error ? e.stack : String(e)}\n`);
    process.exit(1);
  },
);
