// The HTTP fuzzer's client side on raw sockets: a keep-alive connection that sends a batch of framed requests pipelined
// and reads their answers in order (1xx interim answers skipped, HEAD answers without a body, chunked and
// close-delimited bodies), and a connection behaviour run on a socket of its own under a deadline.
import { connect, type Socket } from 'node:net';
import type { Clock, TimerId } from '../../runtime/clock.ts';
import type { Behaviour, Framed } from './http-cases.ts';

/** A status that is not HTTP: the connection stalled (no progress within the stall limit) with a request open. */
export const STALLED = -1;
/** A status that is not HTTP: what came back could not be read as an HTTP/1.1 answer. */
export const GARBLED = -2;

/** One answer read off a connection; `used` bytes of the buffer belong to it. */
type Answer =
  | { kind: 'final'; status: number; close: boolean; used: number }
  | { kind: 'interim'; used: number }
  | { kind: 'until-close'; status: number }
  | { kind: 'more' }
  | { kind: 'garbled' };

const CRLF2 = Buffer.from('\r\n\r\n');

/** Reads one answer from the start of `buf` (`head`: it answers a HEAD request). */
export function readAnswer(buf: Buffer, head: boolean): Answer {
  const end = buf.indexOf(CRLF2);
  if (end < 0) return buf.length > 64 * 1024 ? { kind: 'garbled' } : { kind: 'more' };
  const text = buf.toString('latin1', 0, end);
  const m = /^HTTP\/1\.[01] (\d{3})[^\r\n]*/.exec(text);
  if (!m) return { kind: 'garbled' };
  const status = Number(m[1]);
  const start = end + 4;
  if (status >= 100 && status < 200 && status !== 101) return { kind: 'interim', used: start };
  let length = -1;
  let chunked = false;
  let close = false;
  for (const line of text.slice(m[0].length + 2).split('\r\n')) {
    const colon = line.indexOf(':');
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line
      .slice(colon + 1)
      .trim()
      .toLowerCase();
    if (name === 'content-length') length = Number(value);
    else if (name === 'transfer-encoding') chunked = value.includes('chunked');
    else if (name === 'connection') close = value.includes('close');
  }
  if (head || status === 101 || status === 204 || status === 304) return { kind: 'final', status, close, used: start };
  if (chunked) {
    const used = chunkedEnd(buf, start);
    if (used === null) return { kind: 'more' };
    return used < 0 ? { kind: 'garbled' } : { kind: 'final', status, close, used };
  }
  if (length >= 0) {
    if (!Number.isSafeInteger(length)) return { kind: 'garbled' };
    return buf.length >= start + length ? { kind: 'final', status, close, used: start + length } : { kind: 'more' };
  }
  return { kind: 'until-close', status };
}

/** Where a chunked body starting at `at` ends: null while incomplete, -1 when malformed. */
function chunkedEnd(buf: Buffer, at: number): number | null {
  let pos = at;
  for (;;) {
    const eol = buf.indexOf('\r\n', pos);
    if (eol < 0) return null;
    const size = parseInt(buf.toString('latin1', pos, eol).split(';')[0]!, 16);
    if (!Number.isSafeInteger(size) || size < 0) return -1;
    if (size === 0) {
      // Trailers (usually none) end with an empty line.
      const t = buf.indexOf('\r\n', eol + 2);
      if (t < 0) return null;
      if (t === eol + 2) return t + 2;
      const e = buf.indexOf(CRLF2, eol + 2);
      return e < 0 ? null : e + 4;
    }
    pos = eol + 2 + size + 2;
    if (pos > buf.length) return null;
  }
}

/** What a batch came to: each answered case with its status, and the cases never read (to send again elsewhere). */
export interface BatchResult {
  answered: { c: Framed; status: number }[];
  requeue: Framed[];
  /** What came back when it could not be read as an answer, and the answers before it. */
  garbled?: string;
}

/** A keep-alive connection (opened again when the server closed it) that sends batches of pipelined requests. */
export interface KeepAlive {
  /** Sends the batch in one write; resolves once every case is answered, or the connection ended. */
  send(batch: readonly Framed[]): Promise<BatchResult>;
  close(): void;
}

/** Creates a keep-alive connection to `port`; a batch with no progress for `stallMs` ends with STALLED. */
export function keepAlive(port: number, clock: Clock, stallMs: number): KeepAlive {
  let sock: Socket | null = null;
  let buf: Buffer = Buffer.alloc(0);
  let inflight: Framed[] = [];
  let result: BatchResult = { answered: [], requeue: [] };
  let closing = false;
  let tail: number | null = null;
  let stall: TimerId | null = null;
  let finish: (() => void) | null = null;
  let sent: readonly Framed[] = [];
  let all = Buffer.alloc(0);

  const answer = (status: number): void => void result.answered.push({ c: inflight.shift()!, status });
  const armStall = (): void => {
    if (stall !== null) clock.clearTimeout(stall);
    stall = clock.setTimeout(() => {
      stall = null;
      if (inflight.length > 0) answer(STALLED);
      closing = true;
      sock?.destroy();
    }, stallMs);
  };
  const onData = (d: Buffer): void => {
    if (inflight.length === 0) return;
    if (process.env.FUZZ_DEBUG) all = Buffer.concat([all, d]);
    buf = buf.length === 0 ? d : Buffer.concat([buf, d]);
    armStall();
    while (inflight.length > 0 && tail === null) {
      const a = readAnswer(buf, inflight[0]!.head);
      if (a.kind === 'more') return;
      if (a.kind === 'garbled') {
        const before = result.answered.map((x) => `${x.status} for ${JSON.stringify(x.c.bytes.slice(0, 60))}`);
        result.garbled = `${JSON.stringify(buf.toString('latin1', 0, 200))} after [${before.join(', ')}]`;
        if (process.env.FUZZ_DEBUG)
          result.garbled += ` batch ${JSON.stringify(sent.map((c) => c.bytes.slice(0, 300)))} all ${JSON.stringify(all.toString('latin1'))}`;
        answer(GARBLED);
        closing = true;
        sock?.destroy();
        return;
      }
      if (a.kind === 'until-close') {
        tail = a.status;
        return;
      }
      buf = buf.subarray(a.used);
      if (a.kind === 'interim') continue;
      answer(a.status);
      if (a.close) closing = true;
    }
    if (inflight.length === 0) done();
  };
  const onClose = (): void => {
    sock = null;
    if (tail !== null) answer(tail);
    // The request at the head took the connection down (or node dropped it): it gets 0; the ones after it were
    // never read, and are sent again. After an answer that said `Connection: close`, none was read.
    else if (!closing && inflight.length > 0) answer(0);
    done();
  };
  const done = (): void => {
    if (stall !== null) clock.clearTimeout(stall);
    stall = null;
    result.requeue.push(...inflight);
    inflight = [];
    const f = finish;
    finish = null;
    f?.();
  };
  const open = (): Socket => {
    const s = connect(port, '127.0.0.1');
    s.setNoDelay(true);
    s.on('data', onData);
    s.on('error', () => {});
    s.on('close', () => {
      if (s === sock) onClose();
    });
    return s;
  };

  return {
    send: (batch) =>
      new Promise<BatchResult>((resolve) => {
        result = { answered: [], requeue: [] };
        inflight = [...batch];
        sent = batch;
        all = Buffer.alloc(0);
        buf = Buffer.alloc(0);
        closing = false;
        tail = null;
        finish = () => resolve(result);
        if (sock === null || sock.destroyed) sock = open();
        let bytes = '';
        for (const c of batch) bytes += c.bytes;
        sock.write(bytes);
        armStall();
      }),
    close: () => {
      const s = sock;
      sock = null;
      s?.destroy();
    },
  };
}

/** Runs a behaviour on its own socket; resolves with the status of the first final answer, 0 when the socket closed
 * without one, or STALLED when neither happened within `boundMs`. */
export function runBehaviour(port: number, b: Behaviour, clock: Clock, boundMs: number): Promise<number> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let buf: Buffer = Buffer.alloc(0);
    let status = 0;
    const timers: TimerId[] = [];
    const bound = clock.setTimeout(() => {
      status = STALLED;
      s.destroy();
    }, boundMs);
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const a = readAnswer(buf, false);
        if (a.kind === 'interim') {
          buf = buf.subarray(a.used);
          continue;
        }
        if (a.kind === 'final' || a.kind === 'until-close') status = a.status;
        else if (a.kind === 'garbled') status = GARBLED;
        if (a.kind !== 'more') s.destroy();
        return;
      }
    });
    s.on('error', () => {});
    s.on('close', () => {
      clock.clearTimeout(bound);
      for (const t of timers) clock.clearTimeout(t);
      resolve(status);
    });
    s.on('connect', () => {
      const size = Math.ceil(b.bytes.length / b.pieces);
      const piece = (i: number): void => {
        if (s.destroyed) return;
        s.write(b.bytes.slice(i * size, (i + 1) * size), 'latin1');
        if (i + 1 < b.pieces) timers.push(clock.setTimeout(() => piece(i + 1), b.everyMs));
        else if (b.halfClose) s.end();
      };
      if (b.bytes.length > 0) piece(0);
      else if (b.halfClose) s.end();
    });
  });
}
