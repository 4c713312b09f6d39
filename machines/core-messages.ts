// What crosses between the control plane and a replica's engine core: requests in, progress and load out. The core
// (actors/engine-core/) runs each replica's step loop beside its engine; the control plane never sees a step, only
// these request-level messages, coalesced per replica per step (never one message per token or per sequence).

/** How a replica composes each step. */
export type BatchPolicy = 'chunked' | 'prefill-first' | 'static';

/** Limits of a replica's iteration loop (continuous batching), in its core and in the control plane's view. */
export interface CoreLimits {
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
  /** Keep computed blocks in a prefix cache for later prompts that start the same way (kv-ledger.ts). */
  prefixCache?: boolean;
}

/** Bounds of the batches a stateless replica's core forms (dynamic batching). */
export interface CoreStatelessLimits {
  maxSize: number;
  /** Padded tokens (members times their bucket) one batch may hold. */
  maxTokens: number;
  maxMemoryBytes: number;
  /** The longest the oldest member of a forming batch waits before the batch closes. */
  maxDelayMs: number;
  /** Ascending input-length buckets: a request is padded to the first edge at or above its length. */
  buckets: readonly number[];
  /** Activation memory per padded token. */
  bytesPerToken: number;
  /** Requests held at once (forming, closed and running batches). */
  maxQueued: number;
}

/** Sampling of a sequence a real engine serves. */
export interface SeqSampling {
  temperature?: number;
  topP?: number;
  seed?: number;
  stop?: string[];
  /** Each token's log-probability, with this many most likely alternatives (0 to 20). */
  logprobs?: number;
  /** JSON output validating against this JSON schema (JSON text): grammar-constrained sampling. */
  jsonSchema?: string;
}

/** A generative sequence handed to a replica's core (a resumed one carries what its client already has). */
export interface SubmitSeq {
  id: string;
  /** Priority class rank: 0 is the highest. */
  priority: number;
  /** Arrival order on the control plane, for FIFO within a class. */
  order: number;
  promptTokens: number;
  /** Output tokens the simulated model produces (cost model); never above maxTokens. */
  outputTokens: number;
  maxTokens: number;
  /** Output length the ledger assumes (maxTokens, or a prediction). */
  estOutputTokens: number;
  /** Tokens its client already has (resume-from): they are prefilled again with the prompt. */
  generated: number;
  /** Goes to the head of its class (a resumed or requeued sequence). */
  atHead?: boolean;
  /** Token ids, for a real engine: the prompt and the tokens already generated (as many as `generated`). */
  prompt?: number[];
  out?: number[];
  sampling?: SeqSampling;
  /** Chain hashes of its full blocks (actors/batcher/block-hash.ts), for a core with a prefix cache. */
  blocks?: number[];
}

/** A stateless request handed to a replica's core: one member of a dynamic batch. */
export interface SubmitItem {
  id: string;
  /** Input length in tokens, before padding. */
  tokens: number;
  dtype: string;
  adapter: string | null;
  options: Record<string, string | number | boolean>;
}

/** A token's log-probability with its text, and the most likely tokens at its position (OpenAI's
 * `logprobs.content[i]`); log-probabilities are finite (at least LOGPROB_FLOOR). */
export interface TokenLogprob {
  lp: number;
  text: string;
  top: { token: number; text: string; lp: number }[];
}

/** The lowest log-probability carried (a probability that underflows a double). */
export const LOGPROB_FLOOR = -9999;

/** Why a sequence ended in its core. */
export type SeqFinish = 'done' | 'eos' | 'stop' | 'length';

/**
 * One change of one sequence in a step, as progress carries it (`k` = kind):
 * - `s` scheduled: admitted to the running set (a residency starts; its first token is still to come); `c`: prompt
 *   tokens it found in the replica's prefix cache (not prefilled again), when any;
 * - `p` preempted: evicted by recompute, back in the core's waiting queue (it keeps its streamed tokens);
 * - `t` tokens: `n` new tokens (real engines add their `ids` and `text`);
 * - `f` finished: ended with `reason` (its last tokens came in a `t` before it); a stateless member's result is
 *   `result` with its batch's `batch` id and `size`, or `error` when its batch failed;
 * - `g` one decode token for each of the replica's decode set, none its first in this residency: `ids` names the set
 *   when it changed since the last `g` of this replica (the control plane keeps the last set). `at` lists the core's
 *   clock at the end of each of consecutive decode steps of that set (a token each per step) when the report covers
 *   more than one, or was made after the step ended; without it the step ended at the report's `at`.
 */
export type SeqEvent =
  | { k: 's'; id: string; c?: number }
  | { k: 'p'; id: string }
  | { k: 't'; id: string; n: number; ids?: number[]; text?: string; lp?: TokenLogprob[] }
  | { k: 'f'; id: string; reason: SeqFinish; result?: number; batch?: string; size?: number; error?: string }
  | { k: 'g'; ids?: string[]; at?: number[] };

/** What the router and the ledger read from a batcher (a core's continuous batcher; zeros for a stateless core). */
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

/** A replica's load as its core reports it after every step: what routing and admission predict from. */
export interface ReplicaLoad extends BatcherStats {
  /** Sequences and items the core has received since it started (refused ones too): the control plane counts the
   * submits a report does not yet reflect as the ones after the first `received`. */
  received: number;
  /** Cancels (ids) the core has received since it started: the control plane keeps a cancelled sequence out of its
   * view until a report counts its cancel. */
  cancelled: number;
  /** Requests a stateless core holds (forming, closed and running batches). */
  queued: number;
  /** The core cannot admit more now (slots or blocks full): the replica is saturated. */
  saturated: boolean;
  /** Steps run and their totals since the core started: count, members, tokens, predicted and measured ms. */
  stepCount: number;
  stepMembers: number;
  stepTokens: number;
  stepPredictedMs: number;
  stepBusyMs: number;
  /** The step the core runs now: its predicted ms and how long it has run (0, 0 when idle). */
  inflightPredictedMs: number;
  inflightMs: number;
}

/** What a core's prefix cache kept and evicted since its last report (block chain hashes, block-hash.ts): the control
 * plane's prefix index mirrors it. `reset`: forget what was known of this replica's cache first (it was cleared, or
 * more changed than one report carries), then take `add`. */
export interface CacheReport {
  add: number[];
  evict: number[];
  reset?: boolean;
}

/** Most block hashes one cache report carries in each list (more: the report says `reset`). */
export const MAX_CACHE_REPORT = 4096;

/** One report of a core: the events of its latest step (or of a submit/cancel it answered) and its load. */
export interface CoreReport {
  /** The core's clock when the report was made, and when the step it reports started (equal for a report of no
   * step). */
  at: number;
  start: number;
  /** A partial report of the step in flight: the ranks that finished it while another has not (events empty). */
  ranks?: number[];
  events: SeqEvent[];
  load: ReplicaLoad;
  /** Its prefix cache's changes since the last report, when there are any. */
  cache?: CacheReport;
}

/** A load of nothing (a core that holds no work), with `over` on top: the shape every report carries. */
export function idleLoad(over: Partial<ReplicaLoad> = {}): ReplicaLoad {
  return {
    waiting: 0,
    running: 0,
    blocksUsed: 0,
    blocksTotal: 0,
    prefillTokensAhead: 0,
    decodeTokensAhead: 0,
    waitingBlocks: 0,
    waitingByClass: [],
    waitingTokensByClass: [],
    committedBlocks: 0,
    runningCommittedBlocks: 0,
    runningContext: 0,
    preemptions: 0,
    steps: 0,
    received: 0,
    cancelled: 0,
    queued: 0,
    saturated: false,
    stepCount: 0,
    stepMembers: 0,
    stepTokens: 0,
    stepPredictedMs: 0,
    stepBusyMs: 0,
    inflightPredictedMs: 0,
    inflightMs: 0,
    ...over,
  };
}
