// Placement's reconciler: on every turn it compares the replicas that exist with the layout the node is heading for,
// drains the ones in the way and creates the missing ones on free GPUs, moves the placement machine on (demand,
// drained, loaded), records when a model becomes unavailable or available again, and hands ready replicas on.
import {
  createReplica,
  statelessLimits,
  type ProgressDelta,
  type ReplicaHandle,
  type ReplicaOptions,
} from '../replica.ts';
import type { OutcomeCode } from '../../machines/outcomes.ts';
import type { Runtime } from '../../runtime/system.ts';
import type { Scenario } from '../config.ts';
import type { Sequence } from '../batcher/sequence.ts';
import { costOf, type LayoutEntry } from './layout.ts';
import { costModelKey } from '../gpu/profile-cost-model.ts';
import { decideSwitch } from './policy.ts';
import type { GpuLedger } from './ledger.ts';
import type { Modes } from './modes.ts';
import type { Timeline } from './timeline.ts';

/** Hooks placement calls into the rest of the control plane. */
export interface PlacementHooks {
  onInterrupted(seqs: Sequence[], reason: OutcomeCode): void;
  onReplicaReady(r: ReplicaHandle): void;
  /** After a progress report of `r`'s core that covered steps. */
  onProgress?(r: ReplicaHandle, delta: ProgressDelta): void;
  /** `r`'s core reported its prefix cache's changes. */
  onCache?: ReplicaOptions['onCache'];
  /** A sequence the replica's core refused: its request fails alone. */
  onRefused?(seq: Sequence, message: string): void;
  /** Cores check their batchers' invariants after every step (simulation). */
  checkCore?: boolean;
  /** Requests of `model` held because no replica of it is ready. */
  held?(model: string): number;
  /** Mutation tests only: adopt nothing a node reports (every loaded replica is reclaimed and reloaded). */
  adoptNothing?: boolean;
}

/** What the reconciler works on. */
export interface ReconcilerDeps {
  runtime: Runtime;
  scenario: Scenario;
  ledger: GpuLedger;
  replicas: Map<string, ReplicaHandle>;
  timeline: Timeline;
  modes: Modes;
  hooks: PlacementHooks;
  /** Called at the end of every turn (watchers). */
  notify(): void;
}

/** The reconciler of one placement actor. */
export interface Reconciler {
  /** Runs a turn on the next tick of the clock (once, however often it is asked). */
  schedule(): void;
  /** Asks the replica to drain by `deadlineMs` (a placing one just stops). */
  drain(r: ReplicaHandle, deadlineMs: number): void;
  /** A replica reported ready: it is handed on at the end of the next turn if it still accepts work. */
  ready(r: ReplicaHandle): void;
  /** When a replica was created (for load ETAs). */
  createdAt(id: string): number | undefined;
  /** The demand signal: work of `model` was held, released or refused (see Placement.demand). */
  demand(model: string, rejected: boolean, retryAfterMs: number): void;
  /** A node reports `id` at `epoch`: this control plane's next epoch of it is later (no stale message is accepted). */
  seeEpoch(id: string, epoch: number): void;
  /** Creates the replica of `e` at the epoch its node still serves (a restarted control plane adopting it): its
   * GPUs answer the assignment as loaded at once, so nothing is reloaded. */
  adopt(e: LayoutEntry, epoch: number): void;
  /** Runs `fn` (failing several GPUs at once) and hands on the requests it interrupted only after it: none is
   * resumed onto a replica that fails in the same breath. */
  together(fn: () => void): void;
}

/** Builds a replica's options from its layout entry. */
export function replicaOptions(
  scenario: Scenario,
  e: LayoutEntry,
  epoch: number,
  callbacks: Pick<ReplicaOptions, 'onInterrupted' | 'onProgress' | 'onCache' | 'onRefused' | 'checkCore'>,
): ReplicaOptions {
  const m = e.model;
  const cost = costOf(scenario, m);
  const b = m.batching;
  const blocks = e.blocksTotal ?? b.kvBlocks ?? cost.kvBlocks(b.blockTokens);
  return {
    id: e.id,
    model: m.name,
    version: e.version,
    gpus: e.devices,
    epoch,
    gpuType: scenario.node.gpu,
    modelProfile: costModelKey(m),
    cost,
    limits: {
      policy: b.policy,
      maxRunning: b.maxRunning,
      tokenBudget: b.tokenBudget,
      blockTokens: b.blockTokens,
      maxContext: b.maxContext,
      watermarkBlocks: Math.floor(blocks * b.watermark),
      blocksTotal: blocks,
      ...(b.prefixCache ? { prefixCache: true } : {}),
    },
    ...(e.slowdown > 1 ? { slowdown: e.slowdown } : {}),
    // The replica's kind is fixed here, as it is created: a stateless model's replica batches dynamically.
    ...(m.kind === 'stateless' ? { stateless: statelessLimits(m, cost) } : {}),
    // A llama.cpp model's replica runs on one engine host over its GPUs.
    ...(m.engine ? { engine: m.engine } : {}),
    ...callbacks,
  };
}

/** Creates the reconciler; nothing runs until `schedule()`. */
export function createReconciler(d: ReconcilerDeps): Reconciler {
  const { runtime, scenario, ledger, replicas, timeline, modes, hooks } = d;
  const pc = scenario.placement;
  const now = (): number => runtime.clock.now();
  const epochs = new Map<string, number>();
  const createdAt = new Map<string, number>();
  const readyQueue: ReplicaHandle[] = [];
  const reasons = new Map<string, string | null>();
  const demand = createDemand(d, () => schedule());
  let interrupted: (() => void)[] | null = null;

  let pending = false;
  const schedule = (): void => {
    if (pending) return;
    pending = true;
    runtime.clock.setTimeout(tick, 0);
  };

  const drain = (r: ReplicaHandle, deadlineMs: number): void => {
    if (!r.hasTag('live')) return;
    timeline.log({
      kind: 'drain.started',
      replica: r.id,
      model: r.model,
      gpus: [...r.gpus],
      detail: `deadline ${Math.round(deadlineMs)} ms`,
    });
    if (!r.hasTag('holdsGpu')) r.send({ type: 'replica.stop' });
    else r.send({ type: 'replica.drain', deadlineMs });
  };

  const create = (e: LayoutEntry, at?: number): void => {
    const epoch = at ?? (epochs.get(e.id) ?? 0) + 1;
    epochs.set(e.id, Math.max(epoch, epochs.get(e.id) ?? 0));
    const opts = replicaOptions(scenario, e, epoch, {
      onInterrupted: (seqs, reason) => {
        const requests = seqs.map((s) => ({ id: s.id, tokens: s.generated }));
        timeline.recordInterruption({ t: now(), replica: e.id, reason, requests });
        if (interrupted) interrupted.push(() => hooks.onInterrupted(seqs, reason));
        else hooks.onInterrupted(seqs, reason);
      },
      onProgress: (r, delta) => {
        hooks.onProgress?.(r, delta);
        // The naive policy waits for the node to go idle, which only a step can reveal.
        if (modes.policy() === 'switch' && !pc.largeWaitReservation && demand.waiting() && !r.work.hasWork())
          schedule();
      },
      ...(hooks.onRefused ? { onRefused: hooks.onRefused } : {}),
      ...(hooks.onCache ? { onCache: hooks.onCache } : {}),
      ...(hooks.checkCore ? { checkCore: true } : {}),
    });
    for (const dev of e.devices) ledger.setHolder(dev, e.id);
    const r = createReplica(runtime, opts);
    replicas.set(e.id, r);
    createdAt.set(e.id, now());
    timeline.log({ kind: 'replica.created', replica: e.id, model: e.model.name, gpus: [...e.devices] });
    timeline.publish({ kind: 'replica.created', t: now(), replica: e.id, model: e.model.name, gpus: e.devices });
    r.send({ type: 'replica.start' });
  };

  const reconcile = (): void => {
    const st = modes.state();
    if (st !== 'steady' && st !== 'switching') return;
    const want = modes.desired();
    const ids = new Set(want.map((e) => e.id));
    for (const r of replicas.values()) if (!ids.has(r.id)) drain(r, pc.drainDeadlineMs);
    for (const e of want) if (!replicas.has(e.id) && ledger.free(e.devices)) create(e);
  };

  const checkTransitions = (): void => {
    const st = modes.state();
    const c = modes.actor.getSnapshot().context;
    if (st === 'draining') {
      const keep = new Set(modes.layout(c.target).map((e) => e.id));
      if ([...replicas.keys()].every((id) => keep.has(id))) modes.actor.send({ type: 'replicas.drained' });
    } else if (st === 'switching') {
      const want = modes.layout(c.target);
      if (want.every((e) => replicas.get(e.id)?.ready())) modes.actor.send({ type: 'replicas.loaded', t: now() });
    }
  };

  const updateReasons = (): void => {
    for (const m of scenario.models) {
      const why = modes.reasonFor(m.name);
      if ((reasons.get(m.name) ?? null) === why) continue;
      reasons.set(m.name, why);
      timeline.log({
        kind: why ? 'unavailable' : 'available',
        model: m.name,
        detail: why ?? `${m.name} can be placed`,
      });
    }
  };

  function tick(): void {
    pending = false;
    for (let i = 0; i < 8; i++) {
      const before = modes.actor.getSnapshot();
      demand.evaluate();
      checkTransitions();
      reconcile();
      if (modes.actor.getSnapshot() === before) break;
    }
    updateReasons();
    while (readyQueue.length > 0) {
      const r = readyQueue.shift()!;
      if (replicas.get(r.id) === r && r.accepting()) hooks.onReplicaReady(r);
    }
    d.notify();
  }

  return {
    schedule,
    drain,
    ready: (r) => {
      readyQueue.push(r);
      schedule();
    },
    createdAt: (id) => createdAt.get(id),
    demand: demand.signal,
    seeEpoch: (id, epoch) => {
      if (epoch > (epochs.get(id) ?? 0)) epochs.set(id, epoch);
    },
    adopt: (e, epoch) => {
      create(e, epoch);
      timeline.log({ kind: 'replica.adopted', replica: e.id, model: e.model.name, gpus: [...e.devices] });
      schedule();
    },
    together: (fn) => {
      if (interrupted) return fn();
      interrupted = [];
      try {
        fn();
      } finally {
        const handOn = interrupted;
        interrupted = null;
        for (const h of handOn) h();
      }
    },
  };
}

/** Demand tracking and the switch decision: which models wait for placement, and since when. */
function createDemand(
  d: ReconcilerDeps,
  schedule: () => void,
): { evaluate(): void; waiting(): boolean; signal(model: string, rejected: boolean, retryAfterMs: number): void } {
  const { runtime, scenario, replicas, timeline, modes, hooks } = d;
  const pc = scenario.placement;
  const now = (): number => runtime.clock.now();
  const lastReject = new Map<string, number>();
  // The first and the latest of the refusals of a model that kept coming, each within the window of the one before.
  const rejectStreak = new Map<string, { since: number; last: number }>();
  const demandSince = new Map<string, number>();
  const rejectWindowMs = Math.max(1000, pc.hysteresisMs);

  const hasAccepting = (model: string): boolean => {
    for (const r of replicas.values()) if (r.model === model && r.accepting()) return true;
    return false;
  };
  const idle = (): boolean => {
    const c = modes.actor.getSnapshot().context;
    for (const r of replicas.values()) {
      if (!modes.places(c.mode, r.model)) continue;
      if (r.work.hasWork() || !r.ready()) return false;
      if ((hooks.held?.(r.model) ?? 0) > 0) return false;
    }
    return true;
  };

  const evaluate = (): void => {
    const t = now();
    for (const m of scenario.models) {
      const refused = t - (lastReject.get(m.name) ?? -Infinity) < rejectWindowMs;
      if (!refused) rejectStreak.delete(m.name);
      // Refused requests are demand only once they are sustained; admitted (held) work is demand at once.
      const streak = rejectStreak.get(m.name);
      const sustained = refused && (streak ? streak.last - streak.since : 0) >= pc.sustainedDemandMs;
      const waiting = (hooks.held?.(m.name) ?? 0) > 0 || sustained;
      // Work counts as waiting for placement only while the model can be placed: an outage is not a switch's fault.
      if (waiting && !hasAccepting(m.name) && !modes.reasonFor(m.name)) {
        if (!demandSince.has(m.name)) demandSince.set(m.name, t);
      } else demandSince.delete(m.name);
    }
    const large = modes.roles.large;
    if (modes.policy() !== 'switch' || !large) return;
    const ev = decideSwitch({
      now: t,
      state: modes.state(),
      context: modes.actor.getSnapshot().context,
      config: pc,
      demandSince,
      places: modes.places,
      largeImpossible: modes.largeImpossible(),
      idle,
    });
    if (ev?.type === 'mode.forced')
      timeline.log({ kind: 'mode.forced', mode: ev.mode, detail: `${large.name} cannot be placed` });
    if (ev) modes.actor.send(ev);
  };

  return {
    evaluate,
    waiting: () => demandSince.size > 0,
    signal: (model, rejected, retryAfterMs) => {
      if (rejected) {
        const t = now();
        const streak = rejectStreak.get(model);
        if (streak && t - (lastReject.get(model) ?? -Infinity) < rejectWindowMs) streak.last = t;
        else rejectStreak.set(model, { since: t, last: t });
        const until = t + Math.min(retryAfterMs, pc.drainDeadlineMs);
        if (until > (lastReject.get(model) ?? -Infinity)) lastReject.set(model, until);
        runtime.clock.setTimeout(schedule, until - now() + rejectWindowMs + 1);
      }
      schedule();
    },
  };
}
