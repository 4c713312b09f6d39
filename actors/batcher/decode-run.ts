// A decode run: consecutive pure-decode steps of an unchanged running set, stepped in O(1) each and applied to the
// sequences in one pass when anything reads them (settle).
//
// Once every running sequence decodes (nothing waits, none is mid-prefill, all with one listener whose previous
// tokens came at one time), the next steps differ only by token counts until a sequence finishes or the cache runs
// out: step j's context is the run's start context plus j per sequence, the blocks in use are known ahead (each
// sequence needs a new block every `blockTokens` tokens), and each completed step gives every sequence one token
// `gap` after the last (one sameGap call). The run plans at most as many steps as no sequence finishes in and the
// cache holds, so each of its steps is what planStep and completeStep would do. Sequences and ledger are left as the
// run found them until settle() applies the planned growth and the completed tokens, as those steps would have.
import type { Sequence, SequenceListener } from './sequence.ts';
import type { BatchState } from './batch-state.ts';
import { wasWholeDecode } from './step-planner.ts';
import type { StepPlan } from './types.ts';

/** Steps a run plans ahead at most (its set-up is O(sequences + steps)). */
export const MAX_RUN_STEPS = 64;

/** A run in progress. */
export interface DecodeRun {
  /** The plan each of its steps reuses (entries: the running set, in its order). */
  readonly plan: StepPlan;
  readonly listener: SequenceListener;
  /** Steps planned and completed so far (completed is planned or planned - 1). */
  planned: number;
  completed: number;
  /** Steps it may plan: no sequence finishes in them, the cache holds their growth. */
  readonly limit: number;
  /** Context of the running set when the run started (sum of computed), and its size. */
  readonly context: number;
  readonly n: number;
  /** Blocks in use once step j is planned (index j, from 1). */
  readonly used: Int32Array;
  /** When the last completed step (or the step before the run) gave every sequence its token. */
  lastAt: number;
}

/** Scratch space of one batcher's runs (one at a time): blocks grown and in use per step ahead. */
export interface RunBuffers {
  readonly grows: Int32Array;
  readonly used: Int32Array;
}

/** Each plan's run while one plans its steps (a run reuses its plan; settling it ends it): what a core reads to know
 * how many more steps its run may plan. */
const runsByPlan = new WeakMap<StepPlan, DecodeRun>();

/** Steps the decode run `p` is a step of may still plan after the ones planned so far (0: `p` is in no run). */
export function runStepsLeft(p: StepPlan): number {
  const r = runsByPlan.get(p);
  return r === undefined ? 0 : r.limit - r.planned;
}

export const runBuffers = (): RunBuffers => ({
  grows: new Int32Array(MAX_RUN_STEPS + 1),
  used: new Int32Array(MAX_RUN_STEPS + 1),
});

/** Whether `p`, just completed, starts a run (in `buf`, which the run then holds); the run (nothing changed yet) or
 * null. */
export function startRun(st: BatchState, p: StepPlan, buf: RunBuffers): DecodeRun | null {
  const { running } = st;
  const entries = p.entries;
  const n = entries.length;
  if (!wasWholeDecode(st, p) || st.victims.size > 0) return null;
  const s0 = running[0]!;
  const listener = s0.listener;
  const lastAt = s0.lastTokenAt;
  if (listener.sameGap === undefined || !(lastAt >= 0)) return null;
  let limit = MAX_RUN_STEPS;
  let context = 0;
  for (let i = 0; i < n; i++) {
    const s = running[i]!;
    if (entries[i]!.seq !== s || s.gone || !s.running || s.computed < s.prefillGoal || s.awaitingToken) return null;
    if (s.listener !== listener || s.lastTokenAt !== lastAt || s.tokens !== undefined) return null;
    // Its last token comes in step outputTokens - generated: the run stops before it.
    limit = Math.min(limit, s.outputTokens - s.generated - 1);
    context += s.computed;
  }
  if (limit < 1) return null;
  const last = blocksAhead(st, limit, buf);
  if (last < 1) return null;
  const r: DecodeRun = { plan: p, listener, planned: 0, completed: 0, limit: last, context, n, used: buf.used, lastAt };
  runsByPlan.set(p, r);
  return r;
}

/** Fills `buf.used` with the blocks in use once each of the next steps is planned (from step 1), up to `limit` steps
 * or the last the cache holds, and returns that last step (0: none). Sequence i holding b blocks with c tokens
 * grows at step b·B - c + 1, then every B steps. */
function blocksAhead(st: BatchState, limit: number, buf: RunBuffers): number {
  const { running, ledger } = st;
  const B = st.limits.blockTokens;
  const { grows, used } = buf;
  grows.fill(0, 0, limit + 1);
  for (let i = 0; i < running.length; i++) {
    const s = running[i]!;
    for (let j = Math.max(1, (s.blocks + s.cached) * B - s.computed + 1); j <= limit; j += B) grows[j]!++;
  }
  let u = ledger.used;
  used[0] = u;
  for (let j = 1; j <= limit; j++) {
    u += grows[j]!;
    if (u > st.limits.blocksTotal) return j - 1;
    used[j] = u;
  }
  return limit;
}

/** Plans the run's next step in its plan; false when it may not (the run is over: settle, then plan afresh). */
export function planRunStep(st: BatchState, r: DecodeRun): boolean {
  if (r.planned >= r.limit || r.completed !== r.planned) return false;
  const j = ++r.planned;
  const p = r.plan;
  p.shape.decodeContext = r.context + r.n * j;
  p.blocksUsed = r.used[j]!;
  p.predictedMs = 0;
  p.dispatchedAt = 0;
  st.steps++;
  return true;
}

/** Completes the run's planned step at `now`: every sequence's token, `now - lastAt` after its last. */
export function completeRunStep(r: DecodeRun, now: number): void {
  r.completed++;
  r.listener.sameGap!(r.n, now - r.lastAt);
  r.lastAt = now;
}

/** Applies the run to the sequences and the ledger: the growth of every planned step, the tokens of every completed
 * one, the time of the last (what those steps' planStep and completeStep would have left). */
export function settleRun(st: BatchState, r: DecodeRun): void {
  if (runsByPlan.get(r.plan) === r) runsByPlan.delete(r.plan);
  const entries = r.plan.entries;
  const { planned, completed } = r;
  for (let i = 0; i < entries.length; i++) {
    const s: Sequence = entries[i]!.seq;
    if (planned > 0 && !st.ledger.grow(s, s.computed + planned))
      throw new Error(`decode run: sequence ${s.id} cannot grow to ${s.computed + planned} tokens`);
    s.computed += completed;
    s.generated += completed;
    if (completed > 0) s.lastTokenAt = r.lastAt;
  }
}
