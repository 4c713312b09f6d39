// A replica's engine core: its step loop beside its engine, plan → execute → apply → report, with no hop per step.
//
// The loop: the batcher plans a step, the executor runs it, and when it is done its result is applied, the next step
// is planned and started at once, and then ONE report goes out with the completed step's events and the load (which
// so describes the step now running). A report carries the events of the step it names by `start`: the `s` and `p`
// of planning it (so the control plane stamps a sequence scheduled at the step's start exactly) and the `t`, `f` and
// `g` of completing it. Events that came outside a step (a refused submit) ride the next report. A submit or cancel
// that finds the core idle and starts no step is answered at once, when it changed anything.
import type { SeqEvent } from '../../machines/core-messages.ts';
import type { BatcherStats, StepPlan } from '../batcher/types.ts';
import { createCoreEvents } from './core-events.ts';
import { createContinuousSteps, type CoreSteps } from './continuous-steps.ts';
import { createStatelessSteps } from './stateless-steps.ts';
import type { EngineCore, EngineCoreOptions, ReplicaLoad, StepResult } from './types.ts';

/** Totals over a core's completed steps. */
interface StepTotals {
  count: number;
  members: number;
  tokens: number;
  predictedMs: number;
  busyMs: number;
}

/** `cur` when it holds what `prev` holds, else a copy of it: the batcher's class arrays change in place, and a
 * report, once sent, is the receiver's (an in-process link hands it over as it is). */
function stable(prev: readonly number[], cur: readonly number[]): readonly number[] {
  if (prev.length === cur.length) {
    let same = true;
    for (let i = 0; i < cur.length && same; i++) same = prev[i] === cur[i];
    if (same) return prev;
  }
  return cur.slice();
}

/** A core's load from its scheduler's stats, its counters and the step in flight. */
function loadOf(
  s: BatcherStats,
  byClass: readonly number[],
  tokensByClass: readonly number[],
  c: { received: number; cancelled: number; queued: number; saturated: boolean },
  totals: StepTotals,
  inflight: StepPlan | null,
  now: number,
): ReplicaLoad {
  return {
    waiting: s.waiting,
    running: s.running,
    blocksUsed: s.blocksUsed,
    blocksTotal: s.blocksTotal,
    prefillTokensAhead: s.prefillTokensAhead,
    decodeTokensAhead: s.decodeTokensAhead,
    waitingBlocks: s.waitingBlocks,
    waitingByClass: byClass,
    waitingTokensByClass: tokensByClass,
    committedBlocks: s.committedBlocks,
    runningCommittedBlocks: s.runningCommittedBlocks,
    runningContext: s.runningContext,
    preemptions: s.preemptions,
    steps: s.steps,
    received: c.received,
    cancelled: c.cancelled,
    queued: c.queued,
    saturated: c.saturated,
    stepCount: totals.count,
    stepMembers: totals.members,
    stepTokens: totals.tokens,
    stepPredictedMs: totals.predictedMs,
    stepBusyMs: totals.busyMs,
    inflightPredictedMs: inflight === null ? 0 : inflight.predictedMs,
    inflightMs: inflight === null ? 0 : now - inflight.dispatchedAt,
  };
}

/** Creates a replica's engine core; it runs a step as soon as it has work. */
export function createEngineCore(o: EngineCoreOptions): EngineCore {
  const { clock, executor } = o;
  const release = executor.release?.bind(executor);
  const ev = createCoreEvents(release);
  const steps: CoreSteps = o.stateless
    ? createStatelessSteps(o, o.stateless, ev, () => kick(false))
    : createContinuousSteps(o, ev);
  const totals: StepTotals = { count: 0, members: 0, tokens: 0, predictedMs: 0, busyMs: 0 };
  let inflight: StepPlan | null = null;
  let stopped = false;
  // A submit or cancel changed the load since the last report.
  let dirty = false;
  // Sequences and items received since the core started, refused ones included.
  let received = 0;
  let cancelled = 0;
  let byClass: readonly number[] = [];
  let tokensByClass: readonly number[] = [];

  const load = (): ReplicaLoad => {
    const s = steps.stats();
    byClass = stable(byClass, s.waitingByClass);
    tokensByClass = stable(tokensByClass, s.waitingTokensByClass);
    const counts = { received, cancelled, queued: steps.queued(), saturated: steps.saturated() };
    return loadOf(s, byClass, tokensByClass, counts, totals, inflight, clock.now());
  };
  const send = (at: number, start: number, events: SeqEvent[], ranks: number[] | null): void => {
    dirty = false;
    o.report(ranks === null ? { at, start, events, load: load() } : { at, start, ranks, events, load: load() });
  };
  const halt = (): void => {
    stopped = true;
    inflight = null;
    executor.stop();
    steps.stop();
  };
  const crash = (error: unknown): void => {
    if (stopped) return;
    try {
      halt();
    } catch {
      // The core is stopped already; the loop's own error is the one the replica fails with.
    }
    o.crashed(error);
  };
  /** Plans the next step and starts it; false when there is no work. */
  const start = (now: number): boolean => {
    const plan = steps.next(now);
    if (plan === null) return false;
    plan.predictedMs = executor.predictMs(plan);
    plan.dispatchedAt = now;
    inflight = plan;
    executor.run(plan, steps.batch(), done, fail, partial);
    return true;
  };
  // One function each for every step (the step is `inflight`): no closure per step.
  const done = (r: StepResult): void => {
    if (stopped) return;
    try {
      const plan = inflight;
      if (plan === null) throw new Error(`engine core ${o.replica}: a step completed while none was running`);
      inflight = null;
      const now = clock.now();
      const began = plan.dispatchedAt;
      totals.count++;
      totals.members += steps.members(plan);
      totals.tokens += plan.tokens;
      totals.predictedMs += plan.predictedMs;
      totals.busyMs += now - began;
      steps.complete(plan, r, now);
      const events = ev.take();
      start(now);
      send(now, began, events, null);
    } catch (error) {
      crash(error);
    }
  };
  const fail = (error: unknown): void => crash(error);
  const partial = (ranks: number[]): void => {
    if (stopped || inflight === null) return;
    try {
      send(clock.now(), inflight.dispatchedAt, [], ranks);
    } catch (error) {
      crash(error);
    }
  };
  /** New work or a change while idle: starts a step if there is one, else reports what changed (`force`: report
   * even when nothing did, as after a cancel). */
  const kick = (force: boolean): void => {
    if (stopped || inflight !== null) return;
    try {
      const now = clock.now();
      if (!start(now) && (force || dirty || ev.pending() > 0)) send(now, now, ev.take(), null);
    } catch (error) {
      crash(error);
    }
  };
  /** A submit or cancel: applied, then the loop is woken (a throw fails the core, never the caller). */
  const change = (apply: () => void, force: boolean): void => {
    if (stopped) return;
    try {
      apply();
    } catch (error) {
      crash(error);
      return;
    }
    dirty = true;
    kick(force);
  };
  return {
    replica: o.replica,
    epoch: o.epoch,
    submit: (seqs) =>
      change(() => {
        received += seqs.length;
        steps.submit(seqs, clock.now());
      }, false),
    submitItems: (items) =>
      change(() => {
        received += items.length;
        steps.submitItems(items, clock.now());
      }, false),
    cancel: (ids) =>
      change(() => {
        cancelled += ids.length;
        for (const id of ids) {
          steps.cancel(id);
          release?.(id);
        }
      }, true),
    load,
    busy: () => inflight !== null,
    stop: () => {
      if (!stopped) halt();
    },
  };
}
