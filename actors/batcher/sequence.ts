// A generative request as the batcher sees it: lengths, progress, and the KV blocks it holds.
import type { TokenLogprob } from '../../machines/core-messages.ts';

/** Receives a sequence's changes of state (the request actor, the client stream, the report). */
export interface SequenceListener {
  scheduled(seq: Sequence, t: number): void;
  preempted(seq: Sequence, t: number): void;
  /** `n` new tokens were produced at time t (first token included). */
  tokens(seq: Sequence, n: number, t: number): void;
  /** `n` sequences each produced one token at t, `gapMs` after the one before it (none its first in this residency):
   * what a call of tokens(seq, 1, t) for each would do, in one call. Absent when each call matters (a stream). */
  sameGap?(n: number, gapMs: number): void;
  finished(seq: Sequence, t: number): void;
}

/** Why a real engine ended a sequence by itself (the model's end token, a stop string, or its max tokens). */
export type EngineFinish = 'eos' | 'stop' | 'length';

/**
 * A sequence served by a real engine: its token ids and sampling, shared by every residency of the request (a resume
 * re-prefills `prompt` + `out`). The replica appends each sampled token and its text before the batcher counts it.
 */
export interface SequenceTokens {
  readonly prompt: readonly number[];
  /** Token ids generated so far (as many as the sequence's `generated`). */
  readonly out: number[];
  /** Text of the latest generated token (whole characters; may be empty). */
  lastText: string;
  /** The latest token's log-probability, when the request asked for them. */
  lastLogprob?: TokenLogprob | null;
  /** Set when the engine ended the sequence; the batcher finishes it after counting the token. */
  finish: EngineFinish | null;
  readonly sampling: {
    temperature?: number;
    topP?: number;
    seed?: number;
    stop?: readonly string[];
    logprobs?: number;
    jsonSchema?: string;
  };
}

/** One sequence in a replica's continuous batch. */
export interface Sequence {
  readonly id: string;
  /** Priority class rank: 0 is the highest. */
  readonly priority: number;
  /** Arrival order (ties broken by admission order), for FIFO within a class. */
  readonly order: number;
  readonly promptTokens: number;
  /** Output tokens this request will produce (the simulated model stops here); never above maxTokens. */
  readonly outputTokens: number;
  readonly maxTokens: number;
  /** Output length the router and ledger assume (maxTokens, or a prediction when configured). */
  readonly estOutputTokens: number;
  readonly receivedAt: number;
  /** Tokens already streamed to the client; survive preemption and resumption. */
  generated: number;
  /** Tokens whose KV is in this replica's cache. */
  computed: number;
  /** Tokens to prefill in this residency (prompt plus what was streamed before it was scheduled). */
  prefillGoal: number;
  blocks: number;
  /** Leading blocks it reads from the prefix cache (kv-ledger.ts); 0 without one. */
  cached: number;
  /** Chain hashes of its prompt's (and, under the simulator, its answer's) full blocks, for the prefix cache. */
  readonly hashes?: readonly number[];
  /** The engine slot (sequence id) it runs in, -1 when not running (slots.ts). */
  slot: number;
  running: boolean;
  /** Admission to running order, to preempt the newest first. */
  runOrder: number;
  /** When its latest token was produced (ms), for the time between tokens; -1 before its first in this residency. */
  lastTokenAt: number;
  /** True once withdrawn (cancelled or expired): results for it are ignored. */
  gone: boolean;
  /** The last invariant check of a step plan that met it (batch-invariants.ts: a repeat in one plan is a duplicate). */
  checkedIn: number;
  /** Scheduled and not yet given a token in this residency (its listener sets and clears it). */
  awaitingToken: boolean;
  /** Whose work it is (the control plane's `model@version`: a step's invariant checks that every member is the
   * replica's); empty when not given. */
  readonly owner: string;
  readonly listener: SequenceListener;
  /** Free-form caller data (request actor, stream). */
  readonly tag: unknown;
  /** Its entry in a step plan as a decode ({ seq: this, chunk: 0 }), made at its first decode and shared by every
   * plan after it (plan entries are never changed), so that a decode step allocates no entry per sequence. */
  decodeEntry: { readonly seq: Sequence; readonly chunk: 0 } | null;
  /** Token ids and sampling when a real engine serves it; absent under the cost model. */
  readonly tokens?: SequenceTokens;
}

/** Fields a caller gives to create a sequence. */
export interface SequenceSpec {
  id: string;
  priority: number;
  order: number;
  promptTokens: number;
  outputTokens: number;
  maxTokens: number;
  estOutputTokens?: number;
  receivedAt: number;
  /** Tokens the client already has (a resumed request re-prefills them). */
  generated?: number;
  listener: SequenceListener;
  owner?: string;
  tag?: unknown;
  tokens?: SequenceTokens;
  hashes?: readonly number[];
}

/** Creates a waiting sequence from its spec. */
export function createSequence(spec: SequenceSpec): Sequence {
  // Field order is V8's in-object layout: the fields every step reads and writes come first, so that a step touching
  // a sequence it last touched many events ago (its cache lines long evicted) loads one or two lines, not three.
  return {
    gone: false,
    running: false,
    computed: 0,
    prefillGoal: 0,
    generated: spec.generated ?? 0,
    blocks: 0,
    cached: 0,
    slot: -1,
    awaitingToken: false,
    lastTokenAt: -1,
    listener: spec.listener,
    outputTokens: Math.min(spec.outputTokens, spec.maxTokens),
    owner: spec.owner ?? '',
    checkedIn: 0,
    estOutputTokens: spec.estOutputTokens ?? spec.maxTokens,
    promptTokens: spec.promptTokens,
    runOrder: 0,
    id: spec.id,
    priority: spec.priority,
    order: spec.order,
    maxTokens: spec.maxTokens,
    receivedAt: spec.receivedAt,
    tag: spec.tag,
    decodeEntry: null,
    ...(spec.tokens ? { tokens: spec.tokens } : {}),
    ...(spec.hashes ? { hashes: spec.hashes } : {}),
  };
}

/** Owner keys already built, so that equal keys are one string and comparing them is comparing pointers. */
const owners = new Map<string, Map<string, string>>();
/** Bound on interned owner keys (models × versions come from configuration; past it keys are built, not shared). */
const MAX_OWNERS = 4096;
let ownerCount = 0;

/** The owner key `model@version` of a sequence, one shared string per pair. */
export function ownerKey(model: string, version: string): string {
  let byVersion = owners.get(model);
  const hit = byVersion?.get(version);
  if (hit !== undefined) return hit;
  const key = `${model}@${version}`;
  if (ownerCount >= MAX_OWNERS) return key;
  if (!byVersion) owners.set(model, (byVersion = new Map()));
  byVersion.set(version, key);
  ownerCount++;
  return key;
}

/** Tokens that must be in cache before the next token can be produced (prompt plus what was streamed). */
export const prefillTarget = (s: Sequence): number => s.promptTokens + s.generated;
