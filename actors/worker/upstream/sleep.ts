// Sleep mode of upstream servers (vLLM's `POST /sleep?level=1`, `POST /wake_up`, `GET /is_sleeping`): a released
// replica's server with `upstream.sleep` is put to sleep instead of stopped and parked in the worker, keyed by its
// command, model and GPUs; the next replica of the same server on the same GPUs wakes it instead of starting one.
// A sleeping vLLM server frees its GPU memory (weights to host memory, KV cache dropped), so another model's server
// may run on those GPUs meanwhile. Parked servers are bounded: beyond the bound the longest parked is stopped.
import type { WireUpstreamSpec } from '../../../machines/messages.ts';
import type { UpstreamHttp } from './http.ts';
import type { ServerProcess } from './server.ts';

/** Most servers parked in one worker. */
export const MAX_PARKED = 16;

/** Who hears a server's exit: the replica that uses it, or the parking lot while it sleeps. */
export interface ExitRoute {
  exit(code: number | null, signal: NodeJS.Signals | null): void;
}

/** A server taken from a released replica: its process, address, connections, and its sleep (ms it took, or why it
 * failed) once it is asleep. */
export interface ParkedServer {
  key: string;
  gpus: readonly number[];
  proc: ServerProcess;
  route: ExitRoute;
  base: string;
  http: UpstreamHttp;
  asleep: Promise<{ ms: number } | { error: string }>;
}

const parked = new Map<string, ParkedServer>();
let hooked = false;

/** The key of a started server: the same command, model, folder, environment and GPUs wake the same server. */
export function parkingKey(spec: WireUpstreamSpec, gpus: readonly number[]): string {
  return JSON.stringify([spec.command ?? [], spec.model, spec.cwd ?? '', spec.env ?? {}, [...gpus]]);
}

/** Stops a parked server's whole process group (it is not any replica's any more). */
function stop(p: ParkedServer): void {
  parked.delete(p.key);
  p.route.exit = () => undefined;
  p.proc.signal('SIGKILL');
  p.http.close();
}

/** Parks a server while it falls asleep; its exit while parked takes it out. */
export function park(p: ParkedServer): void {
  const old = parked.get(p.key);
  if (old && old !== p) stop(old);
  p.route.exit = () => {
    if (parked.get(p.key) === p) parked.delete(p.key);
    p.http.close();
  };
  parked.set(p.key, p);
  while (parked.size > MAX_PARKED) stop(parked.values().next().value!);
  if (!hooked) {
    hooked = true;
    // Parked servers run in process groups of their own: they go with the worker, whatever ends it.
    process.once('exit', () => {
      for (const q of [...parked.values()]) stop(q);
    });
  }
}

/** Takes the server parked under `key`, if any (it is the caller's from now on: its exit goes to the caller). */
export function unpark(key: string): ParkedServer | undefined {
  const p = parked.get(key);
  if (p) parked.delete(p.key);
  return p;
}

/** Stops every parked server on GPU `g` (a fault: what ran there is not trusted again). */
export function dropParkedOn(g: number): void {
  for (const p of [...parked.values()]) if (p.gpus.includes(g)) stop(p);
}

/** Stops every parked server (the worker is going away). */
export function dropAllParked(): void {
  for (const p of [...parked.values()]) stop(p);
}

/** The servers parked now (pids, for views and tests). */
export function parkedServers(): { key: string; pid: number | undefined }[] {
  return [...parked.values()].map((p) => ({ key: p.key, pid: p.proc.pid }));
}

/** Puts a server to sleep (level 1); answers the ms it took or why it did not. */
export async function sleepServer(
  http: UpstreamHttp,
  timeoutMs: number,
  now: () => number,
): Promise<{ ms: number } | { error: string }> {
  const t0 = now();
  const r = await http.call('POST', '/sleep?level=1', { timeoutMs, maxBytes: 1 << 16, body: '' });
  if ('error' in r) return { error: r.error };
  if (r.status !== 200) return { error: `/sleep answered ${r.status}` };
  return { ms: now() - t0 };
}

/** Wakes a sleeping server and checks it says it is awake; answers the ms it took or why it did not wake. */
export async function wakeServer(
  http: UpstreamHttp,
  timeoutMs: number,
  now: () => number,
): Promise<{ ms: number } | { error: string }> {
  const t0 = now();
  const r = await http.call('POST', '/wake_up', { timeoutMs, maxBytes: 1 << 16, body: '' });
  if ('error' in r) return { error: r.error };
  if (r.status !== 200) return { error: `/wake_up answered ${r.status}` };
  const s = await http.call('GET', '/is_sleeping', { timeoutMs, maxBytes: 1 << 16 });
  if ('status' in s && s.status === 200) {
    let v: unknown;
    try {
      v = JSON.parse(s.text);
    } catch {
      v = null;
    }
    if ((v as { is_sleeping?: unknown } | null)?.is_sleeping === true) return { error: 'it still says it is sleeping' };
  }
  return { ms: now() - t0 };
}
