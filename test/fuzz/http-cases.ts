// The seeded cases of the HTTP fuzzer: well-framed requests over hostile paths, methods, headers, bodies and encodings
// (sent pipelined on keep-alive connections), and connection behaviours that need a socket of their own (half-closed
// sockets, broken chunked bodies, binary garbage, idle connections, slow senders, oversized bodies). The same seed gives
// the same sequence of cases; each names the statuses it may get (0: the socket closed without an answer).

/** A small seeded generator (xorshift32): the same seed gives the same cases. */
export function rng(seed: number): { int(n: number): number; pick<T>(xs: readonly T[]): T } {
  let x = seed >>> 0 || 1;
  const next = (): number => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
  return { int: (n) => next() % n, pick: (xs) => xs[next() % xs.length]! };
}

export type Rng = ReturnType<typeof rng>;

/** A request whose framing node parses (or refuses with an answer): it may share a keep-alive connection. */
export interface Framed {
  readonly type: 'framed';
  readonly kind: string;
  readonly bytes: string;
  /** A HEAD request: its answer has no body whatever its Content-Length. */
  readonly head: boolean;
  /** The server is expected to close the connection after it (sent last in a pipelined batch). */
  readonly closes: boolean;
  readonly ok: (status: number) => boolean;
  /** What the case changed, for reports (the bytes are shown when absent). */
  readonly what?: string;
}

/** What a connection behaviour does on its own socket. */
export type BehaviourKind =
  'half-closed' | 'encoding' | 'garbage' | 'idle' | 'slow-headers' | 'slow-body' | 'slow-complete' | 'big-body';

/** A connection behaviour: it needs a socket of its own. */
export interface Behaviour {
  readonly type: 'behaviour';
  readonly kind: BehaviourKind;
  /** What to send (for the slow kinds, trickled in `pieces` pieces `everyMs` apart). */
  readonly bytes: string;
  readonly ok: (status: number) => boolean;
  /** Half-close (FIN) after the bytes. */
  readonly halfClose: boolean;
  /** Trickle: the bytes in this many pieces (then, unless the request is complete, nothing more). */
  readonly pieces: number;
  readonly everyMs: number;
  /** The server must have answered or closed by then (ms after connecting), or the case fails. */
  readonly slow: boolean;
}

export type Case = Framed | Behaviour;

const MODEL = 'llama-3-8b';

const PATHS = [
  '/',
  '//',
  '///',
  '//inspector',
  '/inspector/',
  '/inspector/../../etc/passwd',
  '/inspector/auth',
  '/v1/models',
  '/v1/ws',
  '/v1/inspect',
  '/v1/node',
  '/v1/completions',
  '/v1/chat/completions',
  '/admin/status',
  '/admin/replicas/%zz/drain',
  '/admin/gpus/99/fail',
  '/metrics',
  '/healthz',
  '/readyz',
  '/%',
  '/%00',
  '/a?b=%',
  '/\u00e9',
  '*',
  'http://x/',
  '/v1/../admin/status',
];
const METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'HEAD', 'OPTIONS', 'PATCH', 'TRACE', 'CONNECT', 'FOO', 'G ET'];
/** Methods node's parser refuses or that take the socket away (CONNECT without a listener): the connection ends. */
const CLOSING_METHODS = new Set(['CONNECT', 'FOO', 'G ET']);
const BODIES = [
  '',
  '{',
  '[]',
  'null',
  '"x"',
  '{"model":1}',
  `{"model":"${MODEL}","prompt":"hi","max_tokens":2}`,
  `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
  `{"model":"${MODEL}","prompt":"hi","max_tokens":2,"stream":true}`,
  '{"__proto__":{"x":1}}',
  `{"model":"x","prompt":${'['.repeat(5000)}`,
  '{"model":"m","max_tokens":1e309}',
  '\u0000\u0001\u00ff',
];
const TYPES = [
  'application/json',
  'text/plain',
  'application/x-www-form-urlencoded',
  'multipart/form-data',
  '',
  'application/json; charset=utf-16',
  'application/vnd.api+json',
];
const HOSTS = ['127.0.0.1', 'localhost', 'evil.example', '', '[::1]', '127.0.0.1:1', 'a'.repeat(300)];
/** Extra headers; the ones after the first CLOSING_HEADERS are refused by node or taken by the upgrade path. */
const HEADERS = [
  'Authorization: Bearer \r\n',
  'Authorization: Basic Zm9vOmJhcg==\r\n',
  'Authorization: Bearer wrong-token-0123456789\r\n',
  'Origin: https://evil.example\r\n',
  'Origin: null\r\n',
  'Expect: 100-continue\r\n',
  'Cookie: a=b\r\n',
  'Accept-Encoding: gzip, br\r\n',
  'Content-Length: 0\r\n',
  // From here on the connection is expected to end after the answer.
  `X-Big: ${'a'.repeat(20_000)}\r\n`,
  'Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: x\r\n',
  'Content-Length: -1\r\n',
  'Content-Length: 5\r\nTransfer-Encoding: chunked\r\n',
  'Content-Length: 1\r\nContent-Length: 2\r\n',
  'Transfer-Encoding: gzip\r\n',
  'X-Bad\u0000Name: 1\r\n',
];
const CLOSING_HEADERS = 9;
const QUERY = 'q'.repeat(3000);
const BIG_BODY = `{"model":"${MODEL}","prompt":"${'x'.repeat(1_200_000)}","max_tokens":1}`;

// 100 is the interim answer to `Expect: 100-continue`.
const anyStatus = (s: number): boolean => s === 0 || s === 100 || (s >= 200 && s < 500) || s === 503;
/** A body case: a valid completion may be served (200) or refused for load (429, 503); nothing may answer 500. */
const bodyStatus = (s: number): boolean => s === 0 || (s >= 200 && s < 500) || s === 503;
/** A request the server cuts for being slow or idle: 408 from node, or the socket closed. */
const cutStatus = (s: number): boolean => s === 0 || s === 408;
const healthy = (s: number): boolean => s === 200;

/** Draws the next case: 88 % framed requests, 10 % quick behaviours, 2 % slow ones (idle, slow senders). */
export function drawCase(r: Rng): Case {
  const roll = r.int(1000);
  if (roll < 880) return drawFramed(r);
  if (roll < 980) return drawQuick(r);
  return drawSlow(r);
}

function target(r: Rng): string {
  return r.pick(PATHS) + (r.int(4) === 0 ? `?${QUERY.slice(0, r.int(3000))}` : '');
}

function hostLine(r: Rng): { line: string; closes: boolean } {
  const host = r.pick(HOSTS);
  // HTTP/1.1 without Host is refused by node (400) and the connection closed.
  return host === '' ? { line: '', closes: true } : { line: `Host: ${host}\r\n`, closes: false };
}

/** A well-framed request; one in sixteen asks for `Connection: close`. */
function drawFramed(r: Rng): Framed {
  const path = target(r);
  const nonAscii = /[^\x20-\x7e]/.test(path);
  const host = hostLine(r);
  const close = r.int(16) === 0;
  const conn = close ? 'Connection: close\r\n' : '';
  const base = host.closes || nonAscii || close;
  switch (r.int(5)) {
    case 0:
      return framed('path', `GET ${path} HTTP/1.1\r\n${host.line}${conn}\r\n`, false, base, anyStatus);
    case 1: {
      const method = r.pick(METHODS);
      const closes = base || CLOSING_METHODS.has(method);
      return framed(
        'method',
        `${method} ${path} HTTP/1.1\r\n${host.line}${conn}\r\n`,
        method === 'HEAD',
        closes,
        anyStatus,
      );
    }
    case 2: {
      const i = r.int(HEADERS.length);
      const closes = base || i >= CLOSING_HEADERS;
      return framed(
        'header',
        `GET ${path} HTTP/1.1\r\n${host.line}${HEADERS[i]!}${conn}\r\n`,
        false,
        closes,
        anyStatus,
      );
    }
    case 3: {
      const body = r.pick(BODIES);
      const type = r.pick(TYPES);
      const to = r.pick(['/v1/completions', '/v1/chat/completions', '/admin/routing', '/admin/placement', '/healthz']);
      const enc = r.int(5) === 0 ? `Content-Encoding: ${r.pick(['gzip', 'br', 'x-bogus'])}\r\n` : '';
      const ct = type ? `Content-Type: ${type}\r\n` : '';
      const len = `Content-Length: ${Buffer.byteLength(body)}\r\n`;
      const bytes = `POST ${to} HTTP/1.1\r\nHost: 127.0.0.1\r\n${ct}${enc}${len}${conn}\r\n${body}`;
      return framed('body', bytes, false, close, bodyStatus);
    }
    default: {
      // A complete chunked body, well framed or refused by node's parser (which then closes).
      const chunks = r.pick(['0\r\n\r\n', '2\r\n{}\r\n0\r\n\r\n', '1\r\n{\r\n1\r\n}\r\n0\r\n\r\n', 'zz\r\n\r\n']);
      const head = 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n';
      const bytes = `${head}Transfer-Encoding: chunked\r\n${conn}\r\n${chunks}`;
      return framed('chunked', bytes, false, close || chunks.startsWith('zz'), bodyStatus);
    }
  }
}

function framed(kind: string, bytes: string, head: boolean, closes: boolean, ok: (s: number) => boolean): Framed {
  return { type: 'framed', kind, bytes, head, closes, ok };
}

function behaviour(
  kind: BehaviourKind,
  bytes: string,
  ok: (s: number) => boolean,
  more: Partial<Behaviour> = {},
): Behaviour {
  return { type: 'behaviour', kind, bytes, ok, halfClose: false, pieces: 1, everyMs: 0, slow: false, ...more };
}

/** A behaviour that ends quickly: a half-closed socket, a broken chunked body, binary garbage. */
function drawQuick(r: Rng): Behaviour {
  switch (r.int(3)) {
    case 0:
      return behaviour('half-closed', `GET ${target(r)} HTTP/1.1\r\n${hostLine(r).line}`, anyStatus, {
        halfClose: true,
      });
    case 1: {
      const head = 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n';
      const chunk = r.pick(['zz\r\n', '5\r\n{"a"\r\n', 'ffffffffff\r\n', '0\r\n\r\n', '5\r\n{"a"}']);
      return behaviour('encoding', `${head}Transfer-Encoding: chunked\r\n\r\n${chunk}`, anyStatus, { halfClose: true });
    }
    default: {
      let s = '';
      const n = 1 + r.int(200);
      for (let i = 0; i < n; i++) s += String.fromCharCode(r.int(256));
      return behaviour('garbage', s, anyStatus, { halfClose: r.int(2) === 0 });
    }
  }
}

/** A behaviour that takes time: idle, slow headers, a slow body, a slow but complete request, an oversized body. */
function drawSlow(r: Rng): Behaviour {
  const roll = r.int(100);
  if (roll < 25) return behaviour('idle', '', cutStatus, { slow: true });
  if (roll < 50) {
    const bytes = `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ${'s'.repeat(40)}`;
    return behaviour('slow-headers', bytes, cutStatus, { slow: true, pieces: 8, everyMs: 100 });
  }
  if (roll < 75) {
    const head = 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n';
    const bytes = `${head}Content-Length: 100\r\n\r\n{"model":"${MODEL}"`;
    return behaviour('slow-body', bytes, cutStatus, { slow: true, pieces: 8, everyMs: 150 });
  }
  if (roll < 99) {
    // Slow but well within the server's timeouts: it must be served.
    const bytes = 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n';
    return behaviour('slow-complete', bytes, healthy, { slow: true, pieces: 4, everyMs: 40 });
  }
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n';
  const bytes = `${head}Content-Length: ${BIG_BODY.length}\r\n\r\n${BIG_BODY}`;
  return behaviour('big-body', bytes, (s) => s === 0 || s === 413, { slow: true });
}
