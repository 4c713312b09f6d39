// The shapes the control plane's parts share: a request as a client submits it, what the client hears, and the
// live record of an admitted request.
import type { PromptSegment } from '../batcher/block-hash.ts';
import type { TokenLogprob } from '../../machines/core-messages.ts';
import type { Actor, ActorRefFrom } from 'xstate';
import type { RequestContext, RequestEvent, requestMachine, RequestOutcome } from '../../machines/request.machine.ts';
import type { FlatMachineLogic } from '../../runtime/flat-machine.ts';
import type { Sequence, SequenceTokens } from '../batcher/sequence.ts';
import type { DecisionTrace } from '../router/router.ts';
import type { Failure, OutcomeCode } from '../../machines/outcomes.ts';
import type { ClientRequest } from '../../transport/client-protocol.ts';

/**
 * The request the control plane admits. Every client API (the stream API's `submit`, OpenAI HTTP, chat) produces one
 * ClientRequest (transport/client-protocol.ts); serving counts its prompt (a real engine's tokenizer, else the
 * estimate) and submits it as this; simulations submit it directly. The router reads a RouteRequest, a view of it.
 */
export interface SubmitSpec extends Omit<ClientRequest, 'prompt' | 'promptTokens' | 'sampling'> {
  id?: string;
  promptTokens: number;
  /** Tokens the (simulated) model will produce before stopping; at most maxTokens. */
  outputTokens?: number;
  deadlineMs?: number;
  /** A stateless model's batch compatibility beyond model, version and input length: dtype, adapter, options. */
  dtype?: string;
  adapter?: string | null;
  options?: Readonly<Record<string, string | number | boolean>>;
  /** For a model served by a real engine: the prompt's token ids (promptTokens is their count) and sampling. */
  engine?: { prompt: readonly number[]; sampling: SequenceTokens['sampling'] };
  /** What a simulated prompt (and its answer, last) is made of, for a model with a prefix cache (block-hash.ts). */
  segments?: readonly PromptSegment[];
}

/** What a client hears about its request. */
export interface ClientListener {
  accepted?(id: string): void;
  /** `n` tokens; `seq` is the sequence number of the first of them (contiguous from 0); `text` from a real engine. */
  tokens?(id: string, seq: number, n: number, t: number, text?: string, lp?: readonly TokenLogprob[]): void;
  terminal?(id: string, outcome: TerminalOutcome): void;
}

/** The one terminal outcome of a request. */
export interface TerminalOutcome {
  outcome: RequestOutcome;
  /** The typed outcome code, from the request machine to the edge unchanged (null when done). */
  code: OutcomeCode | null;
  message: string | null;
  tokens: number;
  retryAfterMs?: number;
  timings: { receivedAt: number; firstTokenAt: number; finishedAt: number };
}

/** What `submit` answers: the request's id, and either the model version it resolved to or the refusal. */
export type SubmitResult =
  | { id: string; ok: true; model: string; version: string; failure?: undefined }
  | { id: string; ok: false; failure: Failure };

/**
 * A request's actor: the request machine as XState interprets it (the simulator's reference run, or while an
 * inspector watches), or the same machine compiled flat (runtime/flat-machine.ts) everywhere else. Both are XState
 * actors; their snapshots have the same value, status and context after every event.
 */
export type RequestActor = ActorRefFrom<typeof requestMachine> | Actor<FlatMachineLogic<RequestContext, RequestEvent>>;

/** A live request inside the control plane. */
export interface Live {
  id: string;
  actor: RequestActor;
  spec: SubmitSpec & { outputTokens: number; priority: string };
  model: string;
  version: string;
  rank: number;
  budgetMs: number;
  /** Output tokens the ledger expects (the real count under an oracle estimate, else maxTokens). */
  estOutputTokens: number;
  receivedAt: number;
  firstScheduledAt: number;
  /** Tokens a stateless batch gave the client (a generative request's are its sequence's `generated`). */
  streamed: number;
  seq: Sequence | null;
  /** A real engine's token ids for this request, shared by every residency (absent under the cost model). */
  tokens?: SequenceTokens;
  /** Chain hashes of its blocks, for a model with a prefix cache. */
  hashes?: readonly number[];
  /** Prompt tokens its replica found cached when it was first scheduled (a model with a prefix cache). */
  cachedTokens?: number;
  listener: ClientListener | undefined;
  /** Whether `listener` takes tokens (fixed at admission: read for every token, so the listener is not). */
  streams: boolean;
  traces: DecisionTrace[];
  retryAfterMs?: number;
  /** When it entered the router's hold (interrupted or admitted without a ready replica), or -1. */
  heldSince: number;
  /** Takes the current wait's deadline off the wheel (it is moot once the request is scheduled or ends). */
  disarm?: () => void;
}
