// The worker's engine hosts: one llama.cpp host process per engine replica, over all of the replica's GPUs.
//
// A replica's `gpu.assign`s are collected until every rank has one (the TP-8 replica is one host over eight GPUs);
// then its host is spawned. Its life reaches the GPU actors through the callbacks: ready = the GPUs are loaded,
// failed (exit, crash, no progress) = the GPUs are fenced by the agent. A release, an unload or a fault of any of
// its GPUs kills the host on purpose (that is not reported as a failure). Steps run one at a time per host: the
// worker keeps each open sequence's tokens (prompt plus generated) so that items name only ranges of them.
import type { EngineFailure, SamplingParams, StepItem } from '../engine/engine.ts';
import { nodeHostTimers, spawnEngineHost, type EngineHost, type EngineHostOptions } from '../engine/host-client.ts';
import type { NodeMessage } from '../../transport/protocol.ts';
import { defaultModelRoots, modelFileRefusal } from './model-roots.ts';

type Assign = Extract<NodeMessage, { type: 'gpu.assign' }>;
type Execute = Extract<NodeMessage, { type: 'step.execute' }>;
type Completed = Extract<NodeMessage, { type: 'step.completed' }>;
/** The engine a `gpu.assign` names. */
export type EngineSpec = NonNullable<Assign['engine']>;
type Open = NonNullable<Execute['open']>[number];
type Sampled = NonNullable<Completed['sampled']>[number];

/** What the agent hears from its engine hosts. */
export interface EngineEvents {
  /** The host answered its health probe: the replica's GPUs are loaded. */
  ready(replica: string, epoch: number, gpus: readonly number[]): void;
  /** The host failed by itself (exit, crash, invalid message, no progress): fence the replica's GPUs. */
  failed(replica: string, epoch: number, gpus: readonly number[], failure: EngineFailure | undefined): void;
  log?(line: string): void;
}

/** Options of the engine manager. */
export interface EngineManagerOptions extends EngineEvents {
  /** Starts a host (tests inject one); default spawnEngineHost. */
  spawn?(opts: EngineHostOptions): EngineHost;
  /** Bounds and timers passed to every host. */
  host?: Pick<EngineHostOptions, 'loadTimeoutMs' | 'stepTimeoutMs' | 'probeTimeoutMs' | 'timers'>;
  /** Time a host gets to unload before it is killed (ms). */
  unloadGraceMs?: number;
  /** Folders model files must be under (real paths compared); default defaultModelRoots(). */
  modelRoots?: readonly string[];
}

/** A step's outcome for the agent to report: the sampled tokens and the engine's cache, or nothing (failed). */
export interface EngineStepDone {
  busyMs: number;
  sampled: Sampled[];
  cache: { sequences: number; cellsPerSequence: number };
}

/** The engine hosts of one worker. */
export interface EngineManager {
  /** Records one rank's assignment; spawns the host once every rank of (replica, epoch) is assigned. */
  assign(m: Assign & { engine: EngineSpec }): void;
  /** True when `replica` is an engine replica with a host at `epoch`. */
  owns(replica: string, epoch?: number): boolean;
  /** Runs a step; `done` is called once with the result, or never when the host failed or the step was refused. */
  step(m: Execute, done: (r: EngineStepDone) => void): void;
  /** Frees sequences' cells (cancel, preemption) and forgets their tokens. */
  free(replica: string, epoch: number, seqs: readonly string[]): void;
  /** Unloads the replica's host (release): killed if it does not exit within the grace. */
  release(replica: string, epoch: number): void;
  /** A fault of GPU g: the host over it is killed at once. */
  gpuFault(g: number): void;
  /** The host process of a replica, for tests and views. */
  pid(replica: string): number | undefined;
  /** Frees every open sequence of every host (their control plane is gone); answers how many. */
  freeAll(): number;
  /** Kills every host (the worker is going away). */
  stopAll(): void;
}

/** One open sequence on a host: every token it holds or will prefill, its sampling, and its output left. */
interface OpenSeq {
  tokens: number[];
  sampling: SamplingParams;
  left: number;
  /** Tokens it generated before this residency (a recompute), whose text was streamed already. */
  streamed: number[];
}

/** One host and what the worker keeps beside it. */
interface Hosted {
  host: EngineHost;
  replica: string;
  epoch: number;
  gpus: number[];
  /** Killed or unloaded on purpose: its exit is not a failure. */
  ending: boolean;
  seqs: Map<string, OpenSeq>;
  /** Steps and frees run one after another, in the order they arrived. */
  tail: Promise<unknown>;
}

const samplingOf = (o: Open): SamplingParams => ({
  ...(o.temperature !== undefined ? { temperature: o.temperature } : {}),
  ...(o.topP !== undefined ? { topP: o.topP } : {}),
  ...(o.seed !== undefined ? { seed: o.seed } : {}),
  ...(o.stop !== undefined ? { stop: o.stop } : {}),
});

/** Turns wire items into engine items over the sequences' tokens; opens new sequences first. */
function planOf(h: Hosted, m: Execute): StepItem[] {
  for (const o of m.open ?? []) {
    const streamed = o.generated ? o.tokens.slice(Math.max(0, o.tokens.length - o.generated)) : [];
    h.seqs.set(o.seq, { tokens: [...o.tokens], sampling: samplingOf(o), left: o.left, streamed });
  }
  const opened = new Set((m.open ?? []).map((o) => o.seq));
  return (m.items ?? []).map((it): StepItem => {
    const s = h.seqs.get(it.seq);
    if (!s) throw new Error(`step ${m.step} of ${m.replica} names sequence ${it.seq}, which is not open`);
    // The token this item samples is the sequence's last: the engine flushes its text and frees it in the step.
    const last = s.left <= 1 && (it.n === 0 || it.sample) ? { last: true } : {};
    if (it.n === 0) return { seq: it.seq, kind: 'decode', ...last };
    const tokens = s.tokens.slice(it.from, it.from + it.n);
    if (tokens.length !== it.n)
      throw new Error(`prefill of ${it.seq} asks for tokens past the ${s.tokens.length} held`);
    return {
      seq: it.seq,
      kind: 'prefill',
      tokens,
      sample: it.sample,
      ...(opened.has(it.seq) && it.from === 0 ? { sampling: s.sampling } : {}),
      ...(opened.has(it.seq) && it.from === 0 && s.streamed.length > 0 ? { streamed: s.streamed } : {}),
      ...last,
    };
  });
}

/**
 * Records sampled tokens. A sequence that ended (eos, stop, its output left) is forgotten: the engine freed it in
 * the step (an item marked `last` had its held text appended); one it still holds, unexpectedly, is freed here.
 */
async function settle(h: Hosted, sampled: readonly Sampled[], items: readonly StepItem[]): Promise<Sampled[]> {
  const out: Sampled[] = [];
  for (const t of sampled) {
    const s = h.seqs.get(t.seq);
    const r: Sampled = { ...t };
    if (s) {
      s.tokens.push(t.token);
      s.left -= 1;
      if (!r.finish && s.left <= 0) r.finish = 'length';
    }
    if (r.finish) {
      h.seqs.delete(t.seq);
      if (r.finish === 'length' && !items.some((i) => i.seq === t.seq && i.last)) {
        r.text += (await h.host.free(t.seq)).text;
      }
    }
    out.push(r);
  }
  return out;
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
    const host = spawn({
      ...opts.host,
      id: m.replica,
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
    });
    const h: Hosted = {
      host,
      replica: m.replica,
      epoch: m.epoch,
      gpus,
      ending: false,
      seqs: new Map(),
      tail: host.ready(),
    };
    h.tail = h.tail.catch(() => undefined);
    hosts.set(m.replica, h);
    log(`engine host ${m.replica}@${m.epoch} pid ${host.pid} on GPUs ${gpus.join(',')} loading ${e.file}`);
    host.subscribe((ev) => {
      if (hosts.get(m.replica) !== h) return;
      if (ev.to === 'ready') opts.ready(h.replica, h.epoch, h.gpus);
      if (ev.to === 'failed' || ev.to === 'stopped') {
        hosts.delete(h.replica);
        if (!h.ending) {
          log(`engine host ${h.replica}@${h.epoch} failed: ${ev.failure?.message ?? ev.to}`);
          opts.failed(h.replica, h.epoch, h.gpus, ev.failure);
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

  const runStep = async (h: Hosted, m: Execute, done: (r: EngineStepDone) => void): Promise<void> => {
    let items: StepItem[];
    try {
      items = planOf(h, m);
    } catch (err) {
      log(`engine step refused by the worker: ${String(err)}; killing ${h.replica}`);
      return failHost(h);
    }
    try {
      const result = await h.host.step({ items });
      const sampled = await settle(h, result.sampled, items);
      const cap = h.host.capacity();
      done({
        busyMs: result.ms,
        sampled,
        cache: { sequences: cap?.sequences ?? 0, cellsPerSequence: cap?.cellsPerSequence ?? 0 },
      });
    } catch (err) {
      // A failed host is reported by its own state change; a refused plan means the ledgers disagree: fail it.
      if (h.host.state !== 'failed' && h.host.state !== 'stopped') {
        log(`engine step of ${h.replica} failed: ${String(err)}; killing the host`);
        failHost(h);
      }
    }
  };
  // Kill without marking the end as intended: the exit is reported as a failure and the GPUs are fenced.
  const failHost = (h: Hosted): void => h.host.kill();

  const queue = (h: Hosted, work: () => Promise<void>): void => {
    h.tail = h.tail.then(work).catch((err: unknown) => log(`engine work of ${h.replica} failed: ${String(err)}`));
  };

  const freeInOrder = (h: Hosted, seqs: readonly string[]): void =>
    queue(h, async () => {
      for (const s of seqs) {
        h.seqs.delete(s);
        await h.host.free(s);
      }
    });

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
    step: (m, done) => {
      const h = hosts.get(m.replica);
      if (!h || h.epoch !== m.epoch) return;
      queue(h, () => runStep(h, m, done));
    },
    free: (replica, epoch, seqs) => {
      const h = hosts.get(replica);
      if (!h || h.epoch !== epoch) return;
      // In order with the steps: a step sent before the free still finds the sequence's tokens.
      freeInOrder(h, seqs);
    },
    release: (replica, epoch) => {
      gathering.delete(replica);
      const h = hosts.get(replica);
      if (h && h.epoch === epoch) end(h, true);
    },
    gpuFault: (g) => {
      for (const [replica, pending] of gathering) if (pending.gpus.has(g)) gathering.delete(replica);
      for (const h of [...hosts.values()]) if (h.gpus.includes(g)) end(h, false);
    },
    pid: (replica) => hosts.get(replica)?.host.pid,
    freeAll: () => {
      let n = 0;
      for (const h of hosts.values()) {
        const seqs = [...h.seqs.keys()];
        n += seqs.length;
        // In order with the steps already queued: a step in flight still finds its sequences.
        if (seqs.length > 0) freeInOrder(h, seqs);
      }
      return n;
    },
    stopAll: () => {
      gathering.clear();
      for (const h of [...hosts.values()]) end(h, false);
    },
  };
}
