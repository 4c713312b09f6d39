// Predicts how long a new request would wait on a replica, from the one ledger (the batcher's accounts) and the
// replica's cost model. The same estimate drives the `cost` policy and admission control.
import type { ReplicaHandle } from '../replica.ts';

/** A replica's predicted wait and KV headroom for one request. */
export interface WaitEstimate {
  replica: string;
  /** Predicted queueing before the request's prefill starts (ms). */
  waitMs: number;
  /** Predicted time to first token: wait plus its own prefill (ms). */
  ttftMs: number;
  freeBlocks: number;
  needBlocks: number;
  /** True when the replica's free KV (after its queue) covers this request now. */
  headroom: boolean;
  queued: number;
  running: number;
}

/** What the estimate needs to know about the request. */
export interface WorkSpec {
  promptTokens: number;
  estOutputTokens: number;
  /** Priority class rank (0 highest): only work of its class or higher counts as ahead in the queue. */
  priority: number;
}

const perTokenCache = new WeakMap<object, number>();

/** Seconds of prefill per token on this replica, amortised over a typical chunk. */
function prefillPerToken(r: ReplicaHandle): number {
  let v = perTokenCache.get(r.cost);
  if (v === undefined) {
    v = r.cost.prefillS(1024, 0) / 1024;
    perTokenCache.set(r.cost, v);
  }
  return v;
}

/** Predicts the wait and headroom of `work` on replica `r`. */
export function estimateWait(r: ReplicaHandle, work: WorkSpec): WaitEstimate {
  const st = r.batcher.stats();
  const lim = r.batcher.limits;
  const tok = prefillPerToken(r);
  const stepS = st.running > 0 ? r.cost.decodeS(st.running, st.runningContext) : 0;
  let aheadTokens = 0;
  let aheadCount = 0;
  for (let c = 0; c <= work.priority && c < st.waitingTokensByClass.length; c++) {
    aheadTokens += st.waitingTokensByClass[c]!;
    aheadCount += st.waitingByClass[c]!;
  }
  let runningPrefill = st.prefillTokensAhead;
  for (const t of st.waitingTokensByClass) runningPrefill -= t;
  const needBlocks = Math.ceil((work.promptTokens + work.estOutputTokens) / lim.blockTokens);
  const freeBlocks = st.blocksTotal - st.blocksUsed - st.waitingBlocks;
  const avgRemain = st.running + st.waiting > 0 ? st.decodeTokensAhead / (st.running + st.waiting) : 0;
  // With continuous batching, prefill ahead shares each step with the running decodes.
  const prefillS = (aheadTokens + runningPrefill) * tok * (1 + st.running / Math.max(1, lim.tokenBudget));
  const kvS =
    needBlocks > freeBlocks && st.blocksUsed > 0
      ? Math.min(1, (needBlocks - freeBlocks) / st.blocksUsed) * avgRemain * stepS
      : 0;
  const over = st.running + aheadCount + 1 - lim.maxRunning;
  const slotS = over > 0 && st.running > 0 ? Math.min(1, over / st.running) * avgRemain * stepS : 0;
  const waitS = prefillS + Math.max(kvS, slotS) + stepS;
  const ownS = work.promptTokens * tok;
  return {
    replica: r.id,
    waitMs: waitS * 1000,
    ttftMs: (waitS + ownS) * 1000,
    freeBlocks,
    needBlocks,
    headroom: needBlocks <= freeBlocks,
    queued: st.waiting,
    running: st.running,
  };
}
