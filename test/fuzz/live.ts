// What the live fuzzers share: the server they start, the bystander streams that run beside the cases, the check that
// no request is left live after a batch (`switchyard_live_requests`), /healthz, and the server's RSS and CPU.
import { readFileSync } from 'node:fs';
import type { SwitchyardClient as Client } from '../../api/client.ts';
import type { Clock } from '../../runtime/clock.ts';
import { serve, type Served } from '../e2e/harness.ts';

/** The model every fuzz run serves and streams. */
export const FUZZ_MODEL = 'llama-3-8b';
/** The server's timeouts in the fuzz: an idle or slow connection is cut within them (plus the check interval). */
export const HEADERS_TIMEOUT_MS = 1_000;
export const REQUEST_TIMEOUT_MS = 2_000;

/** Starts `switchyard serve` for a fuzz run: simulated time sped up (`timeScale`), short timeouts, no drain wait. */
export async function startFuzzServer(timeScale = 0.05): Promise<Served> {
  const served = await serve([
    '--time-scale',
    String(timeScale),
    '--headers-timeout-ms',
    String(HEADERS_TIMEOUT_MS),
    '--request-timeout-ms',
    String(REQUEST_TIMEOUT_MS),
    '--drain-ms',
    '0',
  ]);
  await served.waitReady(FUZZ_MODEL);
  return served;
}

/** Bystander streams running one after another. */
export interface Bystander {
  /** Streams finished so far. */
  count(): number;
  /** True while a stream is live (submitted and not yet ended): the server counts it among its live requests. */
  streaming(): boolean;
  /** Lets the running stream finish, then stops. */
  stop(): Promise<void>;
}

/** Bystanders stream one after another for the whole run; each must end done with every token it asked for. The
 * first broken one ends them (its connection is usually gone). */
export function bystand(client: Client, tokens: number, broken: (why: string) => void): Bystander {
  let stop = false;
  let count = 0;
  let live = false;
  const running = (async () => {
    while (!stop) {
      live = true;
      const s = client.stream({ model: FUZZ_MODEL, prompt: `bystander ${count}`, maxTokens: tokens });
      let n = 0;
      let why: string | null = null;
      try {
        for await (const c of s) n += c.n;
        const end = await s.result;
        if (!end.ok || end.usage.completionTokens !== tokens || n !== tokens)
          why = `bystander: ended ${end.ok ? 'done' : end.error.message} after ${n} tokens`;
      } catch (e) {
        why = `bystander: ${(e as Error).message}`;
      }
      live = false;
      count++;
      if (why !== null) {
        broken(why);
        break;
      }
    }
  })();
  return {
    count: () => count,
    streaming: () => live,
    stop: () => {
      stop = true;
      return running;
    },
  };
}

/** The server's `switchyard_live_requests`, or null when /metrics did not answer. */
export async function liveRequests(served: Served): Promise<number | null> {
  const r = await served.get('/metrics').catch(() => null);
  if (r === null || r.status !== 200 || typeof r.body !== 'string') return null;
  const m = /^switchyard_live_requests (\S+)$/m.exec(r.body);
  return m ? Number(m[1]) : null;
}

/**
 * Live requests besides the bystander's once the cases of a batch have all ended: polled until none is left (requests
 * the server is still ending get `withinMs`), then what remains is leaked. The bystander counts as one while it
 * streams, checked before and after each read of /metrics.
 */
export async function leakedAfterBatch(
  served: Served,
  clock: Clock,
  bystander: Bystander | null,
  withinMs = 5_000,
): Promise<number> {
  const until = clock.now() + withinMs;
  let excess = 0;
  for (;;) {
    const before = bystander?.streaming() ?? false;
    const live = await liveRequests(served);
    const after = bystander?.streaming() ?? false;
    if (live === null) return Infinity;
    excess = Math.max(0, live - (before || after ? 1 : 0));
    if (excess === 0 || clock.now() >= until) return excess;
    await new Promise<void>((res) => clock.setTimeout(res, 50));
  }
}

/** GET /healthz answers 200. */
export async function healthy(served: Served): Promise<boolean> {
  const r = await served.get('/healthz').catch(() => null);
  return r?.status === 200;
}

/** Calls `fn` every `ms` until the returned stop is called (which calls it once more). */
export function ticker(clock: Clock, ms: number, fn: () => void): () => void {
  let t = clock.setTimeout(function tick() {
    fn();
    t = clock.setTimeout(tick, ms);
  }, ms);
  return () => {
    clock.clearTimeout(t);
    fn();
  };
}

/** CPU seconds a process has used (Linux /proc, user + system), 0 when unknown. */
export function cpuOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
}

/** Resident set of a process in MiB (Linux /proc), 0 when unknown. */
export function rssOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return Math.round(Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024);
  } catch {
    return 0;
  }
}
