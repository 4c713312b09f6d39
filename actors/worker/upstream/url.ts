// Which upstream URLs a config may name and a worker may reach: http(s), no credentials in it, loopback unless the
// config allows a remote server. Checked when the config is read and again by the worker.

/** Host names that are this machine. */
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]', '::1']);

/** Why an upstream URL is refused (not http(s), credentials in it, not loopback unless `remote`), or null. */
export function upstreamUrlProblem(url: string, remote: boolean): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return `is not a URL: ${JSON.stringify(url.slice(0, 100))}`;
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return `must be http or https; got ${u.protocol}`;
  if (u.username || u.password) return 'must not carry credentials (use env for an API key)';
  if (!remote && !LOOPBACK.has(u.hostname)) return `is not loopback (${u.hostname}): set remote: true to allow it`;
  return null;
}
