// Iteration-level (continuous) batching for one generative replica, over a paged KV-cache ledger.
import type { StepShape, PrefillChunk } from '../gpu/cost-model.ts';
import { createDeque, type Deque } from './deque.ts';
import { prefillTarget, type Sequence } from './sequence.ts';

/** How a replica composes each step. */
export type BatchPolicy = 'chunked' | 'prefill-first' | 'static';

/** Limits of a replica's iteration loop. */
export interface ContinuousLimits {
  policy: BatchPolicy;
  maxRunning: number;
  /** Tokens (prefill + decode) one step may process. */
  tokenBudget: number;
  blockTokens: number;
  blocksTotal: number;
  maxContext: number;
  /** Free blocks kept back when admitting new sequences, so running ones can grow (vLLM's watermark). */
  watermarkBlocks: number;
}

/** One sequence's part in a step. */
export interface PlanEntry {
  seq: Sequence;
  /** Prefill tokens in this step; 0 for a decode. */
  chunk: number;
}

/** A planned step: who runs, the shape the cost model prices, and the blocks it holds. */
export interface StepPlan {
  entries: PlanEntry[];
  shape: StepShape;
  tokens: number;
  prefillTokens: number;
  decodes: number;
}

/** The batcher of one replica: queues, running set, block ledger, and step planning. */
export interface ContinuousBatcher {
  readonly limits: ContinuousLimits;
  /** Adds a sequence to the waiting queue (preempted/resumed ones at the head of their class). */
  enqueue(seq: Sequence, atHead?: boolean): void;
  /** Plans the next step, allocating KV blocks and preempting if blocks run out; null when there is nothing to run. */
  plan(now: number): StepPlan | null;
  /** Applies a step all ranks completed: produces tokens, frees finished sequences. */
  complete(plan: StepPlan, now: number): void;
  /** Removes a sequence (cancelled or expired); returns false if it is not here. */
  withdraw(id: string): boolean;
  /** Removes every sequence (replica failed or drained past its deadline) and returns them. */
  evictAll(): Sequence[];
  has(id: string): boolean;
  hasWork(): boolean;
  saturated(): boolean;
  stats(): BatcherStats;
  /** Throws if the ledger disagrees with the sequences' allocations. */
  checkInvariants(): void;
}

/** What the router and the ledger read from a batcher. */
export interface BatcherStats {
  waiting: number;
  running: number;
  blocksUsed: number;
  blocksTotal: number;
  /** Prefill tokens not yet computed, waiting and running. */
  prefillTokensAhead: number;
  /** Expected decode tokens still to produce, by the ledger's estimate. */
  decodeTokensAhead: number;
  /** Blocks the waiting queue will need for its prefill. */
  waitingBlocks: number;
  /** Waiting sequences and their prefill tokens per priority class (index = class rank). */
  waitingByClass: readonly number[];
  waitingTokensByClass: readonly number[];
  /** Total context of the running sequences. */
  runningContext: number;
  preemptions: number;
  steps: number;
}

/** Creates a batcher with the given limits. */
export function createContinuousBatcher(limits: ContinuousLimits): ContinuousBatcher {
  const B = limits.blockTokens;
  const blocksFor = (tokens: number): number => Math.ceil(tokens / B);
  const classes: Deque[] = [];
  const running: Sequence[] = [];
  const byId = new Map<string, Sequence>();
  let used = 0;
  let runCounter = 0;
  let preemptions = 0;
  let steps = 0;
  let waitingCount = 0;
  let staticLocked = false;
  // Incremental sums over the waiting queue, so stats() costs O(running), not O(queue).
  const wCount: number[] = [];
  const wTokens: number[] = [];
  let wBlocks = 0;
  let wDecode = 0;
  const account = (s: Sequence, sign: 1 | -1): void => {
    const goal = prefillTarget(s);
    while (wCount.length <= s.priority) {
      wCount.push(0);
      wTokens.push(0);
    }
    wCount[s.priority]! += sign;
    wTokens[s.priority]! += sign * goal;
    wBlocks += sign * blocksFor(goal + 1);
    wDecode += sign * Math.max(0, s.estOutputTokens - s.generated);
  };

  const queueOf = (p: number): Deque => {
    while (classes.length <= p) classes.push(createDeque());
    return classes[p]!;
  };
  const peekWaiting = (): Sequence | undefined => {
    for (const q of classes) {
      const s = q.peek();
      if (s) return s;
    }
    return undefined;
  };
  const free = (): number => limits.blocksTotal - used;
  const release = (s: Sequence): void => {
    used -= s.blocks;
    s.blocks = 0;
  };
  const removeRunning = (s: Sequence): void => {
    const i = running.indexOf(s);
    if (i >= 0) running.splice(i, 1);
    s.running = false;
  };
  const insertRunning = (s: Sequence): void => {
    s.running = true;
    s.runOrder = ++runCounter;
    // Kept ordered by (priority, runOrder): higher classes first, oldest first.
    let i = running.length;
    while (i > 0 && running[i - 1]!.priority > s.priority) i--;
    running.splice(i, 0, s);
  };
  const pushWaiting = (s: Sequence, atHead: boolean): void => {
    const q = queueOf(s.priority);
    if (atHead) q.unshift(s);
    else q.push(s);
    waitingCount++;
    account(s, 1);
  };
  const shiftWaiting = (s: Sequence): void => {
    queueOf(s.priority).shift();
    waitingCount--;
    account(s, -1);
  };
  /** The victim for preemption: lowest class first, newest within it (last in `running`). */
  const preemptOne = (now: number): Sequence | undefined => {
    const victim = running[running.length - 1];
    if (!victim) return undefined;
    running.pop();
    victim.running = false;
    release(victim);
    victim.computed = 0;
    preemptions++;
    pushWaiting(victim, true);
    victim.listener.preempted(victim, now);
    return victim;
  };
  const schedule = (s: Sequence, now: number, reserveTokens: number): void => {
    shiftWaiting(s);
    s.prefillGoal = prefillTarget(s);
    s.computed = 0;
    insertRunning(s);
    const need = blocksFor(reserveTokens);
    used += need;
    s.blocks = need;
    s.listener.scheduled(s, now);
  };
  /** Grows s's allocation to cover `tokens` cached tokens; false if the blocks are not free. */
  const grow = (s: Sequence, tokens: number): boolean => {
    const need = blocksFor(tokens) - s.blocks;
    if (need <= 0) return true;
    if (need > free()) return false;
    used += need;
    s.blocks += need;
    return true;
  };

  const newPlan = (): StepPlan => ({
    entries: [],
    shape: { prefill: [] as PrefillChunk[], decodeBatch: 0, decodeContext: 0 },
    tokens: 0,
    prefillTokens: 0,
    decodes: 0,
  });
  const addDecode = (plan: StepPlan, s: Sequence): void => {
    plan.entries.push({ seq: s, chunk: 0 });
    plan.shape.decodeBatch++;
    plan.shape.decodeContext += s.computed + 1;
    plan.tokens++;
    plan.decodes++;
  };
  const addPrefill = (plan: StepPlan, s: Sequence, chunk: number): void => {
    plan.entries.push({ seq: s, chunk });
    (plan.shape.prefill as PrefillChunk[]).push({ tokens: chunk, cached: s.computed });
    plan.tokens += chunk;
    plan.prefillTokens += chunk;
  };

  /** Decodes every running sequence that has finished prefill, preempting the newest when blocks run out. */
  const planDecodes = (plan: StepPlan, now: number): void => {
    for (let i = 0; i < running.length; i++) {
      const s = running[i]!;
      if (s.computed < s.prefillGoal) continue;
      if (plan.tokens >= limits.tokenBudget) break;
      while (!grow(s, s.computed + 1)) {
        const v = preemptOne(now);
        if (v === s || v === undefined) break;
      }
      // A sequence that preempted itself was the last one: the loop ends on its own.
      if (s.running) addDecode(plan, s);
    }
  };
  /** Continues running sequences whose prefill is not complete, in chunks within the budget. */
  const planPrefillContinuations = (plan: StepPlan): void => {
    for (const s of running) {
      if (s.computed >= s.prefillGoal) continue;
      const room = limits.tokenBudget - plan.tokens;
      if (room <= 0) break;
      const chunk = Math.min(s.prefillGoal - s.computed, room);
      if (!grow(s, s.computed + chunk)) continue;
      addPrefill(plan, s, chunk);
    }
  };
  /** Admits waiting sequences while slots, budget and blocks allow; `whole` forbids chunking. */
  const planAdmissions = (plan: StepPlan, now: number, whole: boolean, reserveAll: boolean): void => {
    for (;;) {
      if (running.length >= limits.maxRunning) return;
      const s = peekWaiting();
      if (!s) return;
      const goal = prefillTarget(s);
      const room = limits.tokenBudget - plan.tokens;
      if (room <= 0) return;
      if (whole && goal > room && plan.tokens > 0) return;
      const chunk = whole ? goal : Math.min(goal, room);
      const reserve = reserveAll ? s.promptTokens + s.maxTokens : chunk;
      if (blocksFor(reserve) > free() - (running.length > 0 ? limits.watermarkBlocks : 0)) return;
      schedule(s, now, reserve);
      addPrefill(plan, s, chunk);
    }
  };

  const plan = (now: number): StepPlan | null => {
    const p = newPlan();
    if (limits.policy === 'chunked') {
      planDecodes(p, now);
      planPrefillContinuations(p);
      planAdmissions(p, now, false, false);
    } else if (limits.policy === 'prefill-first') {
      planPrefillContinuations(p);
      if (p.tokens === 0) planAdmissions(p, now, true, false);
      if (p.tokens === 0) planDecodes(p, now);
    } else {
      if (running.length === 0) staticLocked = false;
      if (!staticLocked) {
        planAdmissions(p, now, true, true);
        if (p.tokens > 0) staticLocked = true;
      }
      if (p.tokens === 0) planPrefillContinuations(p);
      if (p.tokens === 0) planDecodes(p, now);
    }
    if (p.entries.length === 0) return null;
    steps++;
    return p;
  };

  const finish = (s: Sequence, now: number): void => {
    removeRunning(s);
    release(s);
    byId.delete(s.id);
    s.listener.finished(s, now);
  };

  const complete = (p: StepPlan, now: number): void => {
    for (const e of p.entries) {
      const s = e.seq;
      if (s.gone || !s.running) continue;
      if (e.chunk > 0) {
        s.computed += e.chunk;
        if (s.computed < s.prefillGoal) continue;
      } else {
        s.computed += 1;
      }
      s.generated++;
      if (s.firstTokenAt < 0) s.firstTokenAt = now;
      s.listener.tokens(s, 1, now);
      s.lastTokenAt = now;
      if (s.generated >= s.outputTokens) finish(s, now);
    }
  };

  const stats = (): BatcherStats => {
    let prefillAhead = 0;
    let decodeAhead = wDecode;
    let ctx = 0;
    for (const s of running) {
      prefillAhead += s.prefillGoal - s.computed;
      decodeAhead += Math.max(0, s.estOutputTokens - s.generated);
      ctx += s.computed;
    }
    for (const t of wTokens) prefillAhead += t;
    return {
      waiting: waitingCount,
      running: running.length,
      blocksUsed: used,
      blocksTotal: limits.blocksTotal,
      prefillTokensAhead: prefillAhead,
      decodeTokensAhead: decodeAhead,
      waitingBlocks: wBlocks,
      waitingByClass: wCount,
      waitingTokensByClass: wTokens,
      runningContext: ctx,
      preemptions,
      steps,
    };
  };

  return {
    limits,
    enqueue: (s, atHead = false) => {
      byId.set(s.id, s);
      s.running = false;
      pushWaiting(s, atHead);
    },
    plan,
    complete,
    withdraw: (id) => {
      const s = byId.get(id);
      if (!s) return false;
      byId.delete(id);
      s.gone = true;
      if (s.running) {
        removeRunning(s);
        release(s);
      } else if (queueOf(s.priority).remove(s)) {
        waitingCount--;
        account(s, -1);
      }
      return true;
    },
    evictAll: () => {
      const out: Sequence[] = [];
      for (const s of running) {
        release(s);
        s.running = false;
        s.computed = 0;
        out.push(s);
      }
      running.length = 0;
      for (const q of classes) {
        for (let s = q.shift(); s; s = q.shift()) out.push(s);
      }
      waitingCount = 0;
      wCount.fill(0);
      wTokens.fill(0);
      wBlocks = 0;
      wDecode = 0;
      byId.clear();
      staticLocked = false;
      for (const s of out) s.gone = true;
      return out;
    },
    has: (id) => byId.has(id),
    hasWork: () => running.length > 0 || waitingCount > 0,
    saturated: () => {
      if (running.length >= limits.maxRunning) return waitingCount > 0;
      const head = peekWaiting();
      return head !== undefined && blocksFor(prefillTarget(head) + 1) > free();
    },
    stats,
    checkInvariants: () => {
      let sum = 0;
      for (const s of running) sum += s.blocks;
      if (sum !== used) throw new Error(`ledger drift: blocks used ${used}, sequences hold ${sum}`);
      if (used > limits.blocksTotal) throw new Error(`blocks in use ${used} exceed capacity ${limits.blocksTotal}`);
      if (used < 0) throw new Error(`negative blocks in use ${used}`);
      if (running.length > limits.maxRunning) throw new Error(`running ${running.length} exceeds max ${limits.maxRunning}`);
    },
  };
}
