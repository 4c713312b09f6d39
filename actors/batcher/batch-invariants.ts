// The continuous batcher's invariants: the ledger matches the sequences, the queues match their counts, and a
// planned step keeps the policy's limits (budget, slots, no mixed steps where the policy forbids them, capacity).
import type { BatchState } from './batch-state.ts';
import { planPasses } from './step-planner.ts';
import type { ContinuousLimits, StepPlan } from './types.ts';

/** Numbers the plan checks: a sequence marked with the current one was met earlier in the same plan. */
let checks = 0;

/** Throws if the step plan breaks the policy's limits, or holds a sequence whose owner is not `owner` (when given). */
export function checkPlan(limits: ContinuousLimits, p: StepPlan, owner?: string): void {
  const check = ++checks;
  let tokens = 0;
  let prefill = 0;
  for (const e of p.entries) {
    if (e.seq.checkedIn === check) throw new Error(`step holds sequence ${e.seq.id} twice`);
    e.seq.checkedIn = check;
    if (owner !== undefined && e.seq.owner !== owner) throw new Error(`step holds ${e.seq.id} for ${e.seq.owner}`);
    tokens += e.chunk > 0 ? e.chunk : 1;
    prefill += e.chunk;
    if (e.seq.computed > limits.maxContext)
      throw new Error(`sequence ${e.seq.id} holds ${e.seq.computed} tokens, past the context of ${limits.maxContext}`);
  }
  if (tokens !== p.tokens || prefill !== p.prefillTokens)
    throw new Error(`step accounts ${p.tokens} tokens, entries hold ${tokens}`);
  // Checked while the step's sequences all still run in the slots it was planned on (before any finished).
  const passes = p.entries.every((e) => e.seq.slot >= 0) ? planPasses(p.entries) : p.shape.passes;
  if (p.shape.passes !== passes) throw new Error(`step prices ${p.shape.passes} passes, its slots take ${passes}`);
  checkPlanTotals(limits, p);
}

/** checkPlan's checks of the plan's totals alone (a decode run's step: its entries are its first step's, checked
 * then; its sequences are checked when the run settles). */
export function checkPlanTotals(limits: ContinuousLimits, p: StepPlan): void {
  if (p.entries.length > limits.maxRunning)
    throw new Error(`step holds ${p.entries.length} sequences, max ${limits.maxRunning}`);
  // Only a single whole prompt longer than the budget may exceed it (prefill-first and static never chunk).
  const lone = p.entries.length === 1 && limits.policy !== 'chunked';
  if (p.tokens > limits.tokenBudget && !lone)
    throw new Error(`step of ${p.tokens} tokens exceeds the budget of ${limits.tokenBudget}`);
  if (limits.policy !== 'chunked' && p.prefillTokens > 0 && p.decodes > 0) {
    throw new Error(`${limits.policy} step mixes prefill and decode`);
  }
  if (p.blocksUsed > limits.blocksTotal)
    throw new Error(`step holds ${p.blocksUsed} blocks, capacity ${limits.blocksTotal}`);
}

/** Throws if the batcher's state is inconsistent, or if `p` (when given) breaks the policy's limits or holds a
 * sequence that is not `owner`'s. */
export function checkBatchState(st: BatchState, p?: StepPlan, owner?: string): void {
  const { running, limits } = st;
  for (const s of running) {
    if (!s.running || s.gone)
      throw new Error(`sequence ${s.id} is in the running set but marked ${s.gone ? 'gone' : 'waiting'}`);
  }
  st.ledger.check(running);
  checkSlots(st);
  if (running.length > limits.maxRunning) throw new Error(`running ${running.length} exceeds max ${limits.maxRunning}`);
  st.waiting.check();
  if (limits.policy === 'static' && running.length > st.staticOpen)
    throw new Error(`static batch grew to ${running.length} past its ${st.staticOpen} members`);
  if (p) checkPlan(limits, p, owner);
}

/** Throws unless every running sequence holds its own slot within the table and the table holds no other. */
function checkSlots(st: BatchState): void {
  const seen = new Set<number>();
  for (const s of st.running) {
    if (!Number.isInteger(s.slot) || s.slot < 0 || s.slot >= st.slots.size)
      throw new Error(`sequence ${s.id} runs in slot ${s.slot}, outside 0…${st.slots.size - 1}`);
    if (seen.has(s.slot)) throw new Error(`slot ${s.slot} holds two running sequences`);
    if (!st.slots.has(s.slot)) throw new Error(`sequence ${s.id} runs in slot ${s.slot}, which the table holds free`);
    seen.add(s.slot);
  }
  if (st.slots.used !== seen.size) throw new Error(`${st.slots.used} slots in use for ${seen.size} running sequences`);
}
