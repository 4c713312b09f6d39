// What the live fuzzers share: the server they start, the bystander streams that run beside the cases, the check that
// no request is left live after a batch (`switchyard_live_requests`), /healthz, and the server's RSS and CPU.
import { readFileSync } from 'node:fs';
import { connectClient, type SwitchyardClient as Client } from '../../api/client.ts';
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

/** What a fuzz run's body gets: the server, the bystander beside it, whether the server has exited. */
export interface LiveRun {
  served: Served;
  bystander: Bystander;
  exited(): boolean;
}

/** What a run counts of the server and the bystander. */
export interface LiveCounts {
  crashes: number;
  bystanderBroken: number;
}

/** Reports into a run's counts, each with a note of why. */
export function reporter(
  counts: LiveCounts,
  note: (why: string) => void,
): { crashed(why: string): void; broken(why: string): void } {
  return {
    crashed: (why) => {
      counts.crashes++;
      note(why);
    },
    broken: (why) => {
      counts.bystanderBroken++;
      note(why);
    },
  };
}

/**
 * Runs `body` against a fresh fuzz server with bystander streams of `tokens` tokens beside it; an exit of the server
 * before the end is `crashed` (with the error it printed), a broken bystander `broken`. Resolves with how many
 * bystander streams finished.
 */
export async function withLiveServer(
  timeScale: number,
  tokens: number,
  report: { crashed(why: string): void; broken(why: string): void },
  body: (run: LiveRun) => Promise<void>,
): Promise<number> {
  const served = await startFuzzServer(timeScale);
  let exited = false;
  let stopping = false;
  served.proc.once('exit', (code, signal) => {
    exited = true;
    if (stopping) return;
    const tail = served.lines.slice(-40);
    const error = tail.find((l) => /Error/.test(l)) ?? '';
    const at = tail.find((l) => /^\s+at /.test(l)) ?? '';
    report.crashed(`server exited (${code ?? signal}): ${error.trim()} ${at.trim()}`);
  });
  let client: Client | null = null;
  try {
    client = await connectClient(served.wsUrl, {});
    const bystander = bystand(client, tokens, report.broken);
    await body({ served, bystander, exited: () => exited });
    await bystander.stop();
    return bystander.count();
  } finally {
    client?.close();
    stopping = true;
    await served.stop();
  }
}

/** Set by a fuzz command: each unexpected answer is printed as it happens (the first 20), not only at the end. */
export const echo = { notes: false };

/** Keeps the first 20 unexpected answers of a run, each printed as it comes when `echo.notes` is set. */
export function keepNote(notes: string[], line: string, prefix = 'unexpected'): void {
  if (notes.length >= 20) return;
  notes.push(line);
  if (echo.notes) process.stderr.write(`${prefix}: ${line}\n`);
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
