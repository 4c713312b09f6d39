// The worker's side of an engine host: spawns the child on exactly the replica's GPUs and tracks its life.
//
// Life, as the GPU and replica machines see it: spawning, loading and opening the replica's engine core = `loading`;
// loaded, core open and a health probe answered = `ready`; drain() = `draining` (no new sequences; submitted ones run
// on); an exit that was not asked for, a crash, a load failure, a failure the host reports (its core or engine), an
// invalid message, a load/open/probe with no answer within its bound, or no report for progressTimeoutMs while it
// holds submitted sequences = `failed` (the child is killed so it frees everything); a requested unload that exits
// = `stopped`.
import { fork, type ChildProcess } from 'node:child_process';
import { statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { clearTimeout as clearNodeTimeout, setTimeout as setNodeTimeout } from 'node:timers';
import { EngineError, type EngineCapacity, type EngineFailure, type EngineLoadOptions } from './engine.ts';
import {
  decodeReportBody,
  ENGINE_STATS_DIR_ENV,
  parseHostMessage,
  REPORT_BODY_LIMITS,
  type HostCommand,
  type HostCoreSpec,
  type HostMessage,
  type HostReplyValue,
  type HostStats,
} from './host-protocol.ts';
import type { CoreReport, SubmitSeq } from '../../machines/core-messages.ts';
import { cpuProfileArgs } from '../../runtime/cpu-profile.ts';
import { scanMap } from '../../transport/codec.ts';
import { forwardedMessage } from '../../transport/forward.ts';
import { hostEnvironment } from './host-env.ts';

/** Where an engine host is in its life. */
export type HostState = 'loading' | 'ready' | 'draining' | 'failed' | 'stopped';

/** Reported on every change of state; `failure` says why when the host failed. */
export interface HostStateChanged {
  type: 'host.state_changed';
  host: string;
  from: HostState;
  to: HostState;
  failure?: EngineFailure;
}

/** The one-shot timers the client needs, injected so that tests and simulations can drive time. */
export interface HostTimers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

/** Real timers from node:timers. */
export const nodeHostTimers: HostTimers = {
  set: (fn, ms) => setNodeTimeout(fn, ms),
  clear: (h) => clearNodeTimeout(h as ReturnType<typeof setNodeTimeout>),
};

/** How to start a host: which model, on which GPUs, its engine core, and the bounds after which no progress means
 * failure. */
export interface EngineHostOptions {
  /** The replica's id, used in messages and events. */
  id: string;
  file: string;
  /** The replica's GPUs: the child sees exactly these (CUDA_VISIBLE_DEVICES); empty = none, CPU only. */
  gpus: readonly number[];
  load: EngineLoadOptions;
  /** The replica's engine core, opened in the host once the model is loaded (before `ready`); absent: the host only
   * loads (tokenize and probe answer, nothing runs). */
  core?: HostCoreSpec;
  /** Hears every report of the core (one per step): the host's bytes, checked by the codec's pre-scan and forwarded as
   * they are (transport/forward.ts); reading its fields decodes and validates them. */
  report?(r: CoreReport): void;
  timers?: HostTimers;
  loadTimeoutMs?: number;
  /** Longest time without a report while the host holds submitted sequences (ms). */
  progressTimeoutMs?: number;
  probeTimeoutMs?: number;
  /** Host entry script; defaults to host.ts next to this file. */
  entry?: string;
  /** Extra environment variables for the child, besides the allow-listed part of the worker's (host-env.ts);
   * CUDA_VISIBLE_DEVICES is always set from gpus. */
  env?: Readonly<Record<string, string>>;
}

/** A running engine host, driven by the worker. */
export interface EngineHost {
  readonly id: string;
  readonly pid: number | undefined;
  readonly state: HostState;
  /** The engine's cache as reported after load (and by each probe). */
  capacity(): EngineCapacity | undefined;
  /** The engine's measurements as of the latest report or probe. */
  stats(): HostStats | undefined;
  /** Listens to state changes; returns the unsubscribe function. */
  subscribe(listener: (event: HostStateChanged) => void): () => void;
  /** Settles once the host is ready (resolves) or has failed (rejects with the failure). */
  ready(): Promise<void>;
  tokenize(text: string): Promise<number[]>;
  /** Hands sequences to the core; refused (EngineError) unless the host is ready. */
  submit(seqs: readonly SubmitSeq[]): void;
  /** Takes sequences out of the core (they leave with no event); answers how many it held. */
  cancel(ids: readonly string[]): number;
  /** Cancels every sequence the host holds; answers how many. */
  cancelAll(): number;
  /** Health probe: the host answers with its capacity within probeTimeoutMs, or is failed. */
  probe(): Promise<EngineCapacity>;
  /** Stops admitting new sequences. */
  drain(): void;
  /** Unloads the model and waits for the process to exit. */
  unload(): Promise<void>;
  /** Kills the process at once (SIGKILL); the host becomes failed. */
  kill(): void;
}

const STDERR_TAIL = 2048;
/** How long a profiled host gets to write its CPU profile after a kill before it is killed outright (ms). */
const PROFILE_EXIT_GRACE_MS = 2_000;
const DEFAULTS = { progressTimeoutMs: 30_000, probeTimeoutMs: 10_000 };

/** How long loading a model file of `bytes` may take before the host counts as failed: two minutes for starting
 * node and llama.cpp, plus 30 s per GiB (a 40 GB file read at ~35 MB/s and copied to the GPUs); the file's size
 * when it cannot be read is taken as 0 (the host then fails fast on the file itself). */
export function loadBoundMs(bytes: number): number {
  return 120_000 + Math.ceil((Math.max(0, bytes) / 2 ** 30) * 30_000);
}

/** The load bound of the model file at `file` (loadBoundMs of its size). */
export function loadBoundOfFile(file: string): number {
  try {
    return loadBoundMs(statSync(file).size);
  } catch {
    return loadBoundMs(0);
  }
}

const tsxLoader = (): string => pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
const defaultEntry = (): string => fileURLToPath(new URL('./host.ts', import.meta.url));

interface Pending {
  resolve: (v: HostReplyValue) => void;
  reject: (e: EngineError) => void;
  timer: unknown;
}

/** The life of one host as its client sees it: the state, its listeners, the ready promise, pending commands. */
interface HostLife {
  readonly state: HostState;
  readonly pending: Map<number, Pending>;
  readonly ready: Promise<void>;
  /** Moves to `to` unless already there or ended; ending rejects the ready promise and every pending command. */
  moveTo(to: HostState, failure?: EngineFailure): void;
  subscribe(listener: (event: HostStateChanged) => void): () => void;
}

function createHostLife(id: string, timers: HostTimers): HostLife {
  let state: HostState = 'loading';
  const pending = new Map<number, Pending>();
  const listeners = new Set<(e: HostStateChanged) => void>();
  let settleReady: { resolve: () => void; reject: (e: EngineError) => void } | undefined;
  const ready = new Promise<void>((resolve, reject) => (settleReady = { resolve, reject }));
  ready.catch(() => undefined); // a host nobody waits on may fail without an unhandled rejection
  const moveTo = (to: HostState, failure?: EngineFailure): void => {
    if (state === to || state === 'failed' || state === 'stopped') return;
    const from = state;
    state = to;
    if (to === 'ready') settleReady?.resolve();
    if (to === 'failed' || to === 'stopped') {
      const err = new EngineError(
        failure?.code ?? 'engine_failed',
        failure?.message ?? `engine host ${id} stopped`,
        true,
      );
      settleReady?.reject(err);
      for (const [n, p] of pending) {
        timers.clear(p.timer);
        p.reject(err);
        pending.delete(n);
      }
    }
    const event: HostStateChanged = { type: 'host.state_changed', host: id, from, to };
    if (failure) event.failure = failure;
    for (const l of listeners) l(event);
  };
  return {
    get state() {
      return state;
    },
    pending,
    ready,
    moveTo,
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}

/** The variables that show a host exactly its replica's devices, for each GPU runtime llama.cpp's builds use
 * (CUDA, Vulkan, ROCm/HIP); they override whatever the worker's environment said. */
export function visibleDevices(gpus: readonly number[]): Record<string, string> {
  const list = gpus.join(',');
  return { CUDA_VISIBLE_DEVICES: list, GGML_VK_VISIBLE_DEVICES: list, HIP_VISIBLE_DEVICES: list };
}

/** The benchmarks' stats folder (ENGINE_STATS_DIR_ENV), passed on to the host when the worker has one. */
function statsDirEnv(): Record<string, string> {
  const dir = process.env[ENGINE_STATS_DIR_ENV];
  return dir ? { [ENGINE_STATS_DIR_ENV]: dir } : {};
}

/** Forks the host script on exactly the given GPUs; `stderrTail()` is the last bytes it wrote to stderr. */
function forkHost(opts: EngineHostOptions): { child: ChildProcess; stderrTail: () => string } {
  let tail = '';
  const child: ChildProcess = fork(opts.entry ?? defaultEntry(), [], {
    execArgv: [...cpuProfileArgs(), '--import', tsxLoader()],
    // One libuv pool thread: node-llama-cpp queues a step's decode and then each sequence's sampling there, and one
    // thread runs them back to back instead of waking idle threads for each (a wake-up per item, on both sides).
    // An allow-list of the worker's environment: the worker token and any other secret stay with the worker.
    env: {
      ...hostEnvironment(process.env),
      UV_THREADPOOL_SIZE: '1',
      ...statsDirEnv(),
      ...opts.env,
      ...visibleDevices(opts.gpus),
    },
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    serialization: 'json',
  });
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    tail = (tail + chunk).slice(-STDERR_TAIL);
  });
  return { child, stderrTail: () => tail };
}

/** The sequences a host holds as its client knows them, and the bound on its progress while it holds any: armed at
 * the first submit, re-armed by every report, disarmed once nothing is held. */
interface ProgressWatch {
  readonly held: Set<string>;
  submitted(seqs: readonly SubmitSeq[]): void;
  /** A report (what it finished, the submits its core has seen and what it still holds): finished sequences leave; a
   * report of an idle core that has seen every submit clears the rest. */
  reported(finished: readonly string[], received: number, pending: number): void;
  cancelled(ids: readonly string[]): number;
  stop(): void;
}

function createProgressWatch(timers: HostTimers, boundMs: number, hung: (held: number) => void): ProgressWatch {
  const held = new Set<string>();
  let sent = 0;
  let timer: unknown;
  let stopped = false;
  const disarm = (): void => {
    if (timer !== undefined) timers.clear(timer);
    timer = undefined;
  };
  const arm = (): void => {
    if (stopped || held.size === 0 || timer !== undefined) return;
    timer = timers.set(() => {
      timer = undefined;
      hung(held.size);
    }, boundMs);
  };
  return {
    held,
    submitted: (seqs) => {
      for (const s of seqs) held.add(s.id);
      sent += seqs.length;
      arm();
    },
    reported: (finished, received, pending) => {
      for (const id of finished) held.delete(id);
      if (received === sent && pending === 0) held.clear();
      disarm();
      arm();
    },
    cancelled: (ids) => {
      let n = 0;
      for (const id of ids) if (held.delete(id)) n++;
      if (held.size === 0) disarm();
      return n;
    },
    stop: () => {
      stopped = true;
      disarm();
    },
  };
}

/** A report body (base64) checked by the codec's pre-scan, as a forwarded report: its bytes go on as they came, and
 * they are decoded (and validated) only if something in this process reads them. Or why it was refused. */
function forwardedReport(base64: string): CoreReport | string {
  const body = Buffer.from(base64, 'base64');
  const scanned = scanMap(body, REPORT_BODY_LIMITS);
  if (!scanned.ok) return `${scanned.error.code}: ${scanned.error.message}`;
  return forwardedMessage<CoreReport>({}, scanned.value, () => decodeReportBody(body));
}

/** Spawns an engine host child process, starts loading its model and opens its core; watch it with subscribe() or
 * ready(). */
export function spawnEngineHost(opts: EngineHostOptions): EngineHost {
  const timers = opts.timers ?? nodeHostTimers;
  const bounds = { ...DEFAULTS, ...opts, loadTimeoutMs: opts.loadTimeoutMs ?? loadBoundOfFile(opts.file) };
  const life = createHostLife(opts.id, timers);
  const { pending, moveTo } = life;
  let capacity: EngineCapacity | undefined;
  let stats: HostStats | undefined;
  let unloadRequested = false;
  let nextId = 1;
  let settleExit: () => void = () => undefined;
  const exited = new Promise<void>((resolve) => (settleExit = resolve));
  const { child, stderrTail } = forkHost(opts);
  const profiling = cpuProfileArgs().length > 0;

  const failWith = (message: string, code: EngineFailure['code'] = 'engine_failed'): void => {
    const tail = stderrTail().trim() ? `; stderr: ${stderrTail().trim().slice(-512)}` : '';
    watch.stop();
    moveTo('failed', {
      code,
      message: `engine host ${opts.id}: ${message}${tail}`,
      retryable: code === 'engine_failed',
    });
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  };
  const watch = createProgressWatch(timers, bounds.progressTimeoutMs, (held) =>
    failWith(`made no progress within ${bounds.progressTimeoutMs} ms while holding ${held} sequences`),
  );

  const command = (cmd: HostCommand, timeoutMs: number, what: string): Promise<HostReplyValue> => {
    const state = life.state;
    if (state === 'failed' || state === 'stopped') {
      return Promise.reject(new EngineError('engine_failed', `engine host ${opts.id} is ${state}`, true));
    }
    const id = 'id' in cmd ? cmd.id : 0;
    return new Promise<HostReplyValue>((resolve, reject) => {
      const timer = timers.set(() => failWith(`${what} made no progress within ${timeoutMs} ms`), timeoutMs);
      pending.set(id, { resolve, reject, timer });
      child.send(cmd);
    });
  };
  const send = (cmd: HostCommand): boolean => child.connected && child.send(cmd);

  const probe = async (): Promise<EngineCapacity> => {
    const v = await command({ v: 2, type: 'probe', id: nextId++ }, bounds.probeTimeoutMs, 'health probe');
    const answer = v as Extract<HostReplyValue, { kind: 'probe' }>;
    stats = answer.stats;
    return answer.capacity;
  };
  /** Loaded: the core opens (its limits checked against the engine's cache), then the health probe says ready. */
  const opened = async (): Promise<void> => {
    if (opts.core) {
      await command({ v: 2, type: 'open', id: nextId++, core: opts.core }, bounds.probeTimeoutMs, 'open');
    }
    await probe();
    moveTo('ready');
  };

  const onMessage = (raw: unknown): void => {
    const parsed = parseHostMessage(raw);
    if (!parsed.ok) return failWith(`sent an invalid message: ${parsed.error}`);
    const msg: HostMessage = parsed.msg;
    if (msg.type === 'progress') {
      const report = forwardedReport(msg.body);
      if (typeof report === 'string') return failWith(`sent an invalid report: ${report}`);
      stats = msg.stats;
      watch.reported(msg.finished, msg.received, msg.pending);
      opts.report?.(report);
    } else if (msg.type === 'loaded') {
      timers.clear(loadTimer);
      capacity = msg.capacity;
      opened().catch((err: EngineError) => {
        // A refused open (limits beyond the cache) fails the host; a host that failed already said why.
        if (life.state === 'loading') failWith(err.message, err.code);
      });
    } else if (msg.type === 'load_failed' || msg.type === 'failed') {
      timers.clear(loadTimer);
      failWith(msg.failure.message, msg.failure.code);
    } else if (msg.type === 'reply') {
      const p = pending.get(msg.id);
      if (!p) return failWith(`answered unknown command ${msg.id}`);
      pending.delete(msg.id);
      timers.clear(p.timer);
      if (msg.ok) p.resolve(msg.value);
      else p.reject(new EngineError(msg.failure.code, msg.failure.message, msg.failure.retryable));
    }
  };

  child.on('message', onMessage);
  child.on('error', (err) => failWith(`process error: ${err.message}`));
  child.on('exit', (code, signal) => {
    timers.clear(loadTimer);
    watch.stop();
    if (unloadRequested && code === 0) moveTo('stopped');
    else failWith(`process exited (${signal ? `signal ${signal}` : `code ${code}`})`);
    settleExit();
  });

  const loadTimer = timers.set(
    () => failWith(`load made no progress within ${bounds.loadTimeoutMs} ms`),
    bounds.loadTimeoutMs,
  );
  child.send({ v: 2, type: 'load', file: opts.file, options: opts.load } satisfies HostCommand);

  const submit = (seqs: readonly SubmitSeq[]): void => {
    const state = life.state;
    if (state !== 'ready') {
      const code = state === 'loading' ? 'not_loaded' : state === 'draining' ? 'invalid_request' : 'engine_failed';
      throw new EngineError(code, `engine host ${opts.id} is ${state}: no new sequences`, state !== 'draining');
    }
    if (seqs.length === 0) return;
    watch.submitted(seqs);
    send({ v: 2, type: 'submit', seqs: seqs as SubmitSeq[] });
  };
  const cancel = (ids: readonly string[]): number => {
    const n = watch.cancelled(ids);
    if (ids.length > 0) send({ v: 2, type: 'cancel', ids: ids as string[] });
    return n;
  };

  return {
    id: opts.id,
    get pid() {
      return child.pid;
    },
    get state() {
      return life.state;
    },
    capacity: () => capacity,
    stats: () => stats,
    subscribe: life.subscribe,
    ready: () => life.ready,
    tokenize: async (text) => {
      const v = await command({ v: 2, type: 'tokenize', id: nextId++, text }, bounds.probeTimeoutMs, 'tokenize');
      return (v as Extract<HostReplyValue, { kind: 'tokenize' }>).tokens;
    },
    submit,
    cancel,
    cancelAll: () => cancel([...watch.held]),
    probe,
    drain: () => {
      if (life.state === 'ready') moveTo('draining');
    },
    unload: async () => {
      if (life.state !== 'failed' && life.state !== 'stopped') {
        unloadRequested = true;
        send({ v: 2, type: 'unload' });
      }
      await exited;
    },
    kill: () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      if (!profiling) return void child.kill('SIGKILL');
      // Profiling (diagnosis only): a SIGTERM lets the host exit by itself and write its CPU profile; SIGKILL follows
      // if it has not exited within the grace (an unref'd timer: a worker that is leaving does not wait for it).
      child.kill('SIGTERM');
      setNodeTimeout(() => {
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      }, PROFILE_EXIT_GRACE_MS).unref();
    },
  };
}
