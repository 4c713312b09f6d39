// Serving a request stream through the real path: `switchyard serve` (control plane) → its worker process → one
// engine host process per replica, driven by a /v1/ws client in this process. Timings are the client's wall clock
// (when each token chunk arrived); CPU time is read per process and per thread from /proc, so switchyard's own share
// can be told from the engine's on a shared machine.
//
// The engine's CPU is the engine host's threads other than its main thread: node-llama-cpp runs llama_decode (and
// sampling) on libuv's thread pool; V8's helper threads (garbage collection) count there too, as Node 20 names every
// thread "node". Everything else — the control plane and the worker (all their threads) and the host's main thread
// (IPC, plan checks, text streams) — is switchyard's overhead.
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { connectClient } from '../../api/client.ts';
import type { BenchRequest, RequestTiming, ServeRun } from './engine-serve.ts';

const BIN = new URL('../../bin/switchyard.ts', import.meta.url).pathname;
const ROOT = new URL('../..', import.meta.url).pathname;
/** Clock ticks per second of /proc/<pid>/stat (USER_HZ; 100 on Linux). */
const HZ = 100;

/** CPU ms of one thread or process from its stat line (utime + stime). */
const statCpuMs = (path: string): number => {
  const s = readFileSync(path, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return ((Number(f[11]) + Number(f[12])) / HZ) * 1e3;
};

/** Per-thread CPU ms of a process, keyed by thread name (comm) and id. */
function threadsCpu(pid: number): { name: string; tid: string; ms: number }[] | null {
  const out: { name: string; tid: string; ms: number }[] = [];
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return null; // the process is gone
  }
  for (const tid of tids) {
    try {
      const name = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
      out.push({ name, tid, ms: statCpuMs(`/proc/${pid}/task/${tid}/stat`) });
    } catch {
      // the thread exited
    }
  }
  return out;
}

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

/** CPU split of the serving processes at one moment. */
interface CpuSnapshot {
  /** The engine hosts' threads but the main one (llama_decode on libuv's pool). */
  engineMs: number;
  /** Everything else of serve, worker and hosts. */
  switchyardMs: number;
  /** Engine hosts that had exited (a replica failed and was replaced): the split misses their CPU. */
  hostsGone: number;
  /** The overhead's parts: the control plane, the worker, the hosts' main threads. */
  serveMs: number;
  workerMs: number;
  hostMainMs: number;
}

function cpuSnapshot(servePid: number, workerPid: number, hostPids: readonly number[]): CpuSnapshot {
  let engineMs = 0;
  let hostsGone = 0;
  const serveMs = statCpuMs(`/proc/${servePid}/stat`);
  const workerMs = statCpuMs(`/proc/${workerPid}/stat`);
  let hostMainMs = 0;
  for (const pid of hostPids) {
    const threads = threadsCpu(pid);
    if (!threads) hostsGone++;
    for (const t of threads ?? []) {
      if (t.tid !== String(pid)) engineMs += t.ms;
      else hostMainMs += t.ms;
    }
  }
  return { engineMs, switchyardMs: serveMs + workerMs + hostMainMs, hostsGone, serveMs, workerMs, hostMainMs };
}

/** What a served run adds to a ServeRun: the CPU split over the run. */
export interface ServedRun extends ServeRun {
  cpu: Omit<CpuSnapshot, 'hostsGone'> & { hostsGone: number };
  /** Requests that did not end well (rejected, failed), by code. */
  failures: Record<string, number>;
  /** Submissions refused as overloaded and retried. */
  retries: number;
}

/** Most retries of one request refused as overloaded. */
const MAX_RETRIES = 10_000;

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
): Promise<ServedRun> {
  const proc = spawn(process.execPath, ['--import', 'tsx', BIN, 'serve', '--config', configFile, '--port', '0'], {
    cwd: ROOT,
    env: { ...process.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  proc.stdout.on('data', (d: Buffer) => (log += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (log += d.toString()));
  try {
    return await drive(proc.pid!, () => log, model, reqs);
  } finally {
    proc.kill('SIGTERM');
    await new Promise<void>((r) => (proc.exitCode !== null ? r() : proc.once('exit', () => r())));
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
  const timings: RequestTiming[] = reqs.map((r) => ({ arrival: r.t, tokens: [], eos: false }));
  const failures: Record<string, number> = {};
  let retries = 0;
  const cpu0 = cpuSnapshot(servePid, workerPid, hostPids);
  const wall0 = performance.now();
  const now = (): number => performance.now() - wall0;
  const runs = reqs.map(async (r, i) => {
    await sleep(Math.max(0, r.t - now()));
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
      await sleep(Math.min(1000, Math.max(10, res.error.retryAfterMs ?? 50)));
    }
  });
  await Promise.all(runs);
  const wallS = (performance.now() - wall0) / 1e3;
  const cpu1 = cpuSnapshot(servePid, workerPid, hostPids);
  client.close();
  const cpu = {
    engineMs: cpu1.engineMs - cpu0.engineMs,
    switchyardMs: cpu1.switchyardMs - cpu0.switchyardMs,
    hostsGone: cpu1.hostsGone,
    serveMs: cpu1.serveMs - cpu0.serveMs,
    workerMs: cpu1.workerMs - cpu0.workerMs,
    hostMainMs: cpu1.hostMainMs - cpu0.hostMainMs,
  };
  return {
    side: 'switchyard served',
    clock: 'wall',
    timings,
    wallS,
    cpuS: (cpu.engineMs + cpu.switchyardMs) / 1e3,
    batchTokens: 0,
    cpu,
    failures,
    retries,
  };
}
