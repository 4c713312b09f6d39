// The one module that imports `ws`: a WebSocket server attached to an HTTP server (authentication at the upgrade,
// explicit payload limits, ping/pong heartbeats, bufferedAmount caps) and a client connector with the same limits.
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { createHash, timingSafeEqual } from 'node:crypto';
import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { WebSocket, WebSocketServer, type RawData } from 'ws';
import type { Clock, TimerId } from '../runtime/clock.ts';

/** Largest message (the sum of its fragments) a peer may send: 1 MiB, the codec's own frame limit. */
export const DEFAULT_MAX_PAYLOAD = 1024 * 1024;
/** Interval between pings; a peer that has not answered the previous ping by the next one is terminated. */
export const DEFAULT_HEARTBEAT_MS = 5_000;
/** Outgoing bytes a peer may have queued before it is cut off as too slow. */
export const DEFAULT_MAX_BUFFERED = 16 * 1024 * 1024;
/** Outgoing bytes above which a peer counts as congested (senders coalesce instead of queueing more). */
export const DEFAULT_HIGH_WATER = 1024 * 1024;
/** Most fragments of one incoming message (empty ones count too); more close the socket with 1008. */
export const DEFAULT_MAX_FRAGMENTS = 1024;

/** Documented close codes switchyard uses (1000–1015 are the RFC's own). */
export const CLOSE = {
  normal: 1000,
  goingAway: 1001,
  policy: 1008,
  tooBig: 1009,
  /** The server failed while handling this connection's frames (its requests are cancelled). */
  internalError: 1011,
  tryAgainLater: 1013,
  /** The peer stopped answering pings. */
  heartbeat: 4000,
  /** The peer fell too far behind reading (bufferedAmount over the cap). */
  slowConsumer: 4001,
  /** The peer spoke another protocol version. */
  protocolVersion: 4002,
  /** A node with these GPUs is already registered. */
  duplicateNode: 4009,
  /** The peer did not register in time. */
  registerTimeout: 4010,
} as const;

/** One open WebSocket, whichever side opened it. */
export interface WsPeer {
  /** The negotiated subprotocol ('' when none). */
  readonly protocol: string;
  /** Remote address, for logs. */
  readonly remote: string;
  /** True until the socket starts closing. */
  isOpen(): boolean;
  /** Queues a frame (binary for bytes, text for strings); false when closed or cut off for exceeding the buffer cap. */
  send(data: Uint8Array | string): boolean;
  /** Bytes queued but not yet written to the socket. */
  bufferedAmount(): number;
  /** True when queued bytes exceed the high-water mark: coalesce rather than queue more. */
  congested(): boolean;
  close(code?: number, reason?: string): void;
  /** Destroys the socket at once. */
  terminate(): void;
  /** Stops reading from the socket (TCP backpressure to the peer) until `resume()`. */
  pause(): void;
  resume(): void;
  /** Sets the handler of incoming frames; frames that arrived before it was set are delivered first. */
  onMessage(fn: (data: Uint8Array | string) => void): void;
  /** Sets the handler called once when the socket has closed. */
  onClose(fn: (code: number, reason: string) => void): void;
}

/** Limits applied to every socket. */
export interface WsLimits {
  /** Largest incoming message in bytes, summed over its fragments (ws refuses more with close 1009). */
  maxPayload?: number;
  /** Most fragments of one incoming message; ws closes with 1008 past it (a flood of tiny fragments). */
  maxFragments?: number;
  heartbeatMs?: number;
  maxBufferedBytes?: number;
  highWaterBytes?: number;
  /** Told why a peer was cut off (heartbeat, slow consumer). */
  log?(line: string): void;
}

/** A path served over WebSocket. */
export interface WsRoute {
  /** Bearer tokens accepted on this path; null means the path is open (allowed only for loopback client APIs). */
  tokens: TokenSet | null;
  /** Subprotocols offered in preference order; when non-empty, a client must ask for one of them. */
  protocols?: readonly string[];
  /** Called for every authenticated connection. */
  onConnection(peer: WsPeer, req: IncomingMessage): void;
  /** Extra check before the upgrade completes (tokens carried elsewhere, Origin): a refusal, or null to go on. */
  authorize?(req: IncomingMessage): Refusal | null;
  /** Slots of this route's own, outside the shared cap and the per-address caps (workers always get in). */
  ownSlots?: number;
}

/** Why an upgrade (or a request) is refused: the HTTP status and a short text. */
export interface Refusal {
  status: number;
  text: string;
}

/** Options of a WebSocket server. */
export interface WsServerOptions extends WsLimits {
  clock: Clock;
  routes: Readonly<Record<string, WsRoute>>;
  /** Origin check for browser clients; absent means any Origin (or none) is accepted. */
  checkOrigin?(origin: string | undefined, req: IncomingMessage): boolean;
  /** Most concurrent sockets across routes; more get 503 at the upgrade. */
  maxConnections?: number;
  /** Most concurrent sockets from one remote address whose client is not known (routes with own slots aside). 256. */
  maxPerAddress?: number;
  /** Most concurrent sockets of one known client (routes with own slots aside). Default 1024. */
  maxPerToken?: number;
  /** The known client a socket counts against for maxPerToken (its tenant, its token), or null: it counts against its
   * address. Default: its bearer token when its route checked it. */
  clientKey?(req: IncomingMessage): string | null;
  /** A check of every upgrade before its route's (Host allow-list, shutting down): a refusal, or null. */
  admit?(req: IncomingMessage, path: string): Refusal | null;
}

/** A WebSocket server attached to an HTTP server. */
export interface WsServer {
  connections(): number;
  /** Closes every socket (code 1001) and stops the heartbeat. */
  close(): void;
}

/** A set of bearer tokens compared in constant time. */
export interface TokenSet {
  has(token: string | null): boolean;
  readonly size: number;
}

/** Why a client connection failed. */
export interface WsConnectError {
  code: 'unauthorized' | 'refused' | 'http_error' | 'timeout' | 'protocol';
  message: string;
  status?: number;
}

const digest = (s: string): Buffer => createHash('sha256').update(s).digest();

/** Builds a token set; tokens are hashed so comparison time does not depend on where they differ. */
export function tokenSet(tokens: Iterable<string>): TokenSet {
  const digests = [...tokens].filter((t) => t.length > 0).map(digest);
  return {
    size: digests.length,
    has: (token) => {
      if (token === null || token.length === 0) return false;
      const d = digest(token);
      let ok = false;
      for (const x of digests) ok = timingSafeEqual(x, d) || ok;
      return ok;
    },
  };
}

/** The bearer token of an HTTP request (`Authorization: Bearer <token>`), or null. */
export function bearerToken(req: IncomingMessage): string | null {
  const h = req.headers.authorization;
  if (typeof h !== 'string') return null;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  return m ? m[1]! : null;
}

/** True for addresses that only this host can reach: `localhost`, 127.0.0.0/8 and ::1 (IPv4-mapped too), parsed. */
export function isLoopback(host: string): boolean {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (h.toLowerCase() === 'localhost') return true;
  if (isIPv4(h)) return h.split('.')[0] === '127';
  if (!isIPv6(h)) return false;
  const list = new BlockList();
  list.addAddress('::1', 'ipv6');
  list.addSubnet('::ffff:127.0.0.0', 104, 'ipv6');
  return list.check(h, 'ipv6');
}

/** The path of a request target, or null when it cannot be parsed (never throws: `//`, `http://[`, `%zz` included). */
export function requestPath(url: string | undefined): string | null {
  const target = url ?? '/';
  // Origin-form targets only ("/a/b?q"); the base keeps "//x" a path instead of a host.
  if (!target.startsWith('/')) return null;
  try {
    return new URL(`http://x${target}`).pathname;
  } catch {
    return null;
  }
}

const toBytes = (data: RawData): Uint8Array => {
  if (Array.isArray(data)) return Buffer.concat(data);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  return data;
};

interface Live {
  ws: WebSocket;
  alive: boolean;
}

/** Wraps a ws socket as a WsPeer; the heartbeat set (when given) tracks it until it closes. */
function wrap(
  ws: WebSocket,
  remote: string,
  limits: Required<Pick<WsLimits, 'maxBufferedBytes' | 'highWaterBytes'>> & Pick<WsLimits, 'log'>,
  live: Set<Live> | null,
): WsPeer {
  let onMessage: ((d: Uint8Array | string) => void) | null = null;
  let onClose: ((code: number, reason: string) => void) | null = null;
  const early: (Uint8Array | string)[] = [];
  let closed: { code: number; reason: string } | null = null;
  const entry: Live = { ws, alive: true };
  live?.add(entry);
  ws.on('pong', () => {
    entry.alive = true;
  });
  ws.on('message', (data, isBinary) => {
    // Any frame proves the peer alive: a pong can sit behind a backlog of frames this side has not processed yet.
    entry.alive = true;
    const d = isBinary ? toBytes(data) : Buffer.from(toBytes(data)).toString('utf8');
    if (onMessage) onMessage(d);
    else if (early.length < 64) early.push(d);
    else ws.close(CLOSE.policy, 'too many frames before the handler was ready');
  });
  ws.on('error', () => {
    // 'close' always follows; errors (bad frames, payload too large) are reported there by code.
  });
  ws.on('close', (code, reason) => {
    live?.delete(entry);
    closed = { code, reason: reason.toString('utf8') };
    onClose?.(closed.code, closed.reason);
  });
  return {
    // Read when asked: a client socket is wrapped before its handshake has chosen the subprotocol.
    get protocol() {
      return ws.protocol;
    },
    remote,
    isOpen: () => ws.readyState === WebSocket.OPEN,
    send: (data) => {
      if (ws.readyState !== WebSocket.OPEN) return false;
      if (ws.bufferedAmount > limits.maxBufferedBytes) {
        limits.log?.(
          `cutting off ${remote}: ${ws.bufferedAmount} bytes queued, over the ${limits.maxBufferedBytes} cap`,
        );
        ws.close(CLOSE.slowConsumer, 'too slow reading');
        ws.terminate();
        return false;
      }
      ws.send(data, { binary: typeof data !== 'string' });
      return true;
    },
    bufferedAmount: () => ws.bufferedAmount,
    congested: () => ws.bufferedAmount > limits.highWaterBytes,
    close: (code = CLOSE.normal, reason = '') => ws.close(code, reason),
    terminate: () => ws.terminate(),
    pause: () => ws.pause(),
    resume: () => ws.resume(),
    onMessage: (fn) => {
      onMessage = fn;
      while (early.length > 0) fn(early.shift()!);
    },
    onClose: (fn) => {
      onClose = fn;
      if (closed) fn(closed.code, closed.reason);
    },
  };
}

/**
 * Pings every live socket each interval; one that did not answer the previous ping is terminated. A beat that comes
 * late (this process was stalled, so pongs may sit unread in socket buffers) only pings: stalls here are not the
 * peers' fault.
 */
function startHeartbeat(clock: Clock, ms: number, live: Set<Live>, log?: (line: string) => void): () => void {
  let timer: TimerId | null = null;
  let last = clock.now();
  const beat = (): void => {
    const now = clock.now();
    const late = now - last > ms * 1.5;
    last = now;
    for (const e of live) {
      if (!e.alive && !late) {
        log?.(`terminating a peer that did not answer a ping within ${ms} ms`);
        e.ws.terminate();
        live.delete(e);
        continue;
      }
      e.alive = false;
      try {
        e.ws.ping();
      } catch {
        e.ws.terminate();
      }
    }
    timer = clock.setTimeout(beat, ms);
  };
  if (ms > 0) timer = clock.setTimeout(beat, ms);
  return () => {
    if (timer !== null) clock.clearTimeout(timer);
    timer = null;
  };
}

/**
 * Counts the answers still owed on each connection (requests emitted, their responses not finished or closed);
 * `owed(socket, fn)` runs fn once none is owed there (at once when none is).
 */
function trackAnswers(server: Server): (socket: Duplex, fn: () => void) => void {
  const owed = new WeakMap<Duplex, { n: number; then: (() => void)[] }>();
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const socket = req.socket;
    let o = owed.get(socket);
    if (!o) owed.set(socket, (o = { n: 0, then: [] }));
    const entry = o;
    entry.n++;
    let settled = false;
    const settle = (): void => {
      if (settled) return;
      settled = true;
      if (--entry.n > 0) return;
      const then = entry.then;
      entry.then = [];
      for (const f of then) f();
    };
    res.once('finish', settle);
    res.once('close', settle);
  });
  return (socket, fn) => {
    const o = owed.get(socket);
    if (o && o.n > 0) o.then.push(fn);
    else fn();
  };
}

function refuse(socket: Duplex, status: number, text: string, extra = ''): void {
  if (socket.writable) {
    socket.end(
      `HTTP/1.1 ${status} ${text}\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(text)}\r\n${extra}\r\n${text}`,
    );
  }
  socket.destroy();
}

/** Serves WebSocket routes on an HTTP server: every upgrade is checked (path, Origin, bearer token, subprotocol) before it is accepted. */
export function attachWsServer(server: Server, opts: WsServerOptions): WsServer {
  const maxPayload = opts.maxPayload ?? DEFAULT_MAX_PAYLOAD;
  const limits = {
    maxBufferedBytes: opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED,
    highWaterBytes: opts.highWaterBytes ?? DEFAULT_HIGH_WATER,
    ...(opts.log ? { log: opts.log } : {}),
  };
  const live = new Set<Live>();
  const servers = new Map<string, WebSocketServer>();
  const wssFor = (path: string, route: WsRoute): WebSocketServer => {
    let wss = servers.get(path);
    if (!wss) {
      wss = new WebSocketServer({
        noServer: true,
        maxPayload,
        maxFragments: opts.maxFragments ?? DEFAULT_MAX_FRAGMENTS,
        // No compression: an inflated frame could dwarf maxPayload's intent, and tokens are small.
        perMessageDeflate: false,
        clientTracking: false,
        skipUTF8Validation: false,
        // A burst read in one go is delivered at once; receivers that do real work per frame queue it and pace
        // themselves (see the stream API), so a burst cannot hold timers and other sockets back.
        allowSynchronousEvents: true,
        handleProtocols: (offered: Set<string>) => {
          for (const p of route.protocols ?? []) if (offered.has(p)) return p;
          return false;
        },
      });
      servers.set(path, wss);
    }
    return wss;
  };
  const stopBeat = startHeartbeat(opts.clock, opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS, live, opts.log);
  let count = 0;
  const own = new Map<string, number>();
  const perAddress = new Map<string, number>();
  const perToken = new Map<string, number>();
  const maxPerAddress = opts.maxPerAddress ?? 256;
  const maxPerToken = opts.maxPerToken ?? 1024;
  const bump = (m: Map<string, number>, k: string, d: number): void => {
    const n = (m.get(k) ?? 0) + d;
    if (n <= 0) m.delete(k);
    else m.set(k, n);
  };

  // Answers still owed on each connection: an upgrade pipelined behind requests not yet answered waits for their
  // answers (node hands the socket over at once; writing the refusal or the 101 then would land inside them).
  const owed = trackAnswers(server);

  const onUpgrade = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    socket.on('error', () => socket.destroy());
    owed(socket, () => {
      if (!socket.destroyed) upgrade(req, socket, head);
    });
  };
  const upgrade = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    const path = requestPath(req.url);
    if (path === null) return refuse(socket, 400, 'Bad Request');
    const route = Object.hasOwn(opts.routes, path) ? opts.routes[path] : undefined;
    if (!route) return refuse(socket, 404, 'Not Found');
    const gate = opts.admit?.(req, path) ?? null;
    if (gate) return refuse(socket, gate.status, gate.text, gate.status === 503 ? 'Retry-After: 1\r\n' : '');
    if (opts.checkOrigin && !opts.checkOrigin(req.headers.origin, req)) return refuse(socket, 403, 'Forbidden');
    if (route.tokens && !route.tokens.has(bearerToken(req)))
      return refuse(socket, 401, 'Unauthorized', 'WWW-Authenticate: Bearer\r\n');
    // Checked before the upgrade completes: nothing is spent on a socket that will be refused.
    const denied = route.authorize?.(req) ?? null;
    if (denied) return refuse(socket, denied.status, denied.text);
    if (route.protocols && route.protocols.length > 0) {
      const asked = String(req.headers['sec-websocket-protocol'] ?? '')
        .split(',')
        .map((s) => s.trim());
      if (!route.protocols.some((p) => asked.includes(p))) {
        return refuse(socket, 400, `Bad Request: ask for one of the subprotocols ${route.protocols.join(', ')}`);
      }
    }
    const address = req.socket.remoteAddress ?? '?';
    const token = bearerToken(req);
    // A token counts as the client's only once its route checked it (anyone may send an unchecked one).
    const checked = route.tokens !== null && token !== null ? digest(token).toString('base64') : null;
    const tokenKey = opts.clientKey ? opts.clientKey(req) : checked;
    if (route.ownSlots !== undefined) {
      if ((own.get(path) ?? 0) >= route.ownSlots)
        return refuse(socket, 503, 'Service Unavailable', 'Retry-After: 1\r\n');
    } else {
      if (opts.maxConnections !== undefined && count >= opts.maxConnections)
        return refuse(socket, 503, 'Service Unavailable', 'Retry-After: 1\r\n');
      // A known client counts against its own cap only: behind a gateway, every client shares one address.
      if (
        tokenKey === null
          ? (perAddress.get(address) ?? 0) >= maxPerAddress
          : (perToken.get(tokenKey) ?? 0) >= maxPerToken
      )
        return refuse(socket, 429, 'Too Many Requests', 'Retry-After: 1\r\n');
    }
    // Counted from here, so that upgrades still completing hold their slot too.
    const release = ((): (() => void) => {
      if (route.ownSlots !== undefined) {
        bump(own, path, 1);
        return () => bump(own, path, -1);
      }
      count++;
      const [m, k] = tokenKey === null ? [perAddress, address] : [perToken, tokenKey];
      bump(m, k, 1);
      return () => {
        count--;
        bump(m, k, -1);
      };
    })();
    let released = false;
    const releaseOnce = (): void => {
      if (!released) release();
      released = true;
    };
    socket.once('close', releaseOnce);
    wssFor(path, route).handleUpgrade(req, socket, head, (ws) => {
      ws.on('close', releaseOnce);
      const peer = wrap(ws, `${req.socket.remoteAddress ?? '?'}:${req.socket.remotePort ?? 0}`, limits, live);
      route.onConnection(peer, req);
    });
  };
  server.on('upgrade', onUpgrade);

  return {
    connections: () => count + [...own.values()].reduce((a, b) => a + b, 0),
    close: () => {
      stopBeat();
      server.off('upgrade', onUpgrade);
      for (const e of live) e.ws.close(CLOSE.goingAway, 'server shutting down');
      live.clear();
    },
  };
}

/** Options of a client connection. */
export interface WsConnectOptions extends WsLimits {
  clock: Clock;
  token?: string;
  protocols?: readonly string[];
  handshakeTimeoutMs?: number;
  /** Certificate authorities (PEM) to verify a `wss://` server with, besides the system's (private certificates). */
  ca?: string | Buffer;
}

/** Opens a WebSocket to `url`; resolves with the peer or a typed error (never rejects). */
export function connectWs(
  url: string,
  opts: WsConnectOptions,
): Promise<{ ok: true; peer: WsPeer } | { ok: false; error: WsConnectError }> {
  const limits = {
    maxBufferedBytes: opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED,
    highWaterBytes: opts.highWaterBytes ?? DEFAULT_HIGH_WATER,
    ...(opts.log ? { log: opts.log } : {}),
  };
  return new Promise((resolve) => {
    let settled = false;
    const settle = (v: { ok: true; peer: WsPeer } | { ok: false; error: WsConnectError }): void => {
      if (settled) return;
      settled = true;
      resolve(v);
    };
    let ws: WebSocket;
    try {
      ws = new WebSocket(url, [...(opts.protocols ?? [])], {
        maxPayload: opts.maxPayload ?? DEFAULT_MAX_PAYLOAD,
        maxFragments: opts.maxFragments ?? DEFAULT_MAX_FRAGMENTS,
        perMessageDeflate: false,
        followRedirects: false,
        skipUTF8Validation: false,
        handshakeTimeout: opts.handshakeTimeoutMs ?? 10_000,
        headers: opts.token ? { Authorization: `Bearer ${opts.token}` } : {},
        // wss:// verifies the server's certificate (never turned off); `ca` adds a private authority.
        ...(opts.ca !== undefined ? { ca: opts.ca } : {}),
      });
    } catch (e) {
      settle({ ok: false, error: { code: 'refused', message: (e as Error).message } });
      return;
    }
    const live = new Set<Live>();
    // Wrapped before 'open' so that no frame sent right after the handshake is missed.
    const peer = wrap(ws, url, limits, live);
    const stopBeat = startHeartbeat(opts.clock, opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS, live, opts.log);
    ws.on('close', stopBeat);
    ws.on('unexpected-response', (_req, res) => {
      const status = res.statusCode ?? 0;
      settle({
        ok: false,
        error: {
          code: status === 401 || status === 403 ? 'unauthorized' : 'http_error',
          status,
          message: `upgrade refused with HTTP ${status}`,
        },
      });
      res.resume();
      ws.terminate();
    });
    ws.on('error', (e: Error & { code?: string }) => {
      const code = /timeout/i.test(e.message) ? 'timeout' : /protocol/i.test(e.message) ? 'protocol' : 'refused';
      settle({ ok: false, error: { code, message: e.message } });
    });
    ws.on('open', () => settle({ ok: true, peer }));
  });
}
