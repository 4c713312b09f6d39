// What a browser page on another site may do here: the Host allow-list (DNS rebinding), the Origin check, and the
// JSON content type that forces a CORS preflight, which this server never answers, on every POST with a body.
import type { IncomingMessage } from 'node:http';
import { isIPv6 } from 'node:net';

/** Host names allowed by default when the client API is open (bound to loopback): the loopback names. */
export const LOOPBACK_HOSTS: readonly string[] = ['localhost', '127.0.0.1', '::1'];

/** The edge's browser-facing policy. */
export interface EdgePolicy {
  /** Host names (no port) a request may name in `Host`; null accepts any (a token-protected, non-loopback bind). */
  readonly allowedHosts: ReadonlySet<string> | null;
  /** Origins (`scheme://host[:port]`) allowed besides the server's own. */
  readonly allowedOrigins: ReadonlySet<string>;
}

/** The host name of a `Host` header without its port, lower-cased (IPv6 without brackets); null when malformed. */
export function hostName(host: string | undefined): string | null {
  if (host === undefined || host.length === 0 || host.length > 255) return null;
  const h = host.toLowerCase();
  if (h.startsWith('[')) {
    const end = h.indexOf(']');
    if (end < 0) return null;
    const v6 = h.slice(1, end);
    const rest = h.slice(end + 1);
    return isIPv6(v6) && (rest === '' || /^:\d{1,5}$/.test(rest)) ? v6 : null;
  }
  const m = /^([a-z0-9.-]+)(?::\d{1,5})?$/.exec(h);
  return m ? m[1]! : null;
}

/** True when the request's Host header names an allowed host. */
export function hostAllowed(req: IncomingMessage, policy: EdgePolicy): boolean {
  if (policy.allowedHosts === null) return true;
  const name = hostName(req.headers.host);
  return name !== null && policy.allowedHosts.has(name);
}

/** True when the request carries no Origin (not a browser), its own (same host, allowed), or an allowed one. */
export function originAllowed(req: IncomingMessage, policy: EdgePolicy): boolean {
  const origin = req.headers.origin;
  if (origin === undefined) return true;
  if (policy.allowedOrigins.has(origin)) return true;
  let url: URL;
  try {
    url = new URL(origin);
  } catch {
    return false;
  }
  return url.host === req.headers.host && hostAllowed(req, policy);
}

/** True when the request says its body is JSON (`application/json`, parameters allowed). */
export function isJsonContent(req: IncomingMessage): boolean {
  const type = req.headers['content-type'];
  if (typeof type !== 'string') return false;
  const media = type.split(';')[0]!.trim().toLowerCase();
  return media === 'application/json' || /^application\/[a-z0-9.+-]*\+json$/.test(media);
}

/** True when the request has a body (a length above 0, or chunked). */
export function hasBody(req: IncomingMessage): boolean {
  const len = req.headers['content-length'];
  if (len !== undefined) return len !== '0';
  return req.headers['transfer-encoding'] !== undefined;
}
