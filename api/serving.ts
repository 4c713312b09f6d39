// What every client API (WebSocket stream, OpenAI HTTP, chat) uses: submit a request to the control plane and hear
// accepted / tokens (with pseudo-text) / exactly one terminal event; readiness and model listing.
import type { TokenLogprob } from '../machines/core-messages.ts';
import { jsonSchemaTextProblem } from '../actors/engine/json-schema.ts';
import type { ProfileFit } from '../actors/profile-fit.ts';
import type { ClientListener, ControlPlane, TerminalOutcome } from '../actors/control-plane.ts';
import { failure, type Failure } from '../machines/outcomes.ts';
import type { NodeLink } from '../actors/node-link.ts';
import type { ChatMessage, ClientRequest, Sampling } from '../transport/client-protocol.ts';
import type { ServerMetrics } from './metrics.ts';
import { estimateTokens, textRange, textSeed } from './pseudo-text.ts';

/** How the edge hands an accepted request over, besides the request itself: how its tokens are delivered, and the
 * facts the edge assigned to it (not the client's to choose). */
export interface Delivery {
  /** Token events carry their text (default) or counts only. */
  text: boolean;
  /** The tenant whose token the request came with (the tenant gate applies its limits and fair share). */
  tenant?: string;
  /** The control plane's id for it, when assigned before admission (the tenant gate does). */
  id?: string;
  /** Its prompt as counted already (the tenant gate counts it to charge the tenant): not counted again. */
  counted?: CountedPrompt;
  /** The API returns log-probabilities (the OpenAI HTTP API); a request asking for them elsewhere is refused. */
  logprobs?: boolean;
}

/** A prompt as admission counts it: a real engine's tokens with its sampling, or the cost model's count. */
export interface CountedPrompt {
  promptTokens: number;
  engine: { prompt: number[]; sampling: Sampling } | null;
  /** Set when the model's chat template refused the messages: the request is refused with it, before any work. */
  refused?: Failure;
}

/** A model's own tokenizer (a real engine's): prompt text to token ids. */
export interface PromptTokenizer {
  tokenize(text: string): number[];
  /** Chat messages rendered through the model's chat template, ready for the assistant's reply, as token ids. */
  tokenizeChat?(messages: readonly ChatMessage[]): number[];
}

/** The prompt as a real engine's model tokenizes it (chat messages through its chat template), or null for a
 * cost-model model (counted by estimate); a chat template that refuses the messages is a failure. */
function engineInput(
  tokenizer: PromptTokenizer | undefined,
  req: ClientRequest,
): { prompt: number[]; sampling: Sampling } | Failure | null {
  const s = req;
  if (!tokenizer) {
    // The cost model's pseudo-text has no distribution to report and no grammar to follow: asking is refused.
    if (s.logprobs !== undefined || s.jsonSchema !== undefined)
      return failure(
        'invalid_request',
        `${s.logprobs !== undefined ? 'logprobs' : 'response_format'}: model ${req.model} is simulated (deterministic ` +
          'pseudo-text): log-probabilities and JSON output need a real engine',
      );
    return null;
  }
  const problem = s.jsonSchema === undefined ? null : jsonSchemaTextProblem(s.jsonSchema);
  if (problem) return failure('invalid_request', `response_format: the JSON ${problem}`);
  const sampling = {
    ...(s.temperature !== undefined ? { temperature: s.temperature } : {}),
    ...(s.topP !== undefined ? { topP: s.topP } : {}),
    ...(s.seed !== undefined ? { seed: s.seed } : {}),
    ...(s.stop !== undefined && s.stop.length > 0 ? { stop: [...s.stop] } : {}),
    ...(s.logprobs !== undefined ? { logprobs: s.logprobs } : {}),
    ...(s.jsonSchema !== undefined ? { jsonSchema: s.jsonSchema } : {}),
  };
  const { messages } = req;
  if (!messages || !tokenizer.tokenizeChat) return { prompt: tokenizer.tokenize(req.prompt ?? ''), sampling };
  try {
    return { prompt: tokenizer.tokenizeChat(messages), sampling };
  } catch (e) {
    // A template may raise (e.g. roles that do not alternate as it wants): that request alone is refused.
    const why = (e instanceof Error ? e.message : String(e)).slice(0, 300);
    return failure('invalid_request', `messages: the model's chat template refused them: ${why}`);
  }
}

/** How a request ended well. */
export interface DoneInfo {
  finishReason: 'length' | 'stop';
  usage: { promptTokens: number; completionTokens: number };
  timings: { queueMs: number; ttftMs: number; e2eMs: number };
}

/** What a client API hears about a request after it was accepted. */
export interface StreamSink {
  /** `lp`: the tokens' log-probabilities, when the request asked for them. */
  tokens(seq: number, n: number, text: string | undefined, lp?: readonly TokenLogprob[]): void;
  /** Exactly one of done / failed ends the request. */
  done(info: DoneInfo): void;
  failed(f: Failure & { outcome: TerminalOutcome['outcome'] }): void;
}

/** An accepted request. */
export interface Accepted {
  ok: true;
  request: string;
  model: string;
  version: string;
  promptTokens: number;
  cancel(): void;
}

/** Readiness of one model. */
export interface ModelReadiness {
  ready: boolean;
  /** Each replica's machine state, its GPUs, and why outlier ejection keeps it out of routing now (null: it is in). */
  replicas: { id: string; state: string; gpus: number[]; ejected: string | null }[];
  reason: string | null;
  /** A real engine's calibrated profile against this machine's first steps (see actors/profile-fit.ts): a profile
   * that does not fit serves on, and says so here. */
  profile?: ProfileFit;
}

/** The serving facade over a control plane. */
export interface Serving {
  /** Counts the prompt (a real engine's tokenizer, else the estimate) and submits the request to the control plane;
   * answers the model version it resolved to, or the refusal. */
  submit(req: ClientRequest, sink: StreamSink, delivery?: Delivery): Accepted | { ok: false; failure: Failure };
  /** The prompt as admission counts it: a real engine's tokenizer, else the client's count or the estimate. */
  count(req: ClientRequest): CountedPrompt;
  readiness(): Record<string, ModelReadiness>;
  models(): {
    name: string;
    versions: string[];
    aliases: Record<string, string>;
    tp: number;
    kind: string;
    /** What serves it: `llama.cpp` or `simulated` (backendOf). */
    backend: string;
    /** What it runs on, in words: the engine and its file, or the simulated executor. */
    runs: string;
  }[];
  /** The backends of every model, joined: what a client is told serves this server (`llama.cpp`, `simulated`). */
  backend(): string;
  readonly cp: ControlPlane;
}

/**
 * Least time between two writes to one client that carry only a stream's later tokens and end (ms), on the streaming
 * WebSocket API and on the OpenAI endpoints' SSE streams (`--token-flush-ms`). Each write is a system call, and on
 * loopback it costs the writer tens of microseconds (the receiver's TCP work runs in it): with a write per client per
 * turn of the event loop, bench:live's 1,000 req/s made about 13,500 writes a second, half of serve's event loop. A
 * request's later tokens and its end may instead wait up to this long for the next write to that client; its first
 * tokens, and every answer or error, never wait. On a GPU a stream's tokens are a model step apart (tens of
 * milliseconds), so a token waits at most this fraction of that; when steps cost nothing, several steps, and every
 * stream of a WebSocket connection, share one write.
 */
export const TOKEN_FLUSH_MS = 2;

const finite = (x: number): number => (Number.isFinite(x) && x >= 0 ? Math.round(x * 1000) / 1000 : 0);

/** Which text a request's tokens carry: none, a real engine's as it sampled it, or the cost model's words. */
const enum Text {
  None,
  Engine,
  Words,
}

const text = (delivery: Delivery, engine: unknown): Text =>
  !delivery.text ? Text.None : engine ? Text.Engine : Text.Words;

/** An accepted request, held by its client API while it lives: a class, so a request makes no closure for its
 * cancel (under tsx each closure would also get a `name` property of its own). */
class Admitted implements Accepted {
  readonly ok = true;
  constructor(
    private readonly cp: ControlPlane,
    readonly request: string,
    readonly model: string,
    readonly version: string,
    readonly promptTokens: number,
  ) {}
  cancel(): void {
    this.cp.cancel(this.request);
  }
}

/**
 * What the control plane tells one request's client API, relayed to its sink: a class rather than closures, so a
 * request makes no functions and a token reaches the sink through this one object. Every outcome feeds the metrics.
 */
class Relay implements ClientListener {
  private isAccepted = false;
  constructor(
    private readonly sink: StreamSink,
    private readonly metrics: ServerMetrics,
    private readonly model: string,
    private readonly maxTokens: number,
    private readonly promptTokens: number,
    private readonly text: Text,
    private readonly seed: number,
  ) {}
  accepted(): void {
    this.isAccepted = true;
  }
  // A sink that throws is the control plane's to contain (RequestTable.deliver, and its end): that request alone fails.
  tokens(_id: string, seq: number, n: number, _t: number, text?: string, lp?: readonly TokenLogprob[]): void {
    const t = this.text;
    // The cost model's words are made only when asked for.
    this.sink.tokens(
      seq,
      n,
      t === Text.None ? undefined : t === Text.Engine ? (text ?? '') : textRange(this.seed, seq, n),
      lp,
    );
  }
  terminal(_id: string, o: TerminalOutcome): void {
    this.metrics.outcome(this.model, o);
    // A rejection is answered by submit's return value; only accepted requests hear a terminal event.
    if (!this.isAccepted) return;
    if (o.outcome === 'done') {
      const { receivedAt, firstTokenAt, finishedAt } = o.timings;
      this.sink.done({
        finishReason: o.tokens >= this.maxTokens ? 'length' : 'stop',
        usage: { promptTokens: this.promptTokens, completionTokens: o.tokens },
        timings: {
          queueMs: finite((firstTokenAt >= 0 ? firstTokenAt : finishedAt) - receivedAt),
          ttftMs: finite(firstTokenAt - receivedAt),
          e2eMs: finite(finishedAt - receivedAt),
        },
      });
    } else {
      const code = o.code ?? (o.outcome === 'cancelled' ? 'cancelled' : 'internal');
      const f = failure(code, o.message ?? `request ${o.outcome}`);
      this.sink.failed({
        ...f,
        outcome: o.outcome,
        ...(o.retryAfterMs !== undefined ? { retryAfterMs: o.retryAfterMs } : {}),
      });
    }
  }
}

/** Wraps a control plane for client APIs; every outcome also feeds the metrics. */
export function createServing(
  cp: ControlPlane,
  node: NodeLink,
  metrics: ServerMetrics,
  tokenizers: ReadonlyMap<string, PromptTokenizer> = new Map(),
): Serving {
  // A real engine's prompt is counted by its own tokenizer (routing, admission, usage, tenants' charges); else it is
  // the client's count or the estimate.
  const count = (req: ClientRequest): CountedPrompt => {
    const engine = engineInput(tokenizers.get(req.model), req);
    if (engine && 'code' in engine) return { promptTokens: 0, engine: null, refused: engine };
    return {
      promptTokens: engine ? engine.prompt.length : (req.promptTokens ?? estimateTokens(req.prompt ?? '')),
      engine,
    };
  };
  // A request refused here is counted as the control plane's rejection of it would be.
  const rejected = (req: ClientRequest, f: Failure): { ok: false; failure: Failure } => {
    const t = cp.runtime.clock.now();
    const timings = { receivedAt: t, firstTokenAt: -1, finishedAt: t };
    metrics.outcome(req.model, { outcome: 'rejected', code: f.code, message: f.message, tokens: 0, timings });
    return { ok: false, failure: f };
  };
  const submit = (
    req: ClientRequest,
    sink: StreamSink,
    delivery: Delivery = { text: true },
  ): Accepted | { ok: false; failure: Failure } => {
    if (req.logprobs !== undefined && delivery.logprobs !== true)
      return rejected(req, failure('invalid_request', 'logprobs: returned on the OpenAI HTTP API only'));
    // A name the control plane does not know is refused here, before the prompt is counted or anything admitted.
    const unknown = cp.router.check(req);
    if (unknown) return rejected(req, unknown);
    const counted = delivery.counted ?? count(req);
    if (counted.refused) return rejected(req, counted.refused);
    const { engine, promptTokens } = counted;
    const mode = text(delivery, engine);
    // The words' seed (a hash of the prompt) only when the cost model's words are streamed.
    const seed = mode === Text.Words ? textSeed(`${req.model}\u0000${req.prompt ?? String(promptTokens)}`) : 0;
    const relay = new Relay(sink, metrics, req.model, req.maxTokens, promptTokens, mode, seed);
    const res = cp.submit(
      {
        ...(delivery.id !== undefined ? { id: delivery.id } : {}),
        model: req.model,
        ...(req.version !== undefined ? { version: req.version } : {}),
        ...(req.priority !== undefined ? { priority: req.priority } : {}),
        promptTokens,
        maxTokens: req.maxTokens,
        outputTokens: req.maxTokens,
        ...(engine ? { engine } : {}),
        ...(req.deadlineMs !== undefined ? { deadlineMs: req.deadlineMs } : {}),
      },
      relay,
    );
    if (!res.ok) return { ok: false, failure: res.failure };
    return new Admitted(cp, res.id, req.model, res.version, promptTokens);
  };

  return {
    cp,
    submit,
    count,
    readiness: () => {
      // Entries made into an object once: a model named `__proto__` is then a key like any other.
      const out: [string, ModelReadiness][] = [];
      const all = [...cp.placement.replicas.values()];
      const serving = all.some((r) => r.accepting());
      for (const m of cp.scenario.models) {
        const replicas = all
          .filter((r) => r.model === m.name)
          .map((r) => ({ id: r.id, state: r.state(), gpus: [...r.gpus], ejected: cp.health.peek(r.id) }));
        const anyReady = all.some((r) => r.model === m.name && r.accepting());
        const why = cp.placement.unavailable(m.name);
        // Under `switch` a model without a replica is still servable while the node serves: placement switches to it.
        const switchable = cp.scenario.placement.policy === 'switch' && serving;
        const ready = why === null && (anyReady || switchable);
        const reason = ready ? null : !node.connected() ? 'no worker registered' : (why ?? 'no replica is ready yet');
        const fit = cp.profileFits.of(m.name);
        out.push([m.name, { ready, replicas, reason, ...(fit ? { profile: { ...fit } } : {}) }]);
      }
      return Object.fromEntries(out);
    },
    models: () =>
      cp.scenario.models.map((m) => ({
        name: m.name,
        versions: m.versions,
        aliases: m.aliases,
        tp: m.tp,
        kind: m.kind,
        ...backendOf(m),
      })),
    backend: () => [...new Set(cp.scenario.models.map((m) => backendOf(m).backend))].sort().join('+'),
  };
}

/** What serves a model: a llama.cpp engine on its GGUF file (real tokens), or the simulated cost-model executor. */
export function backendOf(m: { engine?: { kind: string; file: string; gpu?: string } }): {
  backend: string;
  runs: string;
} {
  if (!m.engine) return { backend: 'simulated', runs: 'simulated: cost-model executor, deterministic pseudo-text' };
  const where = m.engine.gpu && m.engine.gpu !== 'cpu' ? `, gpu ${m.engine.gpu}` : ', cpu';
  return { backend: m.engine.kind, runs: `${m.engine.kind} on ${m.engine.file}${where}: real tokens` };
}
