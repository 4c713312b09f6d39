// The worker's engine hosts: one llama.cpp host process per engine replica, over all of the replica's GPUs, running
// the replica's engine core beside its engine.
//
// A replica's `gpu.assign`s are collected until every rank has one (the TP-8 replica is one host over eight GPUs);
// then its host is spawned with the assignment's engine and core. Its life reaches the GPU actors through the
// callbacks: ready = the GPUs are loaded, failed (exit, crash, no progress while it holds sequences) = the GPUs are
// fenced by the agent. A release, an unload or a fault of any of its GPUs kills the host on purpose (that is not
// reported as a failure). Sequences go to the host as they come (submit, cancel); its core's reports come back
// through `progress`, one per step. The worker keeps no tokens: the host's core holds its sequences.
import { CALIBRATED_PREFIX } from '../gpu/profile-cost-model.ts';
import type { EngineFailure } from '../engine/engine.ts';
import { nodeHostTimers, spawnEngineHost, type EngineHost, type EngineHostOptions } from '../engine/host-client.ts';
import type { HostCoreSpec, HostStats } from '../engine/host-protocol.ts';
import type { CoreReport, SubmitSeq } from '../../machines/core-messages.ts';
import type { MessageOf, WireCoreSpec, WireEngineSpec } from '../../machines/messages.ts';
import { defaultModelRoots, modelFileRefusal } from './model-roots.ts';
import { startUpstreamHost, type UpstreamHostOptions } from './upstream/adapter.ts';
import { dropAllParked, dropParkedOn } from './upstream/sleep.ts';
import { forwardedMessage, forwardedOf } from '../../transport/forward.ts';

type Assign = MessageOf<'gpu.assign'>;
/** The engine a `gpu.assign` names. */
export type EngineSpec = WireEngineSpec & Pick<EngineHostOptions['load'], 'gpu' | 'gpuLayers'>;

/** What the agent hears from its engine hosts. */
export interface EngineEvents {
  /** The host answered its health probe with its core open: the replica's GPUs are loaded. */
  ready(replica: string, epoch: number, gpus: readonly number[]): void;
  /** The host failed by itself (exit, crash, invalid message, no progress): fence the replica's GPUs. */
  failed(replica: string, epoch: number, gpus: readonly number[], failure: EngineFailure | undefined): void;
  /** A report of the replica's core (one per step): the agent sends it on as `seq.progress`. */
  progress(replica: string, epoch: number, report: CoreReport): void;
  log?(line: string): void;
}

/** A replica's report as its `seq.progress`. A host's report (forwarded: the bytes it encoded, scanned, not decoded)
 * stays forwarded, with the worker's type, replica and epoch written after its fields: the control plane reads those,
 * whatever the host wrote. */
export function progressMessage(replica: string, epoch: number, report: CoreReport): MessageOf<'seq.progress'> {
  const own = { type: 'seq.progress', replica, epoch } as const;
  const f = forwardedOf(report);
  if (!f) return { ...own, ...report };
  return forwardedMessage<MessageOf<'seq.progress'>>(own, f.map, () => ({ ...report }));
}

/** Options of the engine manager. */
export interface EngineManagerOptions extends EngineEvents {
  /** Starts a host (tests inject one); default spawnEngineHost. */
  spawn?(opts: EngineHostOptions): EngineHost;
  /** Bounds and timers passed to every host. */
  host?: Pick<EngineHostOptions, 'loadTimeoutMs' | 'progressTimeoutMs' | 'probeTimeoutMs' | 'timers'>;
  /** Time a host gets to unload before it is killed (ms). */
  unloadGraceMs?: number;
  /** Folders model files must be under (real paths compared); default defaultModelRoots(). */
  modelRoots?: readonly string[];
  /** Starts an `engine: openai` replica (tests inject one); default startUpstreamHost. */
  upstream?(opts: UpstreamHostOptions): EngineHost;
}

/** The engine hosts of one worker. */
export interface EngineManager {
  /** Records one rank's assignment (with its engine and core); spawns the host once every rank of (replica, epoch)
   * is assigned. */
  assign(m: Assign & { engine: EngineSpec }): void;
  /** True when `replica` is an engine replica with a host at `epoch`. */
  owns(replica: string, epoch?: number): boolean;
  /** Hands sequences to the replica's core; ignored unless its host is at `epoch` (a stale message). */
  submit(replica: string, epoch: number, seqs: readonly SubmitSeq[]): void;
  /** Takes sequences out of the replica's core (cancelled, expired): they leave with no event. */
  cancel(replica: string, epoch: number, ids: readonly string[]): void;
  /** Cancels every sequence of every host (their control plane is gone); answers how many. */
  cancelAll(): number;
  /** Unloads the replica's host (release): killed if it does not exit within the grace. */
  release(replica: string, epoch: number): void;
  /** A fault of GPU g: the host over it is killed at once. */
  gpuFault(g: number): void;
  /** The host process of a replica, for tests and views. */
  pid(replica: string): number | undefined;
  /** The replica's engine measurements (steps, busy and idle time) as of its latest report, for benchmarks. */
  stats(replica: string): HostStats | undefined;
  /** Kills every host (the worker is going away). */
  stopAll(): void;
}

/** One host and what the worker keeps beside it. */
interface Hosted {
  host: EngineHost;
  replica: string;
  epoch: number;
  gpus: number[];
  /** Killed or unloaded on purpose: its exit is not a failure. */
  ending: boolean;
}

/** The host's core spec from the assignment's, or why there is none: a llama.cpp replica assigned without one, or
 * one asking for dynamic batching (a generative engine does not), or on other GPUs than its ranks. */
function coreOf(m: Assign, gpus: readonly number[]): HostCoreSpec | string {
  const c: WireCoreSpec | undefined = m.core;
  if (!c) return `engine replica ${m.replica}@${m.epoch} was assigned without its core`;
  if (c.stateless) return `engine replica ${m.replica}@${m.epoch} is generative: no dynamic batching`;
  if (c.gpus.length !== gpus.length || c.gpus.some((g) => !gpus.includes(g))) {
    return `engine replica ${m.replica}@${m.epoch}: its core names GPUs ${c.gpus.join(',')}, assigned ${gpus.join(',')}`;
  }
  return {
    replica: m.replica,
    epoch: m.epoch,
    owner: c.owner,
    limits: c.limits,
    ...(c.check ? { check: true } : {}),
    ...(m.model.startsWith(CALIBRATED_PREFIX)
      ? { profile: m.model.slice(CALIBRATED_PREFIX.length, m.model.lastIndexOf('|')) }
      : {}),
  };
}

/** Creates the engine manager of a worker. */
export function createEngineManager(opts: EngineManagerOptions): EngineManager {
  const spawn = opts.spawn ?? spawnEngineHost;
  const log = opts.log ?? (() => undefined);
  // A worker runs on the wall clock: the hosts' own timers unless a test injects others.
  const timers = opts.host?.timers ?? nodeHostTimers;
  const hosts = new Map<string, Hosted>();
  const gathering = new Map<string, { epoch: number; gpus: Set<number> }>();

  const roots = opts.modelRoots ?? defaultModelRoots();

  const start = (m: Assign & { engine: EngineSpec }, gpus: number[]): void => {
    const e = m.engine;
    // The control plane names the file; nothing outside the worker's model roots is opened: the load fails, typed.
    const refused = modelFileRefusal(e.file, roots);
    if (refused) {
      log(`engine host ${m.replica}@${m.epoch} not started: ${refused.message}`);
      return opts.failed(m.replica, m.epoch, gpus, refused);
    }
    const core = coreOf(m, gpus);
    // Its calibrated profile is read by the host under the same rule as the model file.
    const profileRefused = typeof core !== 'string' && core.profile ? modelFileRefusal(core.profile, roots) : null;
    if (profileRefused) {
      const message = `its calibrated profile ${profileRefused.message.replace(/^model file /, '')}`;
      log(`engine host ${m.replica}@${m.epoch} not started: ${message}`);
      return opts.failed(m.replica, m.epoch, gpus, { ...profileRefused, message });
    }
    if (typeof core === 'string') {
      log(`engine host ${m.replica}@${m.epoch} not started: ${core}`);
      return opts.failed(m.replica, m.epoch, gpus, { code: 'invalid_request', message: core, retryable: false });
    }
    const { replica, epoch } = m;
    const report = (r: CoreReport): void => {
      if (hosts.get(replica) === h) opts.progress(replica, epoch, r);
    };
    // A model server that batches by itself (engine openai) stands where the engine host and its core would.
    const upstream = e.kind === 'openai' && e.upstream ? { ...e, upstream: e.upstream } : null;
    const host = upstream
      ? (opts.upstream ?? startUpstreamHost)({
          id: replica,
          epoch,
          engine: upstream,
          gpus,
          limits: core.limits,
          report,
          ...(opts.log ? { log: opts.log } : {}),
        })
      : spawn({
          ...opts.host,
          id: replica,
          file: e.file,
          gpus,
          load: {
            contextTokens: e.contextTokens,
            sequences: e.sequences,
            threads: e.threads,
            ...(e.batchTokens !== undefined ? { batchTokens: e.batchTokens } : {}),
            ...(e.gpu !== undefined ? { gpu: e.gpu } : {}),
            ...(e.gpuLayers !== undefined ? { gpuLayers: e.gpuLayers } : {}),
          },
          core,
          report,
        });
    const h: Hosted = { host, replica, epoch, gpus, ending: false };
    hosts.set(replica, h);
    log(`engine host ${replica}@${epoch} pid ${host.pid} on GPUs ${gpus.join(',')} loading ${e.file}`);
    host.subscribe((ev) => {
      if (hosts.get(replica) !== h) return;
      if (ev.to === 'ready') opts.ready(replica, epoch, gpus);
      if (ev.to === 'failed' || ev.to === 'stopped') {
        hosts.delete(replica);
        if (!h.ending) {
          log(`engine host ${replica}@${epoch} failed: ${ev.failure?.message ?? ev.to}`);
          opts.failed(replica, epoch, gpus, ev.failure);
        }
      }
    });
  };

  /** Ends a host on purpose: unload (graceful) or kill. */
  const end = (h: Hosted, graceful: boolean): void => {
    if (h.ending) return;
    h.ending = true;
    hosts.delete(h.replica);
    if (!graceful || h.host.state === 'loading') return h.host.kill();
    const timer = timers.set(() => h.host.kill(), opts.unloadGraceMs ?? 5_000);
    void h.host.unload().finally(() => timers.clear(timer));
  };

  const at = (replica: string, epoch: number): Hosted | undefined => {
    const h = hosts.get(replica);
    return h && h.epoch === epoch ? h : undefined;
  };

  return {
    assign: (m) => {
      const live = hosts.get(m.replica);
      if (live && live.epoch === m.epoch) return; // a repeated assignment: the host is already there
      if (live) end(live, false);
      let g = gathering.get(m.replica);
      if (!g || g.epoch !== m.epoch) gathering.set(m.replica, (g = { epoch: m.epoch, gpus: new Set() }));
      g.gpus.add(m.gpu);
      if (g.gpus.size < m.tp) return;
      gathering.delete(m.replica);
      start(
        m,
        [...g.gpus].sort((a, b) => a - b),
      );
    },
    owns: (replica, epoch) => {
      const h = hosts.get(replica);
      return h !== undefined && (epoch === undefined || h.epoch === epoch);
    },
    submit: (replica, epoch, seqs) => {
      const h = at(replica, epoch);
      if (!h) return log(`submit of ${seqs.length} to ${replica}@${epoch} dropped: no such host`);
      try {
        h.host.submit(seqs);
      } catch (err) {
        // Not ready: a failed host has reported itself (its sequences are the control plane's to re-home).
        log(`submit of ${seqs.length} to ${replica}@${epoch} refused: ${String(err)}`);
      }
    },
    cancel: (replica, epoch, ids) => {
      at(replica, epoch)?.host.cancel(ids);
    },
    cancelAll: () => {
      let n = 0;
      for (const h of hosts.values()) n += h.host.cancelAll();
      return n;
    },
    release: (replica, epoch) => {
      gathering.delete(replica);
      const h = at(replica, epoch);
      if (h) end(h, true);
    },
    gpuFault: (g) => {
      for (const [replica, pending] of gathering) if (pending.gpus.has(g)) gathering.delete(replica);
      for (const h of [...hosts.values()]) if (h.gpus.includes(g)) end(h, false);
      dropParkedOn(g);
    },
    pid: (replica) => hosts.get(replica)?.host.pid,
    stats: (replica) => hosts.get(replica)?.host.stats(),
    stopAll: () => {
      gathering.clear();
      for (const h of [...hosts.values()]) end(h, false);
      dropAllParked();
    },
  };
}
