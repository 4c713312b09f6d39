// Step planning: which sequences run in the next iteration and how many tokens each processes, per policy.
// - chunked (Sarathi-Serve): decodes first, then the prefill of running sequences continues, then waiting ones
//   are admitted, all in chunks that fill what is left of the token budget.
// - prefill-first (vLLM's original scheduler): when waiting prompts can be admitted, the step is prefill only,
//   packing whole prompts within the budget (a prompt longer than the budget runs alone); otherwise it decodes.
// - static (request-level batching): when nothing runs, a batch is formed from the queue (up to maxRunning, each
//   member's prompt + maxTokens reserved up front); its prompts run as prefill-only steps, then it decodes until
//   every member has finished, and only then is the next batch formed.
// Planning allocates the KV blocks the step writes, and preempts (preemption.ts) when they run out.
import type { PrefillChunk } from '../gpu/cost-model.ts';
import { insertRunning, spareBlocks, type BatchState } from './batch-state.ts';
import { preemptForPriority, preemptOne, tooLarge } from './preemption.ts';
import { prefillTarget, type Sequence } from './sequence.ts';
import type { SlotPick } from './slot-prefix.ts';
import { passes } from './slots.ts';
import type { PlanEntry, StepPlan } from './types.ts';

const newPlan = (): StepPlan => ({
  entries: [],
  shape: { prefill: [] as PrefillChunk[], decodeBatch: 0, decodeContext: 0, passes: 0 },
  tokens: 0,
  prefillTokens: 0,
  decodes: 0,
  blocksUsed: 0,
  predictedMs: 0,
  dispatchedAt: 0,
});

function addDecode(plan: StepPlan, s: Sequence): void {
  plan.entries.push((s.decodeEntry ??= { seq: s, chunk: 0 }));
  plan.shape.decodeBatch++;
  plan.shape.decodeContext += s.computed + 1;
  plan.tokens++;
  plan.decodes++;
}

function addPrefill(plan: StepPlan, s: Sequence, chunk: number): void {
  plan.entries.push({ seq: s, chunk });
  (plan.shape.prefill as PrefillChunk[]).push({ tokens: chunk, cached: s.computed });
  plan.tokens += chunk;
  plan.prefillTokens += chunk;
}

/** The slot a waiting sequence with token ids takes when prefixes are kept by slot (slot-prefix.ts), and the tokens
 * its cells already hold; null otherwise (the lowest free slot, and the block cache if any). */
function slotStart(st: BatchState, s: Sequence, goal: number): SlotPick | null {
  const kept = st.ledger.slotPrefix;
  return kept !== null && s.tokens !== undefined ? kept.pick(s, goal, st.slots) : null;
}

/** Moves the queue head s to the running set, with the prefix it starts with (its slot's kept cells, or cached blocks)
 * and blocks for `reserveTokens` tokens in all. */
function schedule(st: BatchState, s: Sequence, now: number, reserveTokens: number, start: SlotPick | null): void {
  st.waiting.shift(s);
  s.prefillGoal = prefillTarget(s);
  insertRunning(st, s, start?.slot ?? -1);
  if (start !== null) {
    st.ledger.slotPrefix!.take(start.slot, start.tokens);
    s.computed = start.tokens;
  } else s.computed = st.ledger.attach(s, s.prefillGoal);
  st.ledger.reserve(s, reserveTokens);
  s.listener.scheduled(s, now);
}

/** Decodes every running sequence that has finished prefill; preempts the newest when blocks run out. */
function planDecodes(st: BatchState, plan: StepPlan, now: number): void {
  const { running } = st;
  for (let i = 0; i < running.length; i++) {
    const s = running[i]!;
    if (s.computed < s.prefillGoal) continue;
    if (plan.tokens >= st.limits.tokenBudget) break;
    // Victims come from the end of `running`, past i, so nothing already in the plan is preempted.
    while (s.computed + 1 > (s.blocks + s.cached) * st.limits.blockTokens && !st.ledger.grow(s, s.computed + 1)) {
      if (running.length === 1) throw tooLarge(st, s);
      const v = preemptOne(st, now);
      if (v === s || v === undefined) break;
    }
    if (s.running) addDecode(plan, s);
  }
}

/** Continues running sequences whose prefill is not complete, in chunks within the budget and the free blocks. */
function planPrefillContinuations(st: BatchState, plan: StepPlan, whole: boolean): void {
  const B = st.limits.blockTokens;
  for (const s of st.running) {
    if (s.computed >= s.prefillGoal) continue;
    const room = st.limits.tokenBudget - plan.tokens;
    if (room <= 0) break;
    const left = s.prefillGoal - s.computed;
    if (whole && left > room && plan.tokens > 0) continue;
    // Shrunk to what its blocks plus the free ones hold; a sequence with no room waits (planStep preempts if stuck).
    const fit = (s.blocks + s.cached + st.ledger.free()) * B - s.computed;
    const chunk = Math.min(left, whole ? left : room, fit);
    if (chunk <= 0 || (whole && chunk < left)) continue;
    st.ledger.grow(s, s.computed + chunk);
    addPrefill(plan, s, chunk);
  }
}

/** A prompt that finds nothing in the block cache. */
const NO_HIT: { readonly blocks: number; readonly idle: number } = Object.freeze({ blocks: 0, idle: 0 });

/** Admits waiting sequences while slots, budget and blocks allow; `whole` forbids chunking a prompt. */
function planAdmissions(st: BatchState, plan: StepPlan, now: number, whole: boolean): void {
  for (;;) {
    if (st.running.length >= st.limits.maxRunning) return;
    const s = st.waiting.peek();
    if (!s || st.victims.has(s)) return;
    const goal = prefillTarget(s);
    const room = st.limits.tokenBudget - plan.tokens;
    if (room <= 0) return;
    // What its prompt finds in the prefix cache or its slot's kept cells is not prefilled again (taking an idle
    // cached block makes it in use).
    const B = st.limits.blockTokens;
    const start = slotStart(st, s, goal);
    const hit = start === null ? st.ledger.peekCached(s, goal) : NO_HIT;
    const spare = spareBlocks(st) - hit.idle;
    // Kept cells become the sequence's own blocks: it reuses no more than the free blocks hold beside a token to
    // prefill, so reuse never holds up an admission that would go ahead without it.
    if (start !== null && !whole && start.tokens >= spare * B) start.tokens = Math.max(0, spare * B - 1);
    const cachedTokens = start === null ? hit.blocks * B : start.tokens;
    const left = goal - cachedTokens;
    if (whole && left > room && plan.tokens > 0) return;
    const fit = start === null ? spare * B : spare * B - cachedTokens;
    const chunk = whole ? left : Math.min(left, room, fit);
    if (chunk <= 0 || st.ledger.blocksFor(cachedTokens + chunk) - hit.blocks > spare) return;
    schedule(st, s, now, cachedTokens + chunk, start);
    addPrefill(plan, s, chunk);
  }
}

/** Static batching: forms a batch when nothing runs; its prompts run whole first, then all members decode. */
function planStatic(st: BatchState, p: StepPlan, now: number): void {
  const { running, ledger } = st;
  if (running.length === 0) {
    st.staticOpen = 0;
    for (;;) {
      if (running.length >= st.limits.maxRunning) break;
      const s = st.waiting.peek();
      if (!s) break;
      // The whole sequence is reserved up front; a first member larger than the cache gets what there is.
      const full = s.promptTokens + s.maxTokens;
      const reserve =
        running.length === 0
          ? Math.max(prefillTarget(s) + 1, Math.min(full, ledger.free() * st.limits.blockTokens))
          : full;
      if (ledger.blocksFor(reserve) > ledger.free()) break;
      schedule(st, s, now, reserve, slotStart(st, s, prefillTarget(s)));
      st.staticOpen++;
    }
  }
  planPrefillContinuations(st, p, true);
  if (p.tokens === 0) planDecodes(st, p, now);
}

function compose(st: BatchState, now: number): StepPlan {
  const p = newPlan();
  if (st.limits.policy === 'chunked') {
    preemptForPriority(st, now);
    const before = st.preemptions;
    planDecodes(st, p, now);
    planPrefillContinuations(st, p, false);
    // As in vLLM: a step that had to preempt for memory admits nothing new.
    if (st.preemptions === before) planAdmissions(st, p, now, false);
  } else if (st.limits.policy === 'prefill-first') {
    preemptForPriority(st, now);
    planPrefillContinuations(st, p, true);
    if (p.tokens === 0) planAdmissions(st, p, now, true);
    if (p.tokens === 0) planDecodes(st, p, now);
  } else {
    planStatic(st, p, now);
  }
  return p;
}

/** Empties the victims of the step before (Set.clear allocates a new table even for an empty set: checked first). */
function clearVictims(st: BatchState): void {
  if (st.victims.size > 0) st.victims.clear();
}

/** Plans the next step, allocating KV blocks and preempting if blocks run out; null only when there is no work. */
export function planStep(st: BatchState, now: number): StepPlan | null {
  clearVictims(st);
  let p = compose(st, now);
  // Every running sequence may be mid-prefill with no block left to grow into: free the newest and retry.
  while (p.entries.length === 0 && st.running.length > 0) {
    if (st.running.length === 1) throw tooLarge(st, st.running[0]!);
    preemptOne(st, now);
    p = compose(st, now);
  }
  // Nothing runs, so a victim of this very step may start again at once.
  if (p.entries.length === 0 && st.waiting.count > 0) {
    st.victims.clear();
    p = compose(st, now);
  }
  if (p.entries.length === 0) {
    if (st.waiting.count > 0)
      throw new Error(
        `sequence ${st.waiting.peek()!.id} can never be admitted with ${st.limits.blocksTotal} KV blocks`,
      );
    return null;
  }
  p.blocksUsed = st.ledger.used;
  (p.shape as { passes: number }).passes = planPasses(p.entries);
  st.steps++;
  return p;
}

/** Scratch of planPasses: each entry's slot and tokens. */
let slotsOf = new Int32Array(64);
let tokensOf = new Int32Array(64);

/** The passes (llama.cpp micro-batches) of a plan's entries over their sequences' slots, queued in ascending slot
 * order (slots.ts). */
export function planPasses(entries: readonly PlanEntry[]): number {
  const n = entries.length;
  if (slotsOf.length < n) {
    slotsOf = new Int32Array(n * 2);
    tokensOf = new Int32Array(n * 2);
  }
  for (let i = 0; i < n; i++) {
    const e = entries[i]!;
    slotsOf[i] = e.seq.slot;
    tokensOf[i] = e.chunk > 0 ? e.chunk : 1;
  }
  return passes(slotsOf, tokensOf, n);
}

/** Whether `p` decoded the whole running set (as many sequences, no prefill, within the token budget) and nothing
 * waits: the first condition for its next step to be the same pure decode (here, and for a decode run). */
export function wasWholeDecode(st: BatchState, p: StepPlan): boolean {
  const n = p.entries.length;
  return (
    n > 0 &&
    n === st.running.length &&
    p.decodes === n &&
    p.prefillTokens === 0 &&
    st.waiting.count === 0 &&
    n <= st.limits.tokenBudget
  );
}

/**
 * Plans the next step in place of `p`, the step just completed, when it is the same pure decode: `p` decoded every
 * running sequence, none has left or joined since, nothing waits, and every sequence's next token fits in its blocks
 * or the free ones. That is what planStep would plan then under every policy (nothing to preempt for, continue or
 * admit; every decode within the budget), so the plan is the same but for its context and blocks, and the sequences'
 * growth is the same. False when it is not: planStep plans it (the blocks grown here are then already held, as
 * planStep would grow them first, in the same order).
 */
export function replanDecodes(st: BatchState, p: StepPlan): boolean {
  const { running, ledger } = st;
  const entries = p.entries;
  const n = entries.length;
  if (!wasWholeDecode(st, p)) return false;
  for (let i = 0; i < n; i++) {
    const s = running[i]!;
    if (entries[i]!.seq !== s || s.computed < s.prefillGoal || s.gone) return false;
  }
  clearVictims(st);
  const B = st.limits.blockTokens;
  let context = 0;
  for (let i = 0; i < n; i++) {
    const s = running[i]!;
    // grow() does nothing while the next token fits in the blocks held (the common case: no division then).
    if (s.computed + 1 > (s.blocks + s.cached) * B && !ledger.grow(s, s.computed + 1)) return false;
    context += s.computed + 1;
  }
  p.shape.decodeContext = context;
  p.blocksUsed = ledger.used;
  p.predictedMs = 0;
  p.dispatchedAt = 0;
  st.steps++;
  return true;
}
