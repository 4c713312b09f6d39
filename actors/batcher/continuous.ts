// Iteration-level (continuous) batching for one generative replica, over a paged KV-cache ledger.
//
// The batcher is a plain object the replica actor owns, not an actor per iteration: one step is planned, sent to
// the worker and completed at a time, and the replica's machine (machines/replica.machine.ts) is what the rest of
// the system talks to. Its parts:
// - batch-state.ts: the KV ledger (kv-ledger.ts), the waiting queues per class (waiting.ts) and the running set;
// - step-planner.ts: step composition per policy (chunked, prefill-first, static) and block allocation;
// - preemption.ts: preemption by recompute, for memory and for priority;
// - completion.ts: tokens produced by a completed step, and finished sequences;
// - batch-invariants.ts: the ledger, queue and step-plan invariants the simulation checks after every step.
import { checkBatchState, checkPlanTotals } from './batch-invariants.ts';
import { createBatchState, leaveSlot, removeRunning, type BatchState } from './batch-state.ts';
import { completeStep } from './completion.ts';
import { completeRunStep, planRunStep, runBuffers, settleRun, startRun, type DecodeRun } from './decode-run.ts';
import { headBlocked } from './preemption.ts';
import type { Sequence } from './sequence.ts';
import { planStep, replanDecodes } from './step-planner.ts';
import type { BatcherStats, ContinuousBatcher, ContinuousLimits, StepPlan } from './types.ts';

export type { BatchPolicy, BatcherStats, ContinuousBatcher, ContinuousLimits, PlanEntry, StepPlan } from './types.ts';

/** What the running set contributes to the stats: sums over every running sequence. */
interface RunningSums {
  prefillAhead: number;
  decodeAhead: number;
  context: number;
  committed: number;
}

function runningSums(st: BatchState): RunningSums {
  const { running, ledger } = st;
  let prefillAhead = 0;
  let decodeAhead = 0;
  let context = 0;
  let committed = 0;
  for (const s of running) {
    prefillAhead += Math.max(0, s.prefillGoal - s.computed);
    decodeAhead += Math.max(0, s.estOutputTokens - s.generated);
    context += s.computed;
    committed += Math.max(s.blocks, ledger.finalBlocks(s));
  }
  return { prefillAhead, decodeAhead, context, committed };
}

const sameSums = (a: RunningSums, b: RunningSums): boolean =>
  a.prefillAhead === b.prefillAhead &&
  a.decodeAhead === b.decodeAhead &&
  a.context === b.context &&
  a.committed === b.committed;

function batcherStats(st: BatchState, r: RunningSums): BatcherStats {
  const { running, ledger, waiting } = st;
  const w = waiting.sums;
  let prefillAhead = r.prefillAhead;
  for (const t of w.tokensByClass) prefillAhead += t;
  return {
    waiting: waiting.count,
    running: running.length,
    blocksUsed: ledger.used,
    blocksTotal: st.limits.blocksTotal,
    prefillTokensAhead: prefillAhead,
    decodeTokensAhead: w.decode + r.decodeAhead,
    waitingBlocks: w.blocks,
    waitingByClass: w.byClass,
    waitingTokensByClass: w.tokensByClass,
    committedBlocks: w.final + r.committed,
    runningCommittedBlocks: r.committed,
    runningContext: r.context,
    preemptions: st.preemptions,
    steps: st.steps,
  };
}

function enqueue(st: BatchState, s: Sequence, atHead: boolean): void {
  const { limits } = st;
  if (s.promptTokens + s.maxTokens > limits.maxContext) {
    throw new RangeError(
      `sequence ${s.id}: prompt ${s.promptTokens} + max tokens ${s.maxTokens} exceed the context of ${limits.maxContext}`,
    );
  }
  st.byId.set(s.id, s);
  s.running = false;
  st.waiting.push(s, atHead);
}

function withdraw(st: BatchState, id: string): boolean {
  const s = st.byId.get(id);
  if (!s) return false;
  st.byId.delete(id);
  s.gone = true;
  if (s.running) {
    removeRunning(st, s);
    st.ledger.commit(s);
    st.ledger.release(s);
  } else {
    st.waiting.remove(s);
  }
  return true;
}

function evictAll(st: BatchState): Sequence[] {
  const out: Sequence[] = [];
  for (const s of st.running) {
    st.ledger.release(s);
    leaveSlot(st, s);
    s.computed = 0;
    out.push(s);
  }
  st.running.length = 0;
  // Its memory is gone with its sequences: nothing stays cached.
  st.ledger.clearCache();
  out.push(...st.waiting.drain());
  st.byId.clear();
  st.staticOpen = 0;
  for (const s of out) s.gone = true;
  return out;
}

/** Creates a batcher with the given limits. */
export function createContinuousBatcher(limits: ContinuousLimits): ContinuousBatcher {
  const st = createBatchState(limits);
  // stats() is read by every admission for every candidate replica (the estimate and the class totals), so it is
  // computed once per change of the ledger: every change goes through enqueue, plan, complete, withdraw or evictAll,
  // which drop the cached copy before and after (listeners called in the middle may read stats()).
  // (No closure per call: plan and complete run every step.) The running set's sums are O(running) and change only
  // when the running set or its sequences do (plan, complete, evictAll, withdrawing a running sequence): an admission
  // (enqueue) or a waiting sequence's withdrawal changes only the waiting sums, which are kept incrementally, so
  // stats() after them is O(classes), not O(running). Plan sums them at once (see plan).
  let cached: BatcherStats | null = null;
  let run: RunningSums | null = null;
  // A decode run in progress (decode-run.ts): its sequences and the ledger lag behind it until settled, which every
  // entry point that reads or changes them does first.
  let decoding: DecodeRun | null = null;
  const buffers = runBuffers();
  const settle = (): void => {
    if (decoding === null) return;
    const r = decoding;
    decoding = null;
    cached = run = null;
    settleRun(st, r);
  };
  /** The next step of the decode run `p` is in, or of a run `p` starts; false when there is none. */
  const runStep = (p: StepPlan): boolean => {
    if (decoding !== null && decoding.plan === p) {
      if (planRunStep(st, decoding)) return true;
      // Its last step not completed yet (a caller's mistake) or its limit reached: a new run only after a step.
      const open = decoding.completed !== decoding.planned;
      settle();
      if (open) return false;
    }
    settle();
    decoding = startRun(st, p, buffers);
    return decoding !== null && planRunStep(st, decoding);
  };
  return {
    limits,
    settle,
    enqueue: (s, atHead = false) => {
      settle();
      cached = null;
      enqueue(st, s, atHead);
      cached = null;
    },
    plan: (now) => {
      settle();
      cached = run = null;
      const p = planStep(st, now);
      cached = null;
      // Summed now, while planning has just read every running sequence: admissions until the step completes read
      // the sums from here instead of loading each sequence again long after it left the cache.
      run = runningSums(st);
      return p;
    },
    replan: (p, ahead = false) => {
      cached = run = null;
      if (ahead && runStep(p)) return true;
      settle();
      const again = replanDecodes(st, p);
      cached = null;
      return again;
    },
    complete: (p, now) => {
      cached = run = null;
      if (decoding !== null && decoding.plan === p && decoding.completed === decoding.planned - 1)
        return completeRunStep(decoding, now);
      settle();
      completeStep(st, p, now);
      cached = run = null;
    },
    withdraw: (id) => {
      settle();
      cached = null;
      if (st.byId.get(id)?.running === true) run = null;
      const r = withdraw(st, id);
      cached = null;
      return r;
    },
    evictAll: () => {
      settle();
      cached = run = null;
      const r = evictAll(st);
      cached = run = null;
      return r;
    },
    has: (id) => st.byId.has(id),
    cacheChanges: () => st.ledger.takeChanges(),
    hasWork: () => st.running.length > 0 || st.waiting.count > 0,
    saturated: () => {
      if (st.waiting.count === 0) return false;
      if (limits.policy === 'static') return st.running.length > 0;
      return headBlocked(st, st.waiting.peek()!);
    },
    stats: () => {
      settle();
      return (cached ??= batcherStats(st, (run ??= runningSums(st))));
    },
    gauges: () => {
      settle();
      return {
        waiting: st.waiting.count,
        running: st.running.length,
        blocksUsed: st.ledger.used,
        blocksTotal: st.limits.blocksTotal,
      };
    },
    waitingOf: (rank) => ({
      count: st.waiting.sums.byClass[rank] ?? 0,
      tokens: st.waiting.sums.tokensByClass[rank] ?? 0,
    }),
    waitingList: () => st.waiting.list(),
    runningList: () => {
      settle();
      return st.running;
    },
    checkInvariants: (p, owner) => {
      // A step of a decode run: its totals now, its sequences and the ledger when the run settles (the next step
      // planned afresh is checked in full).
      if (decoding !== null && p === decoding.plan) return checkPlanTotals(limits, p);
      settle();
      checkBatchState(st, p, owner);
      if (run !== null) {
        const fresh = runningSums(st);
        if (!sameSums(run, fresh))
          throw new Error(`stale running sums: cached ${JSON.stringify(run)}, ${JSON.stringify(fresh)}`);
      }
      if (cached !== null) {
        const fresh = JSON.stringify(batcherStats(st, runningSums(st)));
        if (JSON.stringify(cached) !== fresh)
          throw new Error(`stale stats: cached ${JSON.stringify(cached)}, ledger ${fresh}`);
      }
    },
  };
}
