// The inspector's routes on the serving control plane: the self-hosted page at /inspector (no internet needed) and
// the read-only /v1/inspect WebSocket. The socket shows every tenant's requests: it takes the admin or inspector
// tokens only (never a client token), refuses cross-site pages, and serves a bounded number of readers.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ControlPlane } from '../actors/control-plane.ts';
import type { TimerId } from '../runtime/clock.ts';
import { CLOSE, requestPath, type Refusal, type TokenSet, type WsPeer, type WsRoute } from '../transport/ws.ts';
import { createOutbox } from './outbox.ts';
import { INSPECT_SUBPROTOCOL, INSPECT_VERSION, type InspectMessage } from './protocol.ts';
import { createInspectionSession, type InspectionSession } from './session.ts';
import { pageAsset } from './assets.ts';

/** Options of the inspector routes. */
export interface InspectorRoutesOptions {
  cp: ControlPlane;
  /** The tokens a reader must present: the admin and inspector tokens. */
  tokens: TokenSet;
  /** Most readers at once; more are refused at the upgrade (429). Default DEFAULT_MAX_READERS. */
  maxReaders?: number;
  /** Browser Origins allowed besides the server's own. */
  allowedOrigins?: readonly string[] | null;
  /** Interval between frames sent to a reader (ms). */
  flushMs?: number;
  /** Frames buffered per reader before the oldest are dropped. */
  maxBuffered?: number;
  /** Most frames in one WebSocket message. */
  maxBatch?: number;
  /** Interval between node summaries (ms). */
  summaryMs?: number;
}

/** The routes to mount on the server. */
export interface InspectorRoutes {
  /** Serves GET /inspector and its assets; false for any other path. */
  handleHttp(req: IncomingMessage, res: ServerResponse): boolean;
  /** The /v1/inspect WebSocket route. */
  readonly ws: WsRoute;
  readonly session: InspectionSession;
  /** Readers connected now. */
  readers(): number;
  close(): void;
}

/** Default cap on concurrent readers: each one costs the runtime its inspection and a stream of frames. */
export const DEFAULT_MAX_READERS = 8;

/** Prefix of the subprotocol a browser uses to present a token (browsers cannot set Authorization on a WebSocket). */
export const TOKEN_SUBPROTOCOL_PREFIX = 'switchyard.token.';

/** The token a request presents: `Authorization: Bearer <t>`, or the subprotocol `switchyard.token.<base64url(t)>`. */
export function presentedToken(req: IncomingMessage): string | null {
  const h = req.headers.authorization;
  if (typeof h === 'string') {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (m) return m[1]!;
  }
  for (const p of String(req.headers['sec-websocket-protocol'] ?? '').split(',')) {
    const s = p.trim();
    if (s.startsWith(TOKEN_SUBPROTOCOL_PREFIX))
      return Buffer.from(s.slice(TOKEN_SUBPROTOCOL_PREFIX.length), 'base64url').toString('utf8');
  }
  return null;
}

/** True when the Origin is absent (not a browser), the server's own, or explicitly allowed. */
export function originAllowed(req: IncomingMessage, allowed: readonly string[] | null): boolean {
  const origin = req.headers.origin;
  if (origin === undefined) return true;
  if (allowed?.includes(origin)) return true;
  try {
    return new URL(origin).host === req.headers.host;
  } catch {
    return false;
  }
}

/** Creates the inspector's routes for a serving control plane. */
export function createInspectorRoutes(opts: InspectorRoutesOptions): InspectorRoutes {
  const { cp } = opts;
  const { clock } = cp.runtime;
  const session = createInspectionSession(cp, { timer: true, summaryMs: opts.summaryMs ?? 250 });
  const flushMs = opts.flushMs ?? 50;
  const maxBuffered = opts.maxBuffered ?? 10_000;
  const maxBatch = opts.maxBatch ?? 2_000;
  const maxReaders = opts.maxReaders ?? DEFAULT_MAX_READERS;
  const closers = new Set<() => void>();

  // Checked before the upgrade completes: an admin or inspector token, no page from another site, a reader's slot.
  const authorize = (req: IncomingMessage): Refusal | null => {
    if (!opts.tokens.has(presentedToken(req)))
      return { status: 401, text: 'Unauthorized: the inspector needs the admin token or an inspector token' };
    if (!originAllowed(req, opts.allowedOrigins ?? null)) return { status: 403, text: 'Forbidden: origin not allowed' };
    if (closers.size >= maxReaders)
      return { status: 429, text: `Too Many Requests: the inspector already has ${maxReaders} readers, its most` };
    return null;
  };

  const onConnection = (peer: WsPeer): void => {
    const box = createOutbox(maxBuffered);
    box.push(session.hello('live'));
    let timer: TimerId | null = null;
    let unsubscribe: (() => void) | null = null;
    let incoming = 0;
    const flush = (): void => {
      timer = null;
      if (!peer.isOpen()) return;
      // A slow reader is not sent more: its frames wait in the bounded outbox, which drops the oldest and says so.
      if (!peer.congested() && box.size() > 0) {
        const msg: InspectMessage = { v: INSPECT_VERSION, frames: box.take(maxBatch, clock.now()) };
        peer.send(JSON.stringify(msg));
      }
      timer = clock.setTimeout(flush, flushMs);
    };
    const stop = (): void => {
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      unsubscribe?.();
      unsubscribe = null;
      closers.delete(stop);
    };
    closers.add(stop);
    peer.onClose(stop);
    // Read-only: frames from the page are ignored, and a page that keeps sending is cut off.
    peer.onMessage(() => {
      if (++incoming > 64) peer.close(CLOSE.policy, 'the inspector stream is read-only');
    });
    unsubscribe = session.subscribe((f) => box.push(f));
    flush();
  };

  return {
    handleHttp: (req, res) => {
      const path = requestPath(req.url);
      if (path === null) return false;
      if (path !== '/inspector' && !path.startsWith('/inspector/')) return false;
      if (path === '/inspector/auth') {
        // What the upgrade would answer, readable by the page (a browser never sees why an upgrade was refused).
        const refused = authorize(req);
        res.writeHead(refused ? refused.status : 200, {
          'Content-Type': 'application/json',
          'Cache-Control': 'no-store',
        });
        res.end(JSON.stringify(refused ? { ok: false, status: refused.status, reason: refused.text } : { ok: true }));
        return true;
      }
      const asset = pageAsset(path === '/inspector' ? '/inspector/' : path);
      if (!asset || (req.method !== 'GET' && req.method !== 'HEAD')) {
        res.writeHead(404, { 'Content-Type': 'text/plain' });
        res.end('not found');
        return true;
      }
      res.writeHead(200, asset.headers);
      res.end(req.method === 'HEAD' ? undefined : asset.body);
      return true;
    },
    ws: { tokens: null, protocols: [INSPECT_SUBPROTOCOL], authorize, onConnection },
    session,
    readers: () => closers.size,
    close: () => {
      for (const c of [...closers]) c();
      session.close();
    },
  };
}
