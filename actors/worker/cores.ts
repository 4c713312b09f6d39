// A node's engine cores: one per cost-model replica assigned with a core, running the replica's step loop on the
// node's clock (virtual in simulation, the wall clock when serving). A core starts once every rank its assignment
// names serves the replica's epoch, and is stopped and forgotten as soon as any rank leaves it (released, failed,
// fenced, silent, or taken by a newer epoch): the control plane's failure handling takes it from there.
import type { Clock } from '../../runtime/clock.ts';
import type { CostModel } from '../gpu/cost-model.ts';
import type { MessageOf, WireCoreSpec } from '../../machines/messages.ts';
import { createEngineCore } from '../engine-core/core.ts';
import { createModelExecutor, type ModelRank } from '../engine-core/model-executor.ts';
import type { CoreExecutor, CoreReport, EngineCore, StepResult } from '../engine-core/types.ts';

/** How a node times its cost-model steps: the roofline times `scale` (default 1), or `fixedMs` per step (0: the
 * overhead runs of the zero-cost worker). `decodeRunMs`: its cores' decode runs (the engine core's option; the
 * simulator's, on a virtual clock). */
export interface StepTiming {
  scale?: number;
  fixedMs?: number;
  decodeRunMs?: number;
}

/** A device as the cores read it: the agent's view of its GPU actor (mirrored on every change) and its faults. */
export interface CoreDevice {
  /** The replica and epoch its GPU actor holds (loading, serving or unloading); null when it holds none. */
  readonly replica: string | null;
  readonly epoch: number;
  /** Its GPU actor is serving (`replica`, `epoch`). */
  readonly serving: boolean;
  readonly hung: boolean;
  /** Crashed: it runs nothing and answers nothing; its replica's core stops. */
  readonly silent: boolean;
  /** Multiplies its step time (a straggler). */
  readonly slowdown: number;
}

/** What a node's cores need of the node. */
export interface NodeCoresOptions {
  clock: Clock;
  device(g: number): CoreDevice | undefined;
  timing?: StepTiming;
  /** Credits a device with the time it spent on a step it finished. */
  credit(g: number, busyMs: number): void;
  /** A core's report, for the control plane (`seq.progress`). */
  report(replica: string, epoch: number, r: CoreReport): void;
  /** A core's loop threw: the replica's GPUs fail as a unit. */
  crashed(replica: string, epoch: number, gpus: readonly number[], error: unknown): void;
}

/** A step a device is running for its replica's core, and since when. */
export interface InflightStep {
  replica: string;
  epoch: number;
  since: number;
}

/** The engine cores of one node. */
export interface NodeCores {
  /** Records an assignment with a core (a repeat of the one held changes nothing; a newer epoch replaces it), and
   * starts the core if every rank serves it already. */
  assign(m: MessageOf<'gpu.assign'>, cost: CostModel): void;
  /** Device g changed (its GPU actor's state, or a fault): starts a core every rank of which now serves it, stops
   * and forgets one a rank left. */
  deviceChanged(g: number): void;
  /** Hands a submit to its replica's core; false (nothing done) when no core runs that replica's epoch. */
  submit(m: MessageOf<'seq.submit'>): boolean;
  /** Hands a cancel to its replica's core; false when no core runs that replica's epoch. */
  cancel(m: MessageOf<'seq.cancel'>): boolean;
  /** Device g is about to change: the core running on it sends the report its decode run holds back. */
  flush(g: number): void;
  /** Every core drops what it holds (it is started anew, empty); answers how many sequences and items it held. */
  orphan(): number;
  inflight(g: number): InflightStep | null;
  /** The core of `replica`, while one runs (tests, views). */
  core(replica: string): EngineCore | null;
  stopAll(): void;
}

/** One replica's core, running or waiting for its ranks. */
interface Hosted {
  replica: string;
  epoch: number;
  spec: WireCoreSpec;
  cost: CostModel;
  /** The replica's own slowdown (co-location interference). */
  slowdown: number;
  /** Ranks seen holding the replica's epoch: a waiting core whose rank stopped holding it will never start. */
  seen: Set<number>;
  core: EngineCore | null;
  /** When the step in flight started, and the ranks still running it (a partial report names the others). */
  since: number;
  running: Set<number>;
}

/** The core's executor: the cost model over the replica's ranks, keeping which ranks run its step. One function
 * each for every step (the core's callbacks are held here): no closure per step. */
function rankedExecutor(o: NodeCoresOptions, h: Hosted): CoreExecutor {
  const timing = o.timing ?? {};
  const fixed = timing.fixedMs;
  const priced: CostModel = fixed === undefined ? h.cost : { ...h.cost, stepS: () => fixed / 1000 };
  const view: ModelRank = { hung: false, slowdown: 1, serving: false };
  const base = createModelExecutor({
    clock: o.clock,
    cost: priced,
    gpus: h.spec.gpus,
    rank: (g) => {
      const d = o.device(g);
      view.hung = d === undefined || d.hung || d.silent;
      view.slowdown = d?.slowdown ?? 1;
      view.serving = d !== undefined && d.serving && d.replica === h.replica && d.epoch === h.epoch;
      return view;
    },
    slowdown: h.slowdown * (fixed === undefined ? (timing.scale ?? 1) : 1),
    credit: o.credit,
  });
  let done: ((r: StepResult) => void) | null = null;
  let partial: ((ranks: number[]) => void) | null = null;
  let ends: Float64Array | null = null;
  const onDone = (r: StepResult): void => {
    h.running.clear();
    done?.(r);
  };
  const onPartial = (ranks: number[]): void => {
    for (const g of ranks) h.running.delete(g);
    partial?.(ranks);
  };
  return {
    predictMs: (plan) => base.predictMs(plan),
    run: (plan, batch, d, fail, p) => {
      done = d;
      partial = p ?? null;
      h.since = o.clock.now();
      for (const g of h.spec.gpus) h.running.add(g);
      base.run(plan, batch, onDone, fail, onPartial);
    },
    runSteps: (plan, count, grow, from, span, t, d, fail, p) => {
      const k = base.runSteps!(plan, count, grow, from, span, t, onDone, fail, onPartial);
      if (k === 0) return 0;
      done = d;
      partial = p ?? null;
      h.since = o.clock.now();
      for (const g of h.spec.gpus) h.running.add(g);
      ends = t.ends;
      return k;
    },
    cut: (now) => {
      const m = base.cut!(now);
      // The step in flight now started when the last one it completed ended (a run that ended now is not running).
      if (m > 0 && h.running.size > 0 && ends !== null && ends[m - 1]! <= now) h.since = ends[m - 1]!;
      return m;
    },
    stop: () => {
      h.running.clear();
      done = partial = null;
      base.stop();
    },
  };
}

/** Creates the engine cores of a node. */
export function createNodeCores(o: NodeCoresOptions): NodeCores {
  const hosted = new Map<string, Hosted>();

  const start = (h: Hosted): void => {
    const { replica, epoch, spec } = h;
    h.core = createEngineCore({
      replica,
      epoch,
      owner: spec.owner,
      clock: o.clock,
      limits: spec.limits,
      ...(spec.stateless ? { stateless: spec.stateless } : {}),
      executor: rankedExecutor(o, h),
      checkInvariants: spec.check === true,
      ...(o.timing?.decodeRunMs ? { decodeRunMs: o.timing.decodeRunMs } : {}),
      report: (r) => o.report(replica, epoch, r),
      crashed: (error) => {
        forget(h);
        o.crashed(replica, epoch, spec.gpus, error);
      },
    });
  };
  const forget = (h: Hosted): void => {
    if (hosted.get(h.replica) === h) hosted.delete(h.replica);
    const core = h.core;
    h.core = null;
    core?.stop();
    h.running.clear();
  };
  /** Starts the core when every rank serves its epoch; forgets it when a rank left (or, waiting, one it had). */
  const check = (h: Hosted): void => {
    let all = true;
    for (const g of h.spec.gpus) {
      const d = o.device(g);
      const holds = d !== undefined && !d.silent && d.replica === h.replica && d.epoch === h.epoch;
      if (holds) h.seen.add(g);
      else if (h.seen.has(g)) return forget(h);
      if (!holds || !d.serving) all = false;
    }
    if (h.core && !all) forget(h);
    else if (!h.core && all) start(h);
  };

  return {
    assign: (m, cost) => {
      if (!m.core || m.engine) return;
      const held = hosted.get(m.replica);
      if (held && held.epoch >= m.epoch) return;
      if (held) forget(held);
      const h: Hosted = {
        replica: m.replica,
        epoch: m.epoch,
        spec: m.core,
        cost,
        slowdown: m.slowdown ?? 1,
        seen: new Set(),
        core: null,
        since: 0,
        running: new Set(),
      };
      hosted.set(m.replica, h);
      check(h);
    },
    deviceChanged: (g) => {
      for (const h of [...hosted.values()]) if (h.spec.gpus.includes(g)) check(h);
    },
    submit: (m) => {
      const h = hosted.get(m.replica);
      if (!h?.core || h.epoch !== m.epoch) return false;
      if (m.seqs && m.seqs.length > 0) h.core.submit(m.seqs);
      // A submit that failed the core forgot it: its items go nowhere.
      if (m.items && m.items.length > 0) h.core?.submitItems(m.items);
      return true;
    },
    cancel: (m) => {
      const h = hosted.get(m.replica);
      if (!h?.core || h.epoch !== m.epoch) return false;
      h.core.cancel(m.ids);
      return true;
    },
    flush: (g) => {
      for (const h of hosted.values()) if (h.core && h.spec.gpus.includes(g)) h.core.flush();
    },
    orphan: () => {
      let held = 0;
      for (const h of hosted.values()) {
        if (!h.core) continue;
        const l = h.core.load();
        held += l.waiting + l.running + l.queued;
        h.core.stop();
        h.running.clear();
        start(h);
      }
      return held;
    },
    inflight: (g) => {
      for (const h of hosted.values())
        if (h.running.has(g)) return { replica: h.replica, epoch: h.epoch, since: h.since };
      return null;
    },
    core: (replica) => hosted.get(replica)?.core ?? null,
    stopAll: () => {
      for (const h of [...hosted.values()]) forget(h);
    },
  };
}
