// A replica's engine core: its step loop beside its engine, plan → execute → apply → report, with no hop per step.
//
// The loop: the batcher plans a step, the executor runs it, and when it is done its result is applied, the next step
// is planned and started at once, and then ONE report goes out with the completed step's events and the load (which
// so describes the step now running). A report carries the events of the step it names by `start`: the `s` and `p`
// of planning it (so the control plane stamps a sequence scheduled at the step's start exactly) and the `t`, `f` and
// `g` of completing it. Events that came outside a step (a refused submit) ride the next report. A submit or cancel
// that finds the core idle and starts no step is answered at once, when it changed anything.
//
// Decode runs (`decodeRunMs`, core-runs.ts): while the running set only decodes, step after step with nothing
// waiting and nothing submitted or cancelled, the core holds its reports back, for at most `decodeRunMs` since its
// last report (core-reports.ts): the next report covers every step since, each token with its step's end (one `g`
// listing them). Those steps run as one run on the executor, one timer at the last one's end, each then completed at
// its own end as a timer per step would have. Anything that changes the core (a submit, a cancel, a partial step, a
// stop, a read of its load, or `flush()`, which its node calls before a device of the replica changes) first cuts
// the run: the steps ended by then complete and their report goes out (the step in flight goes on alone), so the
// control plane hears every step done before that change, before it.
import type { BatcherStats, StepPlan } from '../batcher/types.ts';
import { createCoreEvents } from './core-events.ts';
import { createCoreReports } from './core-reports.ts';
import { createContinuousSteps, type CoreSteps } from './continuous-steps.ts';
import { createCoreRuns } from './core-runs.ts';
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

/** Counts a completed step in `totals`. */
function count(totals: StepTotals, members: number, plan: StepPlan, end: number): void {
  totals.count++;
  totals.members += members;
  totals.tokens += plan.tokens;
  totals.predictedMs += plan.predictedMs;
  totals.busyMs += end - plan.dispatchedAt;
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
  const reports = createCoreReports(o, ev, load, () => steps.cacheChanges());
  /** Completes `plan`, which ended at `end`: its totals, then the batcher (its events to the buffer). */
  const complete = (plan: StepPlan, r: StepResult, end: number): void => {
    count(totals, steps.members(plan), plan, end);
    steps.complete(plan, r, end);
  };
  /** Brings the core to now: a decode run in flight is cut, the steps it ran by now completed (report held). */
  const cut = (): void => {
    const began = runs.cut(clock.now());
    if (began >= 0) reports.hold(began);
  };
  /** Brings the core to now and sends the report held back. */
  const flush = (): void => {
    cut();
    reports.flush(clock.now());
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
  /** Plans the next step at `now`: the step in flight, or null when there is no work. */
  const plan = (now: number): StepPlan | null => {
    const p = steps.next(now);
    if (p === null) return null;
    p.predictedMs = executor.predictMs(p);
    p.dispatchedAt = now;
    inflight = p;
    return p;
  };
  /** Starts the planned step, as a decode run with the steps that may follow it when `from` (the last report's time)
   * is given, else alone. */
  const launch = (p: StepPlan, from: number | null): void => {
    if (from === null || reports.runMs <= 0 || !runs.start(p, from, reports.runMs))
      executor.run(p, steps.batch(), done, crash, partial);
  };
  // One function each for every step (the step is `inflight`): no closure per step.
  const done = (r: StepResult): void => {
    if (stopped) return;
    try {
      // A run's steps but its last complete at their own ends first; its last is the step in flight.
      if (runs.active()) runs.ended();
      const p = inflight;
      if (p === null) throw new Error(`engine core ${o.replica}: a step completed while none was running`);
      inflight = null;
      const now = clock.now();
      const began = p.dispatchedAt;
      complete(p, r, now);
      // The step's events end here: planning the next one may add its `s` and `p`, which go with its own report.
      const n = ev.pending();
      const next = plan(now);
      const hold = reports.mayHold(p, inflight, n, now);
      if (next !== null) launch(next, hold ? reports.sentAt() : now);
      if (hold) reports.hold(began);
      else reports.step(now, began, n);
    } catch (error) {
      crash(error);
    }
  };
  const partial = (ranks: number[]): void => {
    const p = inflight;
    if (p === null) return;
    guarded(() => {
      flush();
      reports.send(clock.now(), p.dispatchedAt, [], ranks);
    });
  };
  const runs = createCoreRuns({ replica: o.replica, executor, steps, complete, done, fail: crash, partial });
  /** New work or a change while idle: starts a step if there is one, else reports what changed (`force`: report
   * even when nothing did, as after a cancel). Its report comes after the step: it runs alone. */
  const kick = (force: boolean): void => {
    if (inflight !== null) return;
    guarded(() => {
      const now = clock.now();
      const next = plan(now);
      if (next !== null) launch(next, null);
      else if (force || reports.dirty || ev.pending() > 0) reports.send(now, now, ev.take(), null);
    });
  };
  /** Runs `f` unless the core is stopped; a throw fails the core (never the caller). */
  const guarded = (f: () => void): boolean => {
    if (stopped) return false;
    try {
      f();
      return true;
    } catch (error) {
      crash(error);
      return false;
    }
  };
  /** A submit or cancel: the core brought to now (the report held back sent), the change applied, the loop woken. */
  const change = (apply: () => void, force: boolean): void => {
    const applied = guarded(() => {
      flush();
      apply();
    });
    if (!applied) return;
    reports.dirty = true;
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
    load: () => {
      guarded(cut);
      return load();
    },
    busy: () => inflight !== null,
    flush: () => void guarded(flush),
    stop: () => {
      // The steps run by now are heard of, as they would have been step by step.
      guarded(flush);
      if (!stopped) halt();
    },
  };
}
