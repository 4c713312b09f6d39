// The engine interface: what runs a replica's steps (tokenizer, KV capacity, one batch per step, freeing sequences).

/** Codes of the failures an engine reports; see EngineError. */
export type EngineErrorCode = 'invalid_model_file' | 'invalid_request' | 'engine_failed' | 'not_loaded';

/** A failure as data, the shape switchyard's outcomes use. */
export interface EngineFailure {
  code: EngineErrorCode;
  message: string;
  retryable: boolean;
  cause?: unknown;
}

/** The typed error every engine operation rejects with; `failure()` gives it as data for the wire. */
export class EngineError extends Error {
  override readonly name = 'EngineError';
  constructor(
    readonly code: EngineErrorCode,
    message: string,
    readonly retryable = false,
    override readonly cause?: unknown,
  ) {
    super(message);
  }

  /** This error as a plain failure record. */
  failure(): EngineFailure {
    return { code: this.code, message: this.message, retryable: this.retryable };
  }
}

/** A model's offload setting: the CPU, or a GPU backend of node-llama-cpp. */
export type EngineGpu = 'auto' | 'cuda' | 'vulkan' | 'metal' | 'cpu';

/** How to load an engine: its cache (sequences x contextTokens), threads, and whether to use a GPU. */
export interface EngineLoadOptions {
  /** KV cells requested per sequence; the engine may round up (see capacity()). */
  contextTokens: number;
  /** Concurrent sequences (slots) of the engine. */
  sequences: number;
  /** CPU threads for evaluation; 1 in tests. */
  threads?: number;
  /** `false` or `'cpu'` (default) runs on the CPU; a backend name loads that prebuilt build of node-llama-cpp (it
   * fails to load where the backend is missing); `'auto'` takes the first backend that loads, else the CPU. */
  gpu?: false | EngineGpu;
  /** Layers offloaded to the GPU; absent: every layer when a GPU backend runs. */
  gpuLayers?: number;
  /** Most tokens one step may hold (the engine's batch size); defaults to contextTokens. */
  batchTokens?: number;
}

/** The engine's real cache, as allocated: the KV ledger's capacity is reconciled against it. */
export interface EngineCapacity {
  sequences: number;
  /** Cells a sequence may fill (prompt + generated tokens); a step that would exceed it is refused. */
  cellsPerSequence: number;
  /** Cells the engine allocated in total (every sequence has its own fixed block in the stock llama.cpp build). */
  totalCells: number;
  /** Most tokens (prefill + decode) in one step. */
  batchTokens: number;
  /** Sequences not running (a free one may keep the cells of the last sequence it ran, for reuse). */
  freeSequences: number;
  /** Cells held by each live sequence. */
  used: Record<string, number>;
  /** Where the model's layers run, as node-llama-cpp reports it after loading. */
  offload?: EngineOffload;
}

/** Where an engine's layers run: the backend of the loaded build, its devices, and layers on them out of all. */
export interface EngineOffload {
  /** `cpu`, or the GPU backend (`cuda`, `vulkan`, `metal`). */
  backend: string;
  devices: string[];
  gpuLayers: number;
  totalLayers: number;
}

/** OpenAI-style sampling parameters of one sequence; temperature 0 (the default) is greedy. */
/** A token's log-probability and the most likely alternatives at its position (OpenAI's `logprobs.content[i]`). */
import type { TokenLogprob } from '../../machines/core-messages.ts';

export type { TokenLogprob };

export interface SamplingParams {
  temperature?: number;
  topP?: number;
  /** Seeds the sampler; mixed with the token position so a recompute reproduces the same tokens. Default 0. */
  seed?: number;
  /** Stop strings: the text ends before the first one, which is never streamed. */
  stop?: readonly string[];
  /** Return each token's log-probability with this many most likely alternatives (0 to MAX_TOP_LOGPROBS). */
  logprobs?: number;
  /** Produce JSON that validates against this JSON schema, as JSON text (`{"type":"object"}`: any object), by
   * grammar-constrained sampling. */
  jsonSchema?: string;
}

/**
 * One item of a step: a prefill chunk of a sequence, or one decode token of a running sequence. The first prefill of
 * a recomputed sequence (preempted, or resumed elsewhere) names in `streamed` the tokens it had generated, whose text
 * was streamed already: the engine's text stream replays them without emitting, so what it held back (an incomplete
 * character, a possible stop-string prefix) is neither lost nor sent twice, and a stop string spanning the
 * preemption is still found.
 *
 * `last` on an item that samples says the caller takes no more tokens of the sequence (its max_tokens): the engine
 * appends the text it held back to that token's and frees the sequence in the same step, as it does a sequence that
 * ended by itself (end-of-generation token, stop string), so a finished sequence costs no separate free().
 *
 * `slot` is the engine sequence (llama.cpp sequence id) the caller's scheduler gave the sequence: a sequence opens
 * in it (it must be free) and keeps it until freed; absent, a new sequence takes the lowest free one. A step's items
 * are queued in ascending slot order, so sequences in consecutive slots share passes (actors/batcher/slots.ts).
 *
 * A freed sequence's cells stay in its slot until the slot opens another sequence. `prefix`, on the item that opens a
 * sequence, is the sequence's first token ids that the caller expects the slot's cells to hold already (the
 * scheduler's prefix reuse, actors/batcher/slot-prefix.ts); `tokens` follow them. The engine keeps the cells that hold
 * them, erases the rest, and evaluates itself whatever part of `prefix` the cells did not hold, so the text is the
 * same as if the whole prompt had been prefilled. Without `prefix` the slot's cells are erased.
 */
export type StepItem =
  | {
      seq: string;
      kind: 'prefill';
      tokens: readonly number[];
      sample: boolean;
      sampling?: SamplingParams;
      streamed?: readonly number[];
      last?: boolean;
      slot?: number;
      prefix?: readonly number[];
    }
  | { seq: string; kind: 'decode'; last?: boolean; slot?: number };

/** A step as switchyard's batcher planned it; executed as exactly one engine batch. */
export interface StepPlan {
  items: readonly StepItem[];
}

/** Why a sequence stopped by itself: the model's end-of-generation token, or a stop string. */
export type FinishReason = 'eos' | 'stop';

/** The token a step sampled for one sequence, and the text it makes streamable. */
export interface SampledToken {
  seq: string;
  token: number;
  /** Complete characters only; may be empty while a character or a possible stop string is incomplete. */
  text: string;
  finish?: FinishReason;
  /** The token's log-probability and alternatives, when its sequence asked for them. */
  logprob?: TokenLogprob;
}

/** What a step did and how long it took. */
export interface StepResult {
  sampled: SampledToken[];
  /** Wall time of the engine batch, milliseconds. */
  ms: number;
  /** Tokens evaluated (prefill tokens + decodes). */
  tokens: number;
  /**
   * Batches node-llama-cpp dispatched for the step: 1 unless a decode was queued late. llama.cpp itself may still run
   * one batch in several passes (the stock build splits a batch across sequences); `ms` includes them all.
   */
  dispatches: number;
  /** Passes (llama.cpp micro-batches) the batch ran in, counted from its items' slots as llama.cpp splits it. */
  passes?: number;
  /** Cells the sequences opened in this step kept from their slots (their items' `prefix` tokens found there). */
  kept?: number;
  /** `prefix` tokens the slots did not hold, evaluated by the engine before the batch (in `dispatches` too). */
  refilled?: number;
}

/**
 * A loaded model that executes switchyard's step plans.
 *
 * Division of labour: the engine samples (temperature, top_p, seed), detects the end-of-generation token and stop
 * strings (it owns the text, so it withholds a possible stop-string prefix and never streams the stop string);
 * the caller counts max_tokens and decides scheduling, chunking and preemption, then calls free(). Calls are
 * serialised: an operation waits for the previous one.
 */
export interface Engine {
  readonly file: string;
  /** Token ids of a prompt, from the model's own tokenizer, with BOS when the model wants one (bos: true). */
  tokenize(text: string, opts?: { bos?: boolean }): number[];
  /** Text of token ids. */
  detokenize(tokens: readonly number[]): string;
  /** The real cache and slots. */
  capacity(): EngineCapacity;
  /** Runs one step as one engine batch; refuses an invalid plan with `invalid_request` before any work. */
  step(plan: StepPlan): Promise<StepResult>;
  /** Ends a sequence (finish, cancel, preemption), leaving its cells in its slot for a later `prefix`; returns text
   * still held back. Idempotent. */
  free(seq: string): Promise<{ text: string }>;
  /** Releases the model and the cache. */
  unload(): Promise<void>;
}
