// Who a connection, stream or incoming frame counts against: its tenant when its token names one, else its client
// token, and only where no token is known its remote address (behind a gateway every tenant shares one address).
import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { ServerResponse } from 'node:http';
import { failure } from '../machines/outcomes.ts';
import { bearerToken, requestPath, type TokenSet } from '../transport/ws.ts';
import { sendFailure } from './http/io.ts';
import type { Tenants } from './tenants.ts';

/** A request's client for the per-client caps: `known` when a valid token identifies it, else keyed by address. */
export interface ClientKey {
  readonly key: string;
  readonly known: boolean;
}

/** Answers the client key of a request, given the server's tenants or client tokens (both absent: an open API); each
 * request's key is worked out once (the connection caps, the stream caps and the inbound budget all ask). */
export function clientKeyOf(
  tenants: Tenants | undefined,
  clientTokens: TokenSet | null,
): (req: IncomingMessage) => ClientKey {
  const seen = new WeakMap<IncomingMessage, ClientKey>();
  return (req) => {
    let k = seen.get(req);
    if (!k) seen.set(req, (k = keyOf(tenants, clientTokens, req)));
    return k;
  };
}

/** The client key of one request. */
function keyOf(tenants: Tenants | undefined, clientTokens: TokenSet | null, req: IncomingMessage): ClientKey {
  const token = bearerToken(req);
  if (tenants) {
    const t = tenants.of(token);
    if (t) return { key: `tenant\u0000${t.name}`, known: true };
  } else if (token !== null && clientTokens?.has(token)) {
    return { key: `token\u0000${createHash('sha256').update(token).digest('hex')}`, known: true };
  }
  return { key: `address\u0000${req.socket.remoteAddress ?? '?'}`, known: false };
}

/** Counts what each client holds against one cap. */
export interface ClientCounter {
  /** Takes one for `key`: its release (call once), or null when `key` holds the most already. */
  take(key: string): (() => void) | null;
  held(key: string): number;
}

/** Creates a counter capped at `max` per client. */
export function createClientCounter(max: number): ClientCounter {
  const held = new Map<string, number>();
  return {
    take: (key) => {
      const n = held.get(key) ?? 0;
      if (n >= max) return null;
      held.set(key, n + 1);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        const left = (held.get(key) ?? 1) - 1;
        if (left <= 0) held.delete(key);
        else held.set(key, left);
      };
    },
    held: (key) => held.get(key) ?? 0,
  };
}

/** Holds one of `key`'s streams for a POST under /v1 (a completion, streamed or not) until its response closes; past
 * the client's cap, answers 429 (overloaded, retry soon) and false. Other requests hold nothing. */
export function holdStream(counter: ClientCounter, key: string, req: IncomingMessage, res: ServerResponse): boolean {
  if (req.method !== 'POST' || !(requestPath(req.url) ?? '').startsWith('/v1/')) return true;
  const release = counter.take(key);
  if (release === null) {
    sendFailure(res, failure('overloaded', 'this client has its most requests in flight', { retryAfterMs: 1000 }));
    return false;
  }
  res.once('close', release);
  return true;
}
