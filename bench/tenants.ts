// `npm run bench:tenants`: fairness between tenants on the live server. Starts `switchyard serve --tenants` (cost-model
// executor in real time, modest capacity) with two tenants of equal weight, measures capacity with a closed loop, then
// runs tenant B at 20 % of capacity in alternating windows: alone, then beside tenant A flooding at 10x capacity, and
// so on (so that other load on the machine weighs on both alike). Prints B's p99 TTFT alone and beside the flood, B's
// refusals, and how much of A's flood was admitted (the rest refused with retryAfterMs).
// Ends with one JSON line {"quietP99Ratio","quietRejected","floodAdmittedShare", ...}.
import { createHash } from 'node:crypto';
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
import { printFigures, quick } from './lib/data.ts';

const clock = createWallClock();
const now = (): number => performance.now();
const sleep = (ms: number): Promise<void> => new Promise((r) => clock.setTimeout(r, ms));
const r2 = (x: number): number => Math.round(x * 100) / 100;

const MODEL = 'llama-3-8b';
const PROMPT_TOKENS = 64;
const MAX_TOKENS = 32;
const TOKEN_A = 'bench-tenant-a-flood-0123456789';
const TOKEN_B = 'bench-tenant-b-quiet-0123456789';
const CONFIG = `
name: bench-tenants
node: { gpu: H100-SXM, gpus: 8 }
routing: { ejection: { failures: 1000 } }
models:
  - name: ${MODEL}
    profile: ${MODEL}
    tp: 1
    replicas: 2
    batching: { maxRunning: 16 }
    classes:
      interactive: { maxQueueMs: 1000, maxQueued: 256 }
`;
const sha = (t: string): string => createHash('sha256').update(t).digest('hex');
const TENANTS = `tenants:
  - { name: flood, tokenSha256: [${sha(TOKEN_A)}] }
  - { name: quiet, tokenSha256: [${sha(TOKEN_B)}] }
`;
const PHASE_MS = quick ? 8_000 : 30_000;
const QUIET_FRACTION = 0.2;
const FLOOD_FACTOR = 10;

/** One request as its client saw it. */
interface Req {
  sentAt: number;
  firstAt: number;
  end: 'done' | 'rejected' | 'error' | null;
  code: string;
  retryAfterMs: number | undefined;
  /** The control plane's own TTFT (from its submit, after the tenant gate), as the done message reports it. */
  serverTtftMs: number;
  /** When the done message came (the time per output token after the first tells the engine's step cadence). */
  doneAt: number;
}

/** Starts `switchyard serve --tenants` and resolves once the model is ready. */
async function startServe(): Promise<ServeProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-tenants-'));
  writeFileSync(join(dir, 'config.yaml'), CONFIG);
  writeFileSync(join(dir, 'tenants.yaml'), TENANTS);
  return startServeProcess([
    '--config',
    join(dir, 'config.yaml'),
    '--tenants',
    join(dir, 'tenants.yaml'),
    '--executor',
    'cost-model',
    '--time-scale',
    '1',
  ]);
}

/** One tenant's client: a few connections with its token; submits of one tick leave as one frame each. */
async function openTenant(
  url: string,
  token: string,
  n: number,
  onEnd?: (id: string, r: Req) => void,
): Promise<{ reqs: Map<string, Req>; submit(id: string): void; close(): void }> {
  const reqs = new Map<string, Req>();
  const conns: { peer: WsPeer; pending: unknown[] }[] = [];
  const onMsg = (m: ServerMessage): void => {
    if (m.type === 'hello' || m.type === 'accepted' || m.id === undefined) return;
    const r = reqs.get(m.id);
    if (!r || r.end !== null) return;
    if (m.type === 'tokens') {
      if (r.firstAt < 0) r.firstAt = now();
      return;
    }
    r.end = m.type;
    if (m.type === 'done') {
      r.serverTtftMs = m.timings.ttftMs;
      r.doneAt = now();
    } else {
      r.code = m.code;
      r.retryAfterMs = m.retryAfterMs;
    }
    onEnd?.(m.id, r);
  };
  for (let i = 0; i < n; i++) {
    const c = await connectWs(url, { clock, token, protocols: [SUBPROTOCOL_MSGPACK], maxPayload: 64 * 1024 * 1024 });
    if (!c.ok) throw new Error(`cannot connect to ${url}: ${c.error.message}`);
    const conn = { peer: c.peer, pending: [] as unknown[] };
    c.peer.onMessage((data) => {
      const f = decodeServerFrame(data, 'msgpack');
      if (f.ok) for (const m of f.messages) onMsg(m);
    });
    conns.push(conn);
  }
  let next = 0;
  return {
    reqs,
    submit: (id) => {
      reqs.set(id, {
        sentAt: now(),
        firstAt: -1,
        end: null,
        code: '',
        retryAfterMs: undefined,
        serverTtftMs: -1,
        doneAt: -1,
      });
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
    close: () => conns.forEach((c) => c.peer.close(1000)),
  };
}

/** Closed loop of `concurrency` requests as tenant A: completed requests per second once warm. */
async function calibrate(wsUrl: string, concurrency: number, ms: number): Promise<number> {
  let done = 0;
  let seq = 0;
  let running = true;
  const t = await openTenant(wsUrl, TOKEN_A, 4, (_id, r) => {
    if (r.end === 'done') done++;
    const delay = r.end === 'done' ? 0 : Math.max(20, r.retryAfterMs ?? 100);
    if (running) clock.setTimeout(() => running && t.submit(`cal${++seq}`), delay);
  });
  for (let i = 0; i < concurrency; i++) t.submit(`cal${++seq}`);
  await sleep(ms / 3);
  const d0 = done;
  const t0 = now();
  await sleep((2 * ms) / 3);
  const rate = (done - d0) / ((now() - t0) / 1000);
  running = false;
  await sleep(1_000);
  t.close();
  return rate;
}

/** Open-loop Poisson arrivals at each rate for `ms`; then waits for the tail to end. */
async function drive(
  senders: { rate: number; submit(id: string): void; prefix: string }[],
  ms: number,
  window: number,
): Promise<void> {
  const rng = createRng(15).fork(`tenants-${window}`);
  const next = senders.map(() => 0);
  const counts = senders.map(() => 0);
  const t0 = now();
  for (;;) {
    const t = now() - t0;
    if (t >= ms) break;
    senders.forEach((s, i) => {
      while (next[i]! <= t) {
        next[i]! += rng.exponential(1000 / s.rate);
        s.submit(`${s.prefix}${counts[i]!++}`);
      }
    });
    await sleep(1);
  }
}

async function settle(reqs: Iterable<Map<string, Req>>): Promise<void> {
  const all = [...reqs].flatMap((m) => [...m.values()]);
  const until = now() + 20_000;
  while (all.some((r) => r.end === null) && now() < until) await sleep(50);
}

const ttfts = (m: Map<string, Req>): number[] =>
  [...m.values()].filter((r) => r.end === 'done' && r.firstAt >= 0).map((r) => r.firstAt - r.sentAt);
const serverTtfts = (m: Map<string, Req>): number[] =>
  [...m.values()].filter((r) => r.end === 'done' && r.serverTtftMs >= 0).map((r) => r.serverTtftMs);
/** Median time per output token after the first: the engine's step cadence as this tenant saw it. */
const tpot = (m: Map<string, Req>): number =>
  percentile(
    [...m.values()]
      .filter((r) => r.end === 'done' && r.firstAt >= 0)
      .map((r) => (r.doneAt - r.firstAt) / (MAX_TOKENS - 1)),
    50,
  );
/** p50 and p99 of the client's TTFT and of the control plane's own (the rest is the edge, the gate and the wire). */
const ttftLine = (m: Map<string, Req>): string =>
  `TTFT p50 ${percentile(ttfts(m), 50).toFixed(1)} ms, p99 ${percentile(ttfts(m), 99).toFixed(1)} ms ` +
  `(control plane's own: p50 ${percentile(serverTtfts(m), 50).toFixed(1)}, p99 ${percentile(serverTtfts(m), 99).toFixed(1)}); ` +
  `time per output token p50 ${tpot(m).toFixed(1)} ms`;

/** One measurement window: B alone, or B beside A's flood; B's requests of each kind end up in one map. */
const WINDOW_MS = quick ? 2_000 : 5_000;
/** Quiet time after each window, so that what one window left running does not reach into the next. */
const GAP_MS = 2_000;

async function run(wsUrl: string): Promise<void> {
  const capacity = await calibrate(wsUrl, 4 * 2 * 16, quick ? 4_000 : 8_000);
  const quietRate = QUIET_FRACTION * capacity;
  const floodRate = FLOOD_FACTOR * capacity;
  process.stderr.write(
    `bench:tenants: capacity ${capacity.toFixed(1)} req/s; quiet ${quietRate.toFixed(1)}, flood ${floodRate.toFixed(1)} req/s\n`,
  );
  await sleep(1_000);
  // B alone and B beside A's flood, in alternating windows of equal length: whatever else loads this machine
  // weighs on both the same way (measured back to back, a busy minute would land on one of them only).
  const alone = new Map<string, Req>();
  const quiet = new Map<string, Req>();
  const b = await openTenant(wsUrl, TOKEN_B, 2);
  const flood = await openTenant(wsUrl, TOKEN_A, 8);
  const windows = Math.max(1, Math.round(PHASE_MS / WINDOW_MS));
  for (let i = 0; i < 2 * windows; i++) {
    const flooding = i % 2 === 1;
    const prefix = `${flooding ? 'quiet' : 'alone'}${i}-`;
    const senders = [{ rate: quietRate, submit: b.submit, prefix }];
    if (flooding) senders.push({ rate: floodRate, submit: flood.submit, prefix: `flood${i}-` });
    await drive(senders, WINDOW_MS, i);
    await sleep(GAP_MS);
  }
  await settle([b.reqs, flood.reqs]);
  for (const [id, r] of b.reqs) (id.startsWith('quiet') ? quiet : alone).set(id, r);
  b.close();
  flood.close();
  report(capacity, alone, quiet, flood.reqs, windows);
}

function report(
  capacity: number,
  alone: Map<string, Req>,
  quiet: Map<string, Req>,
  flood: Map<string, Req>,
  windows: number,
): void {
  const aloneP99 = percentile(ttfts(alone), 99);
  const quietP99 = percentile(ttfts(quiet), 99);
  const refused = (m: Map<string, Req>): Req[] => [...m.values()].filter((r) => r.end === 'rejected');
  const floodAll = [...flood.values()];
  const floodRefused = refused(flood);
  const floodAdmitted = floodAll.length - floodRefused.length;
  const floodDone = floodAll.filter((r) => r.end === 'done').length;
  const noHint = floodRefused.filter((r) => !(r.code === 'overloaded' && (r.retryAfterMs ?? 0) >= 1)).length;
  const quietBad = [...quiet.values()].filter((r) => r.end !== 'done');
  const out = [
    `tenants: switchyard serve --tenants, ${MODEL} x2 replicas (cost-model executor, real time), prompt ${PROMPT_TOKENS} / output ${MAX_TOKENS} tokens`,
    `capacity (closed loop) ${capacity.toFixed(1)} req/s; quiet tenant at ${(QUIET_FRACTION * 100).toFixed(0)} %, flooding tenant at ${FLOOD_FACTOR}x`,
    `${windows} windows of ${WINDOW_MS / 1000} s of each (quiet alone, quiet beside the flood), alternating, ${GAP_MS / 1000} s apart`,
    '',
    `quiet alone:        ${alone.size} sent, ${ttftLine(alone)}`,
    `quiet beside flood: ${quiet.size} sent, ${ttftLine(quiet)}, not done ${quietBad.length}${quietBad[0] ? ` (first: ${quietBad[0].end} ${quietBad[0].code})` : ''}`,
    `flood: ${floodAll.length} sent, ${floodAdmitted} admitted (${floodDone} done), ${floodRefused.length} refused, ${noHint} of them without overloaded + retryAfterMs`,
    '',
  ];
  process.stdout.write(`${out.join('\n')}\n`);
  printFigures({
    quietP99Ratio: r2(quietP99 / Math.max(1e-9, aloneP99)),
    quietRejected: refused(quiet).length,
    floodAdmittedShare: r2(floodAdmitted / Math.max(1, floodAll.length)),
    quietAloneP99Ms: r2(aloneP99),
    quietFloodP99Ms: r2(quietP99),
    quietAloneServerP99Ms: r2(percentile(serverTtfts(alone), 99)),
    quietFloodServerP99Ms: r2(percentile(serverTtfts(quiet), 99)),
    quietAloneTpotMs: r2(tpot(alone)),
    quietFloodTpotMs: r2(tpot(quiet)),
    quietNotDone: quietBad.length,
    floodRefusedWithoutRetryAfter: noHint,
    floodServedRps: r2(floodDone / ((windows * WINDOW_MS) / 1000)),
    capacityRps: r2(capacity),
  });
}

async function main(): Promise<void> {
  process.stderr.write(`bench:tenants: starting switchyard serve --tenants${quick ? ' [quick]' : ''}...\n`);
  const srv = await startServe();
  try {
    await run(srv.wsUrl);
  } finally {
    await srv.stop();
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`bench:tenants: ${e instanceof Error ? e.stack : String(e)}\n`);
  process.exitCode = 1;
});
