// Serving a request stream through the real path: `switchyard serve` (control plane) → its worker process → one
// engine host process per replica, driven by a /v1/ws client in this process. Timings are the client's wall clock
// (when each token chunk arrived); CPU time is read per process and per thread from /proc, so switchyard's own share
// can be told from the engine's on a shared machine.
//
// The engine's CPU is llama.cpp's: the engine hosts' libuv pool threads, where node-llama-cpp runs llama_decode and
// sampling (bench/lib/thread-cpu.ts tells them from the other threads). Everything else is switchyard's overhead:
// the control plane and the worker (all of their threads), and the hosts' main threads (IPC, plan checks, text
// streams, node-llama-cpp's JavaScript) and V8 helper threads (garbage collection, compilation). The CPU the
// processes use while nothing is served (timers, metrics, heartbeats) is measured before the run and reported; it
// is not subtracted.
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { connectClient } from '../../api/client.ts';
import { createRng, type Rng } from '../../runtime/rng.ts';
import type { BenchRequest, RequestTiming, ServeRun } from './engine-serve.ts';
import { poolSize, splitEngineThreads, threadCpu, threadDelta, totalMs } from './thread-cpu.ts';
import { cpuProfileArgs } from '../../runtime/cpu-profile.ts';
import { ENGINE_STATS_DIR_ENV, type HostStatsFile } from '../../actors/engine/host-protocol.ts';

const BIN = new URL('../../bin/switchyard.ts', import.meta.url).pathname;
const ROOT = new URL('../..', import.meta.url).pathname;

/** Children of a process (by ppid), with their command lines. */
function childrenOf(pid: number): { pid: number; args: string }[] {
  const out: { pid: number; args: string }[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push({ pid: Number(d), args: readFileSync(`/proc/${d}/cmdline`, 'utf8') });
    } catch {
      // gone
    }
  }
  return out;
}

/** The serving processes' per-thread CPU at one moment (null: the process is gone). */
type Snapshot = Map<number, Map<number, number> | null>;

const snapshot = (pids: readonly number[]): Snapshot => new Map(pids.map((p) => [p, threadCpu(p)]));

/** CPU split of the serving processes over an interval. */
export interface CpuSplit {
  /** llama.cpp's threads of the engine hosts (llama_decode and sampling on libuv's pool). */
  engineMs: number;
  /** Everything else of serve, worker and hosts: serveMs + workerMs + hostMainMs + hostOtherMs. */
  switchyardMs: number;
  serveMs: number;
  workerMs: number;
  /** The hosts' main threads. */
  hostMainMs: number;
  /** The hosts' other threads (V8's garbage collection and compiler helpers, the loader thread). */
  hostOtherMs: number;
  /** Engine hosts that exited during the interval (a replica failed and was replaced): the split misses them. */
  hostsGone: number;
  /** The pool threads found in each host, with their ms, and the busiest other thread (see thread-cpu.ts). */
  pools: { pid: number; threads: { tid: number; ms: number }[]; otherMaxMs: number }[];
}

function cpuSplit(serve: number, worker: number, hosts: readonly number[], a: Snapshot, b: Snapshot): CpuSplit {
  const of = (pid: number): Map<number, number> | null => {
    const x = a.get(pid);
    const y = b.get(pid);
    return x && y ? threadDelta(x, y) : null;
  };
  const split: CpuSplit = {
    ...{ engineMs: 0, switchyardMs: 0, serveMs: totalMs(of(serve) ?? new Map()) },
    ...{ workerMs: totalMs(of(worker) ?? new Map()), hostMainMs: 0, hostOtherMs: 0, hostsGone: 0, pools: [] },
  };
  for (const pid of hosts) {
    const d = of(pid);
    if (!d) {
      split.hostsGone++;
      continue;
    }
    const s = splitEngineThreads(pid, d, poolSize(pid));
    split.engineMs += s.engineMs;
    split.hostMainMs += s.mainMs;
    split.hostOtherMs += s.otherMs;
    split.pools.push({ pid, threads: s.pool, otherMaxMs: s.otherMaxMs });
  }
  split.switchyardMs = split.serveMs + split.workerMs + split.hostMainMs + split.hostOtherMs;
  return split;
}

/** Steps the control plane has executed (the count of its batch-size histogram), from /metrics. */
async function stepsOf(url: string, model: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^switchyard_batch_size_count\\{model="${model}"\\} (\\d+)`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

/** The engine hosts' own measurements over a run (their HostStats, summed over the hosts, run minus before): steps,
 * the engine's time in them, and its idle time from a step's return to the next dispatch while the core had runnable
 * work (actors/engine/llama-executor.ts). */
export interface EngineStats {
  steps: number;
  busyMs: number;
  idleMs: number;
  idleGaps: number;
}

/** The stats files the hosts wrote to `dir` (ENGINE_STATS_DIR_ENV), by pid. */
function readEngineStats(dir: string): Map<number, HostStatsFile> {
  const out = new Map<number, HostStatsFile>();
  for (const f of readdirSync(dir)) {
    if (!/^engine-stats-\d+\.json$/.test(f)) continue;
    try {
      const s = JSON.parse(readFileSync(join(dir, f), 'utf8')) as HostStatsFile;
      out.set(s.pid, s);
    } catch {
      // being replaced
    }
  }
  return out;
}

/** The hosts' stats after minus before, summed. */
function engineStatsDelta(before: Map<number, HostStatsFile>, after: Map<number, HostStatsFile>): EngineStats {
  const d: EngineStats = { steps: 0, busyMs: 0, idleMs: 0, idleGaps: 0 };
  for (const [pid, a] of after) {
    const b = before.get(pid);
    d.steps += a.steps - (b?.steps ?? 0);
    d.busyMs += a.busyMs - (b?.busyMs ?? 0);
    d.idleMs += a.idleMs - (b?.idleMs ?? 0);
    d.idleGaps += a.idleGaps - (b?.idleGaps ?? 0);
  }
  return d;
}

/** What a served run adds to a ServeRun: the CPU split over the run, the steps, and the processes' idle CPU. */
export interface ServedRun extends ServeRun {
  cpu: CpuSplit;
  /** Steps executed during the run. */
  steps: number;
  /** The engine hosts' measurements over the run (their step count agrees with `steps` when every host wrote its
   * stats after the run's last step). */
  engine: EngineStats;
  /** CPU ms per second of serve, worker and the hosts' non-pool threads while nothing was served (before the run). */
  idle: { serveMsPerS: number; workerMsPerS: number; hostMsPerS: number };
  /** Requests that did not end well (rejected, failed), by code. */
  failures: Record<string, number>;
  /** Submissions refused as overloaded and retried. */
  retries: number;
}

/** A FIFO gate letting at most `n` holders in at once. */
function createGate(n: number): { enter(): Promise<void>; leave(): void } {
  let inside = 0;
  const waiting: (() => void)[] = [];
  return {
    enter: () => {
      if (inside < n) {
        inside++;
        return Promise.resolve();
      }
      return new Promise<void>((resolve) => waiting.push(resolve));
    },
    leave: () => {
      const next = waiting.shift();
      if (next) next();
      else inside--;
    },
  };
}

/** How long the processes' idle CPU is measured before the run, ms. */
const IDLE_MS = 2_000;

/** Most retries of one request refused as overloaded. */
const MAX_RETRIES = 10_000;

/**
 * The wait before retry `attempt` (0 first) of a request refused as overloaded: the server's retryAfterMs, but at
 * least an exponential backoff from 10 ms (doubling, to 1 s) with full jitter, as a well-behaved API client does.
 * The server's advice is one sequence's expected wait for KV; with hundreds of clients refused at once, honouring it
 * alone (10 ms floor) sent 71,870 retries in a 300-request run, and the control plane spent its time refusing them.
 */
function retryDelayMs(attempt: number, retryAfterMs: number | undefined, rng: Rng): number {
  const backoff = Math.min(1000, 10 * 2 ** Math.min(attempt, 7));
  return Math.min(1000, Math.max(retryAfterMs ?? 0, backoff * (0.5 + 0.5 * rng.next())));
}

/** Prompt token ids of the bench (BOS, then printable bytes) as the text the byte-level tokenizer reads back. */
const promptText = (prompt: readonly number[]): string => String.fromCharCode(...prompt.slice(1));

/**
 * Starts `switchyard serve --config configFile`, waits until `model` is ready, then submits each request over
 * /v1/ws at its arrival time (wall clock, from the first submit) and records when each of its tokens arrived.
 */
export async function serveThroughSwitchyard(
  configFile: string,
  model: string,
  reqs: readonly BenchRequest[],
  maxInFlight = Infinity,
): Promise<ServedRun> {
  // The hosts write their engine stats here whenever their core runs out of work (see ENGINE_STATS_DIR_ENV).
  const statsDir = mkdtempSync(join(tmpdir(), 'switchyard-engine-stats-'));
  const proc = spawn(
    process.execPath,
    [...cpuProfileArgs(), '--import', 'tsx', BIN, 'serve', '--config', configFile, '--port', '0'],
    {
      cwd: ROOT,
      env: { ...process.env, [ENGINE_STATS_DIR_ENV]: statsDir },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let log = '';
  proc.stdout.on('data', (d: Buffer) => (log += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (log += d.toString()));
  try {
    return await drive(proc.pid!, () => log, model, reqs, maxInFlight, statsDir);
  } finally {
    proc.kill('SIGTERM');
    await new Promise<void>((r) => (proc.exitCode !== null ? r() : proc.once('exit', () => r())));
    rmSync(statsDir, { recursive: true, force: true });
  }
}

async function waitFor<T>(what: string, get: () => T | undefined | Promise<T | undefined>, ms = 180_000): Promise<T> {
  const end = performance.now() + ms;
  for (;;) {
    const v = await get();
    if (v !== undefined) return v;
    if (performance.now() > end) throw new Error(`bench: ${what} did not happen within ${ms} ms`);
    await sleep(200);
  }
}

async function drive(
  servePid: number,
  log: () => string,
  model: string,
  reqs: readonly BenchRequest[],
  maxInFlight: number,
  statsDir: string,
): Promise<ServedRun> {
  const url = await waitFor('serve printing its URL', () => /http:\/\/127\.0\.0\.1:\d+/.exec(log())?.[0]);
  await waitFor('readiness', async () => {
    const r = await fetch(`${url}/readyz`).catch(() => undefined);
    return r?.status === 200 ? true : undefined;
  });
  const workerPid = await waitFor('the worker process', () => {
    const m = /worker +started, pid (\d+)/.exec(log());
    return m ? Number(m[1]) : undefined;
  });
  const hostPids = childrenOf(workerPid)
    .filter((c) => c.args.includes('host.ts'))
    .map((c) => c.pid);
  if (hostPids.length === 0) throw new Error('bench: the worker runs no engine host');
  const client = await connectClient(url);
  const pids = [servePid, workerPid, ...hostPids];
  const idle0 = snapshot(pids);
  await sleep(IDLE_MS);
  const idleSplit = cpuSplit(servePid, workerPid, hostPids, idle0, snapshot(pids));
  const perS = (ms: number): number => (ms / IDLE_MS) * 1e3;
  const idle = {
    serveMsPerS: perS(idleSplit.serveMs),
    workerMsPerS: perS(idleSplit.workerMs),
    hostMsPerS: perS(idleSplit.hostMainMs + idleSplit.hostOtherMs),
  };
  const timings: RequestTiming[] = reqs.map((r) => ({ arrival: r.t, tokens: [], eos: false }));
  const rng = createRng(1).fork('retry');
  const failures: Record<string, number> = {};
  let retries = 0;
  const steps0 = await stepsOf(url, model);
  const engine0 = readEngineStats(statsDir);
  const cpu0 = snapshot(pids);
  const wall0 = performance.now();
  const now = (): number => performance.now() - wall0;
  // At most maxInFlight requests at the server; later arrivals wait here in arrival order, as the engine alone's
  // driver holds a request until one of its sequences is free.
  const gate = createGate(maxInFlight);
  const runs = reqs.map(async (r, i) => {
    await sleep(Math.max(0, r.t - now()));
    await gate.enter();
    try {
      await serveOne(r, i);
    } finally {
      gate.leave();
    }
  });
  const serveOne = async (r: BenchRequest, i: number): Promise<void> => {
    const timing = timings[i]!;
    // Refused as overloaded (no replica has KV headroom yet): the client retries after the advised wait, as a
    // client of the API would; the request's TTFT still counts from its arrival.
    for (let attempt = 0; ; attempt++) {
      const st = client.stream({ model, prompt: promptText(r.prompt), maxTokens: r.outputTokens, temperature: 0 });
      try {
        for await (const chunk of st) for (let k = 0; k < chunk.n; k++) timing.tokens.push(now());
      } catch {
        // the terminal outcome is read from st.result below
      }
      const res = await st.result;
      if (res.ok) {
        if (res.finishReason === 'stop' || timing.tokens.length < r.outputTokens) timing.eos = true;
        return;
      }
      if (res.error.code !== 'overloaded' || timing.tokens.length > 0 || attempt >= MAX_RETRIES) {
        failures[res.error.code] = (failures[res.error.code] ?? 0) + 1;
        return;
      }
      retries++;
      await sleep(retryDelayMs(attempt, res.error.retryAfterMs, rng));
    }
  };
  await Promise.all(runs);
  const wallS = (performance.now() - wall0) / 1e3;
  const cpu = cpuSplit(servePid, workerPid, hostPids, cpu0, snapshot(pids));
  const steps = (await stepsOf(url, model)) - steps0;
  // The hosts wrote their stats when their core ran out of work, which the last report said: at most a moment ago.
  const engine = await waitFor(
    "the engine hosts' stats of the run",
    () => {
      const d = engineStatsDelta(engine0, readEngineStats(statsDir));
      return d.steps >= steps ? d : undefined;
    },
    10_000,
  ).catch(() => engineStatsDelta(engine0, readEngineStats(statsDir)));
  client.close();
  return {
    side: 'switchyard served',
    clock: 'wall',
    timings,
    wallS,
    cpuS: (cpu.engineMs + cpu.switchyardMs) / 1e3,
    batchTokens: 0,
    cpu,
    steps,
    engine,
    idle,
    failures,
    retries,
  };
}
