// Iteration-level (continuous) batching for one generative replica, over a paged KV-cache ledger.
//
// Step composition per policy (every step decodes at most one token per running sequence):
// - chunked (Sarathi-Serve): decodes first, then the prefill of running sequences continues, then waiting ones
//   are admitted, all in chunks that fill what is left of the token budget.
// - prefill-first (vLLM's original scheduler): when waiting prompts can be admitted, the step is prefill only,
//   packing whole prompts within the budget (a prompt longer than the budget runs alone); otherwise it decodes.
// - static (request-level batching): when nothing runs, a batch is formed from the queue (up to maxRunning, each
//   member's prompt + maxTokens reserved up front); its prompts run as prefill-only steps, then it decodes until
//   every member has finished, and only then is the next batch formed.
// KV blocks are allocated as sequences grow and freed when they finish. When a sequence cannot grow, the newest
// running sequence of the lowest class is preempted by recompute: its blocks are freed, it goes back to the head
// of its class queue, and when scheduled again it re-prefills its prompt plus the tokens it has already streamed.
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
  /** Prompt plus output tokens one sequence may hold. */
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
  /** Blocks in use on the replica once the step's allocations are made (what the worker's cache holds). */
  blocksUsed: number;
  /** Step time the replica's cost model predicts, and when the step was sent (set by the replica, for estimate error). */
  predictedMs: number;
  dispatchedAt: number;
}

/** The batcher of one replica: queues, running set, block ledger, and step planning. */
export interface ContinuousBatcher {
  readonly limits: ContinuousLimits;
  /** Adds a sequence to the waiting queue (preempted/resumed ones at the head of their class). */
  enqueue(seq: Sequence, atHead?: boolean): void;
  /** Plans the next step, allocating KV blocks and preempting if blocks run out; null only when there is no work. */
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
  /** Waiting sequences in the order they will be admitted (highest class first); O(queue), for tests and views. */
  waitingList(): Sequence[];
  /** Running sequences, highest class and oldest first. */
  runningList(): readonly Sequence[];
  /** Throws if the ledger disagrees with the sequences' allocations, or if `plan` broke the policy's limits. */
  checkInvariants(plan?: StepPlan): void;
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
  /** Blocks every running and waiting sequence will hold at its expected final length (at least what it holds
   * now: static reservations included), the ledger's committed KV. */
  committedBlocks: number;
  /** The part of committedBlocks held or still to be written by running sequences. */
  runningCommittedBlocks: number;
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
  // Incremental sums over the waiting queue, so stats() costs O(running), not O(queue).
  const wCount: number[] = [];
  const wTokens: number[] = [];
  let wBlocks = 0;
  let wDecode = 0;
  let wFinal = 0;
  /** Blocks a sequence will hold at its expected final length. */
  const finalBlocks = (s: Sequence): number => blocksFor(s.promptTokens + Math.max(s.generated + 1, s.estOutputTokens));
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
    wFinal += sign * finalBlocks(s);
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
  // Victims preempted while planning the current step: they are not re-admitted in the same step.
  const victims = new Set<Sequence>();
  /** Preempts the newest running sequence of the lowest class (the last in `running`). */
  const preemptOne = (now: number): Sequence | undefined => {
    const victim = running[running.length - 1];
    if (!victim) return undefined;
    running.pop();
    victim.running = false;
    release(victim);
    victim.computed = 0;
    preemptions++;
    victims.add(victim);
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
    blocksUsed: 0,
    predictedMs: 0,
    dispatchedAt: 0,
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

  /** Decodes every running sequence that has finished prefill; preempts the newest when blocks run out. */
  const planDecodes = (plan: StepPlan, now: number): void => {
    for (let i = 0; i < running.length; i++) {
      const s = running[i]!;
      if (s.computed < s.prefillGoal) continue;
      if (plan.tokens >= limits.tokenBudget) break;
      // Victims come from the end of `running`, past i, so nothing already in the plan is preempted.
      while (!grow(s, s.computed + 1)) {
        if (running.length === 1)
          throw new Error(`sequence ${s.id} needs more KV blocks than the replica has (${limits.blocksTotal})`);
        const v = preemptOne(now);
        if (v === s || v === undefined) break;
      }
      if (s.running) addDecode(plan, s);
    }
  };
  /** Continues running sequences whose prefill is not complete, in chunks within the budget and the free blocks. */
  const planPrefillContinuations = (plan: StepPlan, whole: boolean): void => {
    for (const s of running) {
      if (s.computed >= s.prefillGoal) continue;
      const room = limits.tokenBudget - plan.tokens;
      if (room <= 0) break;
      const left = s.prefillGoal - s.computed;
      if (whole && left > room && plan.tokens > 0) continue;
      // Shrunk to what its blocks plus the free ones hold; a sequence with no room waits (plan() preempts if stuck).
      const fit = (s.blocks + free()) * B - s.computed;
      const chunk = Math.min(left, whole ? left : room, fit);
      if (chunk <= 0 || (whole && chunk < left)) continue;
      grow(s, s.computed + chunk);
      addPrefill(plan, s, chunk);
    }
  };
  /** Admits waiting sequences while slots, budget and blocks allow; `whole` forbids chunking a prompt. */
  const planAdmissions = (plan: StepPlan, now: number, whole: boolean): void => {
    for (;;) {
      if (running.length >= limits.maxRunning) return;
      const s = peekWaiting();
      if (!s || victims.has(s)) return;
      const goal = prefillTarget(s);
      const room = limits.tokenBudget - plan.tokens;
      if (room <= 0) return;
      if (whole && goal > room && plan.tokens > 0) return;
      const spare = free() - (running.length > 0 ? limits.watermarkBlocks : 0);
      const chunk = whole ? goal : Math.min(goal, room, spare * B);
      if (chunk <= 0 || blocksFor(chunk) > spare) return;
      schedule(s, now, chunk);
      addPrefill(plan, s, chunk);
    }
  };
  /** True when the queue head cannot be admitted now for want of a slot or blocks (chunked admits any chunk that fits). */
  const headBlocked = (head: Sequence): boolean => {
    if (running.length >= limits.maxRunning) return true;
    const spare = free() - (running.length > 0 ? limits.watermarkBlocks : 0);
    return limits.policy === 'chunked' ? spare < 1 : blocksFor(prefillTarget(head)) > spare;
  };
  /** Preempts lower-class running sequences while the queue head of a higher class cannot be admitted. */
  const preemptForPriority = (now: number): void => {
    for (;;) {
      const head = peekWaiting();
      const last = running[running.length - 1];
      if (!head || !last || last.priority <= head.priority || victims.has(head)) return;
      if (!headBlocked(head)) return;
      preemptOne(now);
    }
  };

  // Static batching: the members of the batch in progress (running or finished); none means a batch may form.
  let staticOpen = 0;
  const planStatic = (p: StepPlan, now: number): void => {
    if (running.length === 0) {
      staticOpen = 0;
      for (;;) {
        if (running.length >= limits.maxRunning) break;
        const s = peekWaiting();
        if (!s) break;
        // The whole sequence is reserved up front; a first member larger than the cache gets what there is.
        const full = s.promptTokens + s.maxTokens;
        const reserve = running.length === 0 ? Math.max(prefillTarget(s) + 1, Math.min(full, free() * B)) : full;
        if (blocksFor(reserve) > free()) break;
        schedule(s, now, reserve);
        staticOpen++;
      }
    }
    // All prompts of the batch first (whole, packed within the budget), then decodes of all members together.
    planPrefillContinuations(p, true);
    if (p.tokens === 0) planDecodes(p, now);
  };

  const compose = (now: number): StepPlan => {
    const p = newPlan();
    if (limits.policy === 'chunked') {
      preemptForPriority(now);
      const before = preemptions;
      planDecodes(p, now);
      planPrefillContinuations(p, false);
      // As in vLLM: a step that had to preempt for memory admits nothing new.
      if (preemptions === before) planAdmissions(p, now, false);
    } else if (limits.policy === 'prefill-first') {
      preemptForPriority(now);
      planPrefillContinuations(p, true);
      if (p.tokens === 0) planAdmissions(p, now, true);
      if (p.tokens === 0) planDecodes(p, now);
    } else {
      planStatic(p, now);
    }
    return p;
  };

  const plan = (now: number): StepPlan | null => {
    cachedStats = null;
    const p = planStep(now);
    // Listeners (scheduled, preempted) may have read stats() while the step was being planned.
    cachedStats = null;
    return p;
  };
  const planStep = (now: number): StepPlan | null => {
    victims.clear();
    let p = compose(now);
    // Every running sequence may be mid-prefill with no block left to grow into: free the newest and retry.
    while (p.entries.length === 0 && running.length > 0) {
      if (running.length === 1)
        throw new Error(`sequence ${running[0]!.id} needs more KV blocks than the replica has (${limits.blocksTotal})`);
      preemptOne(now);
      p = compose(now);
    }
    // Nothing runs, so a victim of this very step may start again at once.
    if (p.entries.length === 0 && waitingCount > 0) {
      victims.clear();
      p = compose(now);
    }
    if (p.entries.length === 0) {
      if (waitingCount > 0)
        throw new Error(`sequence ${peekWaiting()!.id} can never be admitted with ${limits.blocksTotal} KV blocks`);
      return null;
    }
    p.blocksUsed = used;
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
    cachedStats = null;
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
      // A real engine may end a sequence early (its end token or a stop string); the cost model stops at outputTokens.
      if (s.generated >= s.outputTokens || (s.tokens !== undefined && s.tokens.finish !== null)) finish(s, now);
    }
    // Listeners (tokens, finished) may have read stats() between two entries.
    cachedStats = null;
  };

  // stats() is read by every admission for every candidate replica (twice: the estimate and the class totals), so
  // it is computed once per change of the ledger: every mutation goes through enqueue, plan, complete, withdraw or
  // evictAll, which drop the cached copy.
  let cachedStats: BatcherStats | null = null;
  const stats = (): BatcherStats => (cachedStats ??= computeStats());
  const computeStats = (): BatcherStats => {
    let prefillAhead = 0;
    let decodeAhead = wDecode;
    let ctx = 0;
    let committed = wFinal;
    for (const s of running) {
      prefillAhead += Math.max(0, s.prefillGoal - s.computed);
      decodeAhead += Math.max(0, s.estOutputTokens - s.generated);
      ctx += s.computed;
      committed += Math.max(s.blocks, finalBlocks(s));
    }
    for (const t of wTokens) prefillAhead += t;
    const runningCommitted = committed - wFinal;
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
      committedBlocks: committed,
      runningCommittedBlocks: runningCommitted,
      runningContext: ctx,
      preemptions,
      steps,
    };
  };

  const checkPlan = (p: StepPlan): void => {
    const seen = new Set<Sequence>();
    let tokens = 0;
    let prefill = 0;
    for (const e of p.entries) {
      if (seen.has(e.seq)) throw new Error(`step holds sequence ${e.seq.id} twice`);
      seen.add(e.seq);
      tokens += e.chunk > 0 ? e.chunk : 1;
      prefill += e.chunk;
      if (e.seq.computed > limits.maxContext)
        throw new Error(
          `sequence ${e.seq.id} holds ${e.seq.computed} tokens, past the context of ${limits.maxContext}`,
        );
    }
    if (tokens !== p.tokens || prefill !== p.prefillTokens)
      throw new Error(`step accounts ${p.tokens} tokens, entries hold ${tokens}`);
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
  };

  return {
    limits,
    enqueue: (s, atHead = false) => {
      if (s.promptTokens + s.maxTokens > limits.maxContext) {
        throw new RangeError(
          `sequence ${s.id}: prompt ${s.promptTokens} + max tokens ${s.maxTokens} exceed the context of ${limits.maxContext}`,
        );
      }
      cachedStats = null;
      byId.set(s.id, s);
      s.running = false;
      pushWaiting(s, atHead);
    },
    plan,
    complete,
    withdraw: (id) => {
      const s = byId.get(id);
      if (!s) return false;
      cachedStats = null;
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
      cachedStats = null;
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
      wFinal = 0;
      byId.clear();
      staticOpen = 0;
      for (const s of out) s.gone = true;
      return out;
    },
    has: (id) => byId.has(id),
    hasWork: () => running.length > 0 || waitingCount > 0,
    saturated: () => {
      if (waitingCount === 0) return false;
      if (limits.policy === 'static') return running.length > 0;
      return headBlocked(peekWaiting()!);
    },
    stats,
    waitingList: () => classes.flatMap((q) => q.toArray()),
    runningList: () => running,
    checkInvariants: (p) => {
      let sum = 0;
      for (const s of running) {
        sum += s.blocks;
        if (s.computed > s.blocks * B)
          throw new Error(`sequence ${s.id} caches ${s.computed} tokens in ${s.blocks} blocks`);
        if (!s.running || s.gone)
          throw new Error(`sequence ${s.id} is in the running set but marked ${s.gone ? 'gone' : 'waiting'}`);
      }
      if (sum !== used) throw new Error(`ledger drift: blocks used ${used}, sequences hold ${sum}`);
      if (used > limits.blocksTotal) throw new Error(`blocks in use ${used} exceed capacity ${limits.blocksTotal}`);
      if (used < 0) throw new Error(`negative blocks in use ${used}`);
      if (running.length > limits.maxRunning)
        throw new Error(`running ${running.length} exceeds max ${limits.maxRunning}`);
      let queued = 0;
      for (const q of classes) queued += q.length;
      let counted = 0;
      for (const c of wCount) counted += c;
      if (queued !== waitingCount || counted !== waitingCount) {
        throw new Error(`queue drift: ${queued} queued, ${waitingCount} counted, ${counted} by class`);
      }
      if (cachedStats !== null) {
        const fresh = JSON.stringify(computeStats());
        if (JSON.stringify(cachedStats) !== fresh)
          throw new Error(`stale stats: cached ${JSON.stringify(cachedStats)}, ledger ${fresh}`);
      }
      if (limits.policy === 'static' && running.length > staticOpen)
        throw new Error(`static batch grew to ${running.length} past its ${staticOpen} members`);
      if (p) checkPlan(p);
    },
  };
}
