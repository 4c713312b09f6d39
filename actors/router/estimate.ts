// Predicts how long a new request would wait on a replica, from the one ledger (the batcher's accounts) and the
// replica's cost model. The same estimate drives the `cost` policy, admission control and retryAfterMs.
//
// The model of a chunked-prefill replica: every step decodes one token for each running sequence and fills the rest
// of its token budget with prefill, oldest first and higher classes first. So a new request's prefill starts once
// the prefill ahead of it (running sequences' unfinished prompts plus waiting prompts of its class or higher) has
// gone through at `budget - decodes` tokens per step, and its first token comes at the end of the step that
// finishes its own prompt. A full slot table or a full KV cache adds the time for enough running sequences to
// finish. KV headroom is counted against what the replica has committed (every sequence's prompt plus expected
// output), not against what it has allocated so far, so admitting within headroom never forces a preemption.
import type { BatcherStats, ContinuousLimits } from '../batcher/continuous.ts';
import type { CostModel } from '../gpu/cost-model.ts';
import type { ReplicaHandle } from '../replica.ts';

/** A replica's predicted wait and KV headroom for one request. */
export interface WaitEstimate {
  replica: string;
  /** Predicted queueing before the request's prefill starts (ms). */
  waitMs: number;
  /** Predicted time to first token: wait plus its own prefill (ms). */
  ttftMs: number;
  /** KV blocks not committed to work already on the replica. */
  freeBlocks: number;
  /** Blocks this request commits: prompt plus expected output. */
  needBlocks: number;
  /** True when the uncommitted KV covers this request. */
  headroom: boolean;
  /** Waiting and running sequences on the replica. */
  queued: number;
  running: number;
  /** Prefill tokens ahead of this request (its class or higher, plus running prompts not yet computed). */
  aheadTokens: number;
  /** Predicted wait of a request of the highest class on this replica (ms): the pressure lower classes are shed on. */
  topWaitMs: number;
  /** Predicted wait for running sequences to free enough KV for this request (ms); 0 with headroom. */
  kvWaitMs: number;
  /** Prompt tokens the replica is expected to hold in its prefix cache (not prefilled again), when any. */
  cachedTokens?: number;
}

/** What the estimate needs to know about the request. */
export interface WorkSpec {
  promptTokens: number;
  estOutputTokens: number;
  /** Priority class rank (0 highest): only work of its class or higher counts as ahead in the queue. */
  priority: number;
  /** Chain hashes of its prompt's full blocks (block-hash.ts), for replicas with a prefix cache. */
  hashes?: readonly number[];
  /** Prompt tokens this replica holds in its prefix cache (the router's prefix index): only the rest is prefilled. */
  cachedTokens?: number;
}

// Reused shape objects: the cost model reads them synchronously and keeps nothing.
const fullChunk = { tokens: 0, cached: 0 };
const fullShape = { prefill: [fullChunk], decodeBatch: 0, decodeContext: 0 };

/** What an estimate reads of a replica: its ledger's stats, its batching limits and its cost model. */
export interface ReplicaLoad {
  id: string;
  /** The step the replica runs now, when known: its predicted ms (at the cost model's speed) and the real ms it has
   * run. Absent: half a step is assumed. */
  inflight?: { predictedMs: number; elapsedMs: number } | null;
  stats: Pick<
    BatcherStats,
    | 'waiting'
    | 'running'
    | 'blocksTotal'
    | 'prefillTokensAhead'
    | 'decodeTokensAhead'
    | 'waitingByClass'
    | 'waitingTokensByClass'
    | 'runningCommittedBlocks'
    | 'runningContext'
  >;
  limits: Pick<ContinuousLimits, 'tokenBudget' | 'maxRunning' | 'blockTokens'>;
  cost: CostModel;
}

/** Seconds of one step of this replica carrying `prefill` prompt tokens beside its running decodes. */
function stepWith(cost: CostModel, prefill: number, decodes: number, context: number): number {
  fullChunk.tokens = prefill;
  fullShape.decodeBatch = decodes;
  fullShape.decodeContext = context;
  return cost.stepS(fullShape);
}

/** The n-th harmonic number (summed term by term, in order, below 20; asymptotically above). */
function harmonic(n: number): number {
  if (n <= 0) return 0;
  if (n >= 20) return Math.log(n) + 0.5772156649 + 1 / (2 * n);
  let h = 0;
  for (let i = 0; i < n; i++) h += 1 / (i + 1);
  return h;
}

/** Seconds of the prefill phase of `tokens` prompt tokens through steps of `perStep` prefill tokens beside `decodes`
 * running decodes (`fullS` a full step): a partial step costs what it carries. */
function prefillPhaseS(
  cost: CostModel,
  tokens: number,
  perStep: number,
  fullS: number,
  decodes: number,
  context: number,
): number {
  if (tokens <= 0) return 0;
  if (tokens <= perStep) return stepWith(cost, tokens, decodes, context);
  return (tokens / perStep) * fullS;
}

/**
 * Expected time, in mean remaining lengths, until `k` of `n` running sequences have finished, if remaining lengths
 * are exponential (heavy-tailed traces are at least that spread): the k-th order statistic, H(n) - H(n - k).
 * Linear k/n underestimates it badly once k is a large share of n, which let overload be admitted and then expire.
 */
function slotsFreedAfter(n: number, k: number): number {
  if (k < n) return harmonic(n) - harmonic(n - k);
  return harmonic(n) + (k - n) / n;
}

/**
 * Predicts the wait and headroom of `work` on replica `r`. `slowdown` scales the cost model's step times by how much
 * slower (or faster) the replica's steps have really been running (measured by outlier ejection), so admission
 * tracks a straggler instead of letting its queue expire.
 */
export function estimateWait(r: ReplicaHandle, work: WorkSpec, slowdown = 1, now?: number): WaitEstimate {
  const inflight = now === undefined ? undefined : r.work.stepInFlight(now);
  return estimateLoad(
    {
      id: r.id,
      stats: r.work.stats(),
      limits: r.work.limits,
      cost: r.cost,
      ...(inflight !== undefined ? { inflight } : {}),
    },
    work,
    slowdown,
  );
}

/** estimateWait over a replica's load as data (a real replica's ledger, or the work held for one still loading). */
export function estimateLoad(r: ReplicaLoad, work: WorkSpec, slowdown = 1): WaitEstimate {
  const st = r.stats;
  const lim = r.limits;
  const decodes = Math.min(st.running, lim.tokenBudget - 1);
  const perStep = lim.tokenBudget - decodes;
  const fullS = stepWith(r.cost, perStep, decodes, st.runningContext);
  const decodeS = st.running > 0 ? r.cost.decodeS(st.running, st.runningContext) : 0;

  let waitingTokens = 0;
  for (const t of st.waitingTokensByClass) waitingTokens += t;
  const runningAhead = Math.max(0, st.prefillTokensAhead - waitingTokens);
  let ahead = runningAhead;
  let aheadCount = 0;
  for (let c = 0; c <= work.priority && c < st.waitingTokensByClass.length; c++) {
    ahead += st.waitingTokensByClass[c]!;
    aheadCount += st.waitingByClass[c] ?? 0;
  }

  // A busy replica finishes the step in flight first: what its core said of it (its predicted time less what has run,
  // at the observed slowdown), or half a step on average when unknown.
  const f = r.inflight;
  const inflightS =
    f !== undefined
      ? f === null
        ? 0
        : Math.max(0, f.predictedMs - f.elapsedMs / slowdown) / 1000
      : st.running + st.waiting > 0
        ? (ahead > 0 ? fullS : decodeS) / 2
        : 0;

  const B = lim.blockTokens;
  const inFlight = st.running + st.waiting;
  const avgRemain = inFlight > 0 ? st.decodeTokensAhead / inFlight : 0;
  // KV committed ahead of this request: what running sequences hold and will still write, plus the prompts and
  // expected outputs of waiting sequences of its class or higher. Lower classes queued behind it do not count: it
  // is scheduled before them, and they are preempted first when blocks run out.
  // Running sequences count by the ledger (blocks held, or the full reservation static batching made up front),
  // so a reservation is never counted twice.
  const waitingAheadTokens = ahead - runningAhead + aheadCount * avgRemain;
  const committed = st.runningCommittedBlocks + Math.ceil(waitingAheadTokens / B);
  const freeBlocks = st.blocksTotal - committed;
  const needBlocks = Math.ceil((work.promptTokens + work.estOutputTokens) / B);
  // Waiting for running sequences to finish: for KV (the deficit's share of what is held) or for a slot.
  const kvS =
    needBlocks > freeBlocks && committed > 0
      ? Math.min(1, (needBlocks - freeBlocks) / committed) * avgRemain * decodeS
      : 0;
  const over = st.running + aheadCount + 1 - lim.maxRunning;
  const slotS = over > 0 && st.running > 0 ? slotsFreedAfter(st.running, over) * avgRemain * decodeS : 0;
  const blockedS = Math.max(kvS, slotS);

  // Full steps before a prompt queued behind `ahead` prefill tokens gets its first chunk. What the replica holds of
  // its prompt is not prefilled again (the last prompt token always is): load and cache locality in one estimate.
  const cached = Math.max(0, Math.min(work.cachedTokens ?? 0, work.promptTokens - 1));
  const waitS = inflightS + blockedS + Math.floor(ahead / perStep) * fullS;
  const ttftS =
    inflightS +
    blockedS +
    prefillPhaseS(r.cost, ahead + work.promptTokens - cached, perStep, fullS, decodes, st.runningContext);
  const topAhead = runningAhead + (st.waitingTokensByClass[0] ?? 0);
  const topOver = st.running + (st.waitingByClass[0] ?? 0) + 1 - lim.maxRunning;
  const topSlotS = topOver > 0 && st.running > 0 ? slotsFreedAfter(st.running, topOver) * avgRemain * decodeS : 0;
  const topWaitS =
    (st.running + st.waiting > 0 ? (topAhead > 0 ? fullS : decodeS) / 2 : 0) +
    topSlotS +
    Math.floor(topAhead / perStep) * fullS;
  const k = slowdown * 1000;
  return {
    replica: r.id,
    waitMs: waitS * k,
    ttftMs: ttftS * k,
    freeBlocks,
    needBlocks,
    headroom: needBlocks <= freeBlocks,
    queued: st.waiting,
    running: st.running,
    aheadTokens: ahead,
    topWaitMs: topWaitS * k,
    kvWaitMs: kvS * k,
    ...(cached > 0 ? { cachedTokens: cached } : {}),
  };
}

/** Work held at the router, waiting for a replica that is loading or about to be placed. */
export interface HeldWork {
  count: number;
  promptTokens: number;
  /** Output tokens the ledger expects of it. */
  outputTokens: number;
}

/**
 * The load an empty replica would carry if `ahead` were handed to it the moment it is ready: up to maxRunning of
 * those requests running (their prompts not yet computed), the rest waiting, all counted as the request's class.
 * Estimating on it (with the request's priority 0) gives the wait behind the held work at the replica's rate.
 */
export function heldLoad(
  empty: Pick<ReplicaLoad, 'id' | 'limits' | 'cost'> & { blocksTotal: number },
  ahead: HeldWork,
): ReplicaLoad {
  const n = ahead.count;
  const running = Math.min(n, empty.limits.maxRunning);
  const waiting = n - running;
  const prompt = n > 0 ? ahead.promptTokens / n : 0;
  const output = n > 0 ? ahead.outputTokens / n : 0;
  return {
    id: empty.id,
    limits: empty.limits,
    cost: empty.cost,
    stats: {
      waiting,
      running,
      blocksTotal: empty.blocksTotal,
      prefillTokensAhead: ahead.promptTokens,
      decodeTokensAhead: ahead.outputTokens,
      waitingByClass: [waiting],
      waitingTokensByClass: [waiting * prompt],
      runningCommittedBlocks: running * Math.ceil((prompt + output) / empty.limits.blockTokens),
      runningContext: running * prompt,
    },
  };
}
