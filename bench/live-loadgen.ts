// The load generator of `npm run bench:live`, run as its own process: a lean client of /v1/ws (no per-token promises)
// that measures streamed tokens/s (closed loop), TTFT and TBT at a fixed request rate (open loop), or holds many
// streams open. Prints one JSON line with its figures.
import { createWallClock } from '../runtime/clock.ts';
import {
  SUBPROTOCOL_MSGPACK,
  decodeServerFrame,
  encodeFrame,
  type ServerMessage,
} from '../transport/client-protocol.ts';
import { connectWs, type WsPeer } from '../transport/ws.ts';

/** What the load generator is asked to do. */
export type LoadSpec =
  | {
      mode: 'throughput';
      url: string;
      model: string;
      conns: number;
      perConn: number;
      maxTokens: number;
      warmupMs: number;
      windowMs: number;
    }
  | {
      mode: 'latency';
      url: string;
      model: string;
      conns: number;
      rate: number;
      durationMs: number;
      maxTokens: number;
      /** Also answer every TTFT and TBT sample (µs-rounded ms), so that rounds can be pooled. */
      samples?: boolean;
    }
  | { mode: 'hold'; url: string; model: string; conns: number; streams: number; maxTokens: number };

interface Req {
  sentAt: number;
  firstAt: number;
  lastAt: number;
  tokens: number;
}

const clock = createWallClock();
/** Frames and bytes every connection of this process received (how finely the server split its output). */
const received = { frames: 0, bytes: 0 };
const now = (): number => performance.now();
const sleep = (ms: number): Promise<void> => new Promise((r) => clock.setTimeout(r, ms));

/** The p-th percentile (0..100) of values. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return 0;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

interface Conn {
  peer: WsPeer;
  pending: unknown[];
  submit(id: string, model: string, maxTokens: number): void;
}

async function openConns(url: string, n: number, onMsg: (m: ServerMessage) => void): Promise<Conn[]> {
  const conns: Conn[] = [];
  for (let i = 0; i < n; i++) {
    const r = await connectWs(url, { clock, protocols: [SUBPROTOCOL_MSGPACK], maxPayload: 64 * 1024 * 1024 });
    if (!r.ok) throw new Error(`loadgen: cannot connect to ${url}: ${r.error.message}`);
    const peer = r.peer;
    peer.onClose((code, reason) => {
      if (code !== 1000 && code !== 1005)
        process.stderr.write(`loadgen: connection closed by the server (${code} ${reason})\n`);
    });
    peer.onMessage((data) => {
      received.frames++;
      received.bytes += data.length;
      const f = decodeServerFrame(data, 'msgpack');
      if (!f.ok) throw new Error(`loadgen: bad frame: ${f.error.message}`);
      for (const m of f.messages) onMsg(m);
    });
    const c: Conn = {
      peer,
      pending: [],
      submit: (id, model, maxTokens) => {
        if (c.pending.length === 0) {
          queueMicrotask(() => {
            const p = c.pending;
            c.pending = [];
            for (let k = 0; k < p.length; k += 256) peer.send(encodeFrame(p.slice(k, k + 256), 'msgpack'));
          });
        }
        c.pending.push({ type: 'submit', id, model, promptTokens: 8, maxTokens, text: false });
      },
    };
    conns.push(c);
  }
  return conns;
}

async function throughput(s: Extract<LoadSpec, { mode: 'throughput' }>): Promise<Record<string, number | string>> {
  let tokens = 0;
  let done = 0;
  let failed = 0;
  let firstFailure = '';
  let seq = 0;
  let conns: Conn[] = [];
  const owner = new Map<string, Conn>();
  const start = (c: Conn): void => {
    const id = `t${++seq}`;
    owner.set(id, c);
    c.submit(id, s.model, s.maxTokens);
  };
  conns = await openConns(s.url, s.conns, (m) => {
    if (m.type === 'tokens') tokens += m.n;
    else if (m.type === 'done' || m.type === 'error' || m.type === 'rejected') {
      if (m.type === 'done') done++;
      else {
        failed++;
        firstFailure ||= `${m.code}: ${m.message}`;
      }
      const c = owner.get(m.id!);
      owner.delete(m.id!);
      if (c && running) start(c);
    }
  });
  let running = true;
  for (const c of conns) for (let k = 0; k < s.perConn; k++) start(c);
  await sleep(s.warmupMs);
  const t0 = now();
  const tok0 = tokens;
  const done0 = done;
  await sleep(s.windowMs);
  const secs = (now() - t0) / 1000;
  const result = {
    tokensPerS: Math.round((tokens - tok0) / secs),
    requestsPerS: Math.round((done - done0) / secs),
    failed,
    firstFailure,
  };
  running = false;
  for (const c of conns) c.peer.close(1000);
  return result;
}

async function latency(s: Extract<LoadSpec, { mode: 'latency' }>): Promise<Record<string, number | string | number[]>> {
  const reqs = new Map<string, Req>();
  const ttft: number[] = [];
  const tbt: number[] = [];
  // TTFT as the server saw it (receipt to first token, from the done message): the rest is the wire and the client.
  const serverTtft: number[] = [];
  let rejected = 0;
  let errors = 0;
  let finished = 0;
  let firstFailure = '';
  const conns = await openConns(s.url, s.conns, (m) => {
    const t = now();
    if (m.type === 'tokens') {
      const r = reqs.get(m.id);
      if (!r) return;
      if (r.firstAt < 0) {
        r.firstAt = t;
        ttft.push(t - r.sentAt);
      } else tbt.push(t - r.lastAt);
      r.lastAt = t;
      r.tokens += m.n;
    } else if (m.type === 'done') {
      finished++;
      serverTtft.push(m.timings.ttftMs);
    } else if (m.type === 'rejected' || (m.type === 'error' && m.id)) {
      if (m.type === 'rejected') rejected++;
      else errors++;
      firstFailure ||= `${m.code}: ${m.message}`;
    }
  });
  const t0 = now();
  let sent = 0;
  while (now() - t0 < s.durationMs) {
    const due = Math.floor(((now() - t0) / 1000) * s.rate);
    for (; sent < due; sent++) {
      const id = `l${sent}`;
      reqs.set(id, { sentAt: now(), firstAt: -1, lastAt: -1, tokens: 0 });
      conns[sent % conns.length]!.submit(id, s.model, s.maxTokens);
    }
    await sleep(1);
  }
  // Let the tail finish.
  const until = now() + 10_000;
  while (finished + rejected + errors < sent && now() < until) await sleep(20);
  for (const c of conns) c.peer.close(1000);
  const r2 = (x: number): number => Math.round(x * 1000) / 1000;
  return {
    sent,
    finished,
    rejected,
    errors,
    achievedRate: Math.round(sent / (s.durationMs / 1000)),
    ttftP50Ms: r2(percentile(ttft, 50)),
    ttftP99Ms: r2(percentile(ttft, 99)),
    tbtP50Ms: r2(percentile(tbt, 50)),
    tbtP99Ms: r2(percentile(tbt, 99)),
    serverTtftP50Ms: r2(percentile(serverTtft, 50)),
    serverTtftP99Ms: r2(percentile(serverTtft, 99)),
    framesIn: received.frames,
    bytesIn: received.bytes,
    firstFailure,
    ...(s.samples ? { ttftMs: ttft.map(r2), tbtMs: tbt.map(r2) } : {}),
  };
}

async function hold(s: Extract<LoadSpec, { mode: 'hold' }>): Promise<void> {
  const streaming = new Set<string>();
  const ended = new Set<string>();
  const conns = await openConns(s.url, s.conns, (m) => {
    if (m.type === 'tokens') streaming.add(m.id);
    else if ((m.type === 'done' || m.type === 'error' || m.type === 'rejected') && m.id) ended.add(m.id);
  });
  const t0 = now();
  for (let i = 0; i < s.streams; i++) {
    conns[i % conns.length]!.submit(`h${i}`, s.model, s.maxTokens);
    if (i % 500 === 499) await sleep(5);
  }
  const until = now() + 60_000;
  while (streaming.size + ended.size < s.streams && now() < until) await sleep(20);
  const open = (): number => [...streaming].filter((id) => !ended.has(id)).length;
  process.stdout.write(`${JSON.stringify({ held: open(), ended: ended.size, openMs: Math.round(now() - t0) })}\n`);
  // Hold until the orchestrator has measured, then close everything.
  await new Promise<void>((r) => process.stdin.once('data', () => r()));
  const stillOpen = open();
  for (const c of conns) c.peer.close(1000);
  process.stdout.write(`${JSON.stringify({ closed: true, stillOpen })}\n`);
}

/** Runs a load spec and prints its JSON result line. */
export async function runLoadgen(spec: LoadSpec): Promise<void> {
  if (spec.mode === 'hold') return hold(spec);
  const r = spec.mode === 'throughput' ? await throughput(spec) : await latency(spec);
  // The caller exits once this resolves: a pipe is written asynchronously, so wait until the line is out (a round's
  // samples make it hundreds of KB).
  await new Promise<void>((done) => process.stdout.write(`${JSON.stringify(r)}\n`, () => done()));
}
