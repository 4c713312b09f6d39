// Per-thread CPU time of processes, from /proc, and the split of an engine process into llama.cpp's threads and the
// rest: what the engine benchmarks call the engine's CPU and switchyard's.
//
// Which threads are llama.cpp's. node-llama-cpp runs llama_decode and sampling as async work on libuv's thread pool
// (one CPU thread per engine here: ggml computes on the calling pool thread). A Node process's other threads are
// its main thread (JavaScript: switchyard's and node-llama-cpp's), V8's platform workers (garbage collection and
// compilation for that JavaScript) and a loader thread (tsx). Node 20 names them all "node", so the pool is told by
// how libuv makes it: all of its threads at once, on first use, so they are adjacent in creation order (thread ids
// rise). The pool is the run of `UV_THREADPOOL_SIZE` (default 4) adjacent non-main threads that used the most CPU;
// every other thread counts as overhead. The threads are reported, so the split can be checked.
import { readdirSync, readFileSync } from 'node:fs';

/** Clock ticks per second of /proc/<pid>/stat (USER_HZ; 100 on Linux). */
const HZ = 100;

/** CPU time of one thread, ms: schedstat's run time (ns) where the kernel keeps it, else utime + stime (ticks). */
function taskCpuMs(pid: number, tid: string): number {
  try {
    return Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
  } catch {
    const s = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) / HZ) * 1e3;
  }
}

/** CPU ms of each thread of a process by thread id, or null when the process is gone. */
export function threadCpu(pid: number): Map<number, number> | null {
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return null;
  }
  const out = new Map<number, number>();
  for (const tid of tids) {
    try {
      out.set(Number(tid), taskCpuMs(pid, tid));
    } catch {
      // the thread exited
    }
  }
  return out;
}

/** CPU ms each thread used between two readings (a thread born since counts from zero). */
export function threadDelta(before: Map<number, number>, after: Map<number, number>): Map<number, number> {
  const out = new Map<number, number>();
  for (const [tid, ms] of after) out.set(tid, ms - (before.get(tid) ?? 0));
  return out;
}

/** Total CPU ms of a thread map. */
export const totalMs = (m: ReadonlyMap<number, number>): number => [...m.values()].reduce((a, b) => a + b, 0);

/** libuv's thread-pool size of a process: UV_THREADPOOL_SIZE from its environment, else libuv's default (4). */
export function poolSize(pid: number): number {
  try {
    const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
    const v = env.find((e) => e.startsWith('UV_THREADPOOL_SIZE='));
    const n = v ? Number(v.slice('UV_THREADPOOL_SIZE='.length)) : 4;
    return Number.isInteger(n) && n > 0 ? Math.min(n, 1024) : 4;
  } catch {
    return 4;
  }
}

/** An engine process's CPU over a run: llama.cpp's threads (the pool), the main thread, and the other threads. */
export interface EngineThreadSplit {
  engineMs: number;
  mainMs: number;
  otherMs: number;
  /** The pool's thread ids and each one's ms, for the record. */
  pool: { tid: number; ms: number }[];
  /** The busiest thread outside the pool and the main thread, ms (a bound on what a wrong split could move). */
  otherMaxMs: number;
}

/** Splits one process's per-thread CPU over a run (`delta`) into llama.cpp's pool, its main thread and the rest. */
export function splitEngineThreads(pid: number, delta: ReadonlyMap<number, number>, size: number): EngineThreadSplit {
  const rest = [...delta].filter(([tid]) => tid !== pid).sort((a, b) => a[0] - b[0]);
  let best = 0;
  let bestMs = -1;
  for (let i = 0; i + Math.min(size, rest.length) <= rest.length; i++) {
    const ms = rest.slice(i, i + size).reduce((a, [, v]) => a + v, 0);
    if (ms > bestMs) {
      bestMs = ms;
      best = i;
    }
  }
  const pool = rest.slice(best, best + size).map(([tid, ms]) => ({ tid, ms }));
  const inPool = new Set(pool.map((p) => p.tid));
  const others = rest.filter(([tid]) => !inPool.has(tid)).map(([, ms]) => ms);
  return {
    engineMs: pool.reduce((a, p) => a + p.ms, 0),
    mainMs: delta.get(pid) ?? 0,
    otherMs: others.reduce((a, b) => a + b, 0),
    pool,
    otherMaxMs: others.length > 0 ? Math.max(...others) : 0,
  };
}
