// OpenAI-compatible HTTP: POST /v1/completions and /v1/chat/completions (whole reply or SSE stream) and GET
// /v1/models. Admission happens before any byte is written, so overload is a real 429 with Retry-After and
// unavailability a real 503; a failure after streaming began is an SSE `error` event, and the stream then ends.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { unixTimeMs, type Clock, type TimerId } from '../../runtime/clock.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';
import type { ChatMessage, ClientRequest } from '../../transport/client-protocol.ts';
import type { TerminalOutcome } from '../../actors/control-plane.ts';
import type { TokenLogprob } from '../../machines/core-messages.ts';
import { TOKEN_FLUSH_MS, type DoneInfo, type Serving, type StreamSink } from '../serving.ts';
import { estimateTokens } from '../pseudo-text.ts';
import { errorBody, readJson, sendFailure, sendJson } from './io.ts';
import {
  anyOf,
  arr,
  bool,
  fieldPath,
  int,
  lit,
  nullable,
  num,
  obj,
  oneOf,
  optional,
  refine,
  str,
  validate,
  type Infer,
  type Schema,
} from '../../transport/schema.ts';

/** Default max_tokens of /v1/completions (OpenAI's own default). */
export const DEFAULT_COMPLETION_TOKENS = 16;
/** Default max_tokens of /v1/chat/completions. */
export const DEFAULT_CHAT_TOKENS = 64;
/** Stands for a token's text in the chunk template a request encodes once. */
const TOKEN_MARK = '\u0000token\u0000';
/** Bytes an SSE response may have queued before a slow reader is cut off. */
const MAX_SSE_BUFFERED = 4 * 1024 * 1024;
/** Longest time a streaming response's status and headers wait to leave with its first event (ms). */
export const SSE_HEAD_WAIT_MS = 50;

/** A parsed body: the request as every client API hands it to serving, and how this endpoint answers. */
interface Parsed extends ClientRequest {
  prompt: string;
  promptTokens: number;
  stream: boolean;
  includeUsage: boolean;
}

const bad = (message: string): Failure => failure('invalid_request', message);

const bytesOf = (text: string): number[] => [...Buffer.from(text, 'utf8')];

/** A token's log-probability as chat completions give it (`choices[0].logprobs.content[i]`). */
function chatLogprob(x: TokenLogprob): Record<string, unknown> {
  return {
    token: x.text,
    logprob: x.lp,
    bytes: bytesOf(x.text),
    top_logprobs: x.top.map((a) => ({ token: a.text, logprob: a.lp, bytes: bytesOf(a.text) })),
  };
}

/** Tokens' log-probabilities as (legacy) completions give them, text offsets counted from `offset`. */
function completionLogprobs(lp: readonly TokenLogprob[], offset: number): Record<string, unknown> {
  const textOffset: number[] = [];
  let at = offset;
  for (const x of lp) {
    textOffset.push(at);
    at += x.text.length;
  }
  return {
    tokens: lp.map((x) => x.text),
    token_logprobs: lp.map((x) => x.lp),
    // A map per token; a token text met twice among the alternatives keeps the most likely (they come sorted).
    top_logprobs: lp.map((x) => {
      const m = new Map<string, number>();
      for (const a of x.top) if (!m.has(a.text)) m.set(a.text, a.lp);
      return Object.fromEntries(m);
    }),
    text_offset: textOffset,
  };
}

/** Fields both endpoints read; an OpenAI field that asks for what is not implemented is refused (UNSUPPORTED). */
const commonFields = {
  model: str({ min: 1, max: 100 }),
  max_tokens: optional(nullable(int({ min: 1, max: 1_000_000 }))),
  max_completion_tokens: optional(nullable(int({ min: 1, max: 1_000_000 }))),
  stream: optional(nullable(bool())),
  n: optional(nullable(lit(1))),
  stream_options: optional(nullable(obj({ include_usage: optional(nullable(bool())) }, { strict: false }))),
  priority: optional(str({ min: 1, max: 50 })),
  deadline_ms: optional(num({ min: 0, max: 1e9 })),
  // Sampling: these reach a real engine (the cost model ignores them).
  temperature: optional(nullable(num({ min: 0, max: 2 }))),
  top_p: optional(nullable(num({ min: 0, max: 1 }))),
  seed: optional(nullable(int({ min: 0, max: 2 ** 32 - 1 }))),
  stop: optional(nullable(anyOf(str({ min: 1, max: 1024 }), arr(str({ min: 1, max: 1024 }), { max: 4 })))),
  // Log-probabilities: on chat `logprobs: true` with `top_logprobs` alternatives, on completions `logprobs: n`.
  logprobs: optional(nullable(anyOf(bool(), int({ min: 0, max: 5 })))),
  top_logprobs: optional(nullable(int({ min: 0, max: 20 }))),
  // JSON output: OpenAI's JSON mode (any object) or a JSON schema, enforced by the engine's grammar.
  response_format: optional(
    nullable(
      obj(
        {
          type: oneOf('text', 'json_object', 'json_schema'),
          json_schema: optional(
            obj(
              {
                name: optional(str({ max: 64 })),
                description: optional(str({ max: 4096 })),
                // Any object here: what the grammar honours is checked by serving (actors/engine/json-schema.ts).
                schema: optional(obj({}, { strict: false })),
                strict: optional(nullable(bool())),
              },
              { strict: false },
            ),
          ),
        },
        { strict: false },
      ),
    ),
  ),
};
const commonSchema = obj(commonFields, { strict: false });
type Common = Infer<typeof commonSchema>;

/** The request fields of a parsed body, with the endpoint's default max_tokens. */
function common(b: Common, dflt: number): Omit<Parsed, 'prompt' | 'promptTokens'> {
  return {
    model: b.model,
    maxTokens: b.max_completion_tokens ?? b.max_tokens ?? dflt,
    stream: b.stream === true,
    includeUsage: b.stream_options?.include_usage === true,
    ...(b.priority !== undefined ? { priority: b.priority } : {}),
    ...(b.deadline_ms !== undefined ? { deadlineMs: b.deadline_ms } : {}),
    ...(b.temperature != null ? { temperature: b.temperature } : {}),
    ...(b.top_p != null ? { topP: b.top_p } : {}),
    ...(b.seed != null ? { seed: b.seed } : {}),
    ...(b.stop != null ? { stop: typeof b.stop === 'string' ? [b.stop] : b.stop } : {}),
    ...jsonFormat(b.response_format),
  };
}

/** The JSON schema a response_format asks for, as JSON text (JSON mode: any object), or nothing for text. */
function jsonFormat(f: Common['response_format']): { jsonSchema?: string } {
  if (!f || f.type === 'text') return {};
  if (f.type === 'json_object') return { jsonSchema: '{"type":"object"}' };
  return { jsonSchema: JSON.stringify(f.json_schema?.schema ?? { type: 'object' }) };
}

const MAX_PROMPT_CHARS = 1_000_000;

/** Schema of a /v1/completions body. */
export const completionBody = refine(
  obj(
    {
      ...commonSchema.fields,
      prompt: optional(anyOf(str({ max: MAX_PROMPT_CHARS }), arr(str({ max: MAX_PROMPT_CHARS }), { min: 1, max: 1 }))),
    },
    { strict: false },
  ),
  (b, refuse): Parsed => {
    const prompt = typeof b.prompt === 'string' ? b.prompt : (b.prompt?.[0] ?? '');
    if (typeof b.logprobs === 'boolean') refuse('logprobs', 'is a number of alternatives (0 to 5) on completions');
    if (b.top_logprobs != null) refuse('top_logprobs', 'is for chat completions: completions take logprobs: n');
    // Object.assign, not a spread followed by new keys (which gives every object a hidden class of its own in V8).
    return Object.assign(
      common(b, DEFAULT_COMPLETION_TOKENS),
      { prompt, promptTokens: estimateTokens(prompt) },
      typeof b.logprobs === 'number' ? { logprobs: b.logprobs } : {},
    );
  },
);

const part = obj(
  { type: optional(str({ max: 50 })), text: optional(str({ max: MAX_PROMPT_CHARS })) },
  { strict: false },
);
const message = obj(
  {
    // Tool results and tool calls are refused with the tools themselves (UNSUPPORTED); `developer` is the system's.
    role: oneOf('system', 'developer', 'user', 'assistant'),
    content: optional(nullable(anyOf(str({ max: MAX_PROMPT_CHARS }), arr(part, { max: 10_000 })))),
  },
  { strict: false },
);

/** Schema of a /v1/chat/completions body; prompt tokens are the estimate of every message's text plus 3 each. */
export const chatBody = refine(
  obj({ ...commonSchema.fields, messages: arr(message, { min: 1, max: 10_000 }) }, { strict: false }),
  (b, refuse): Parsed => {
    let prompt = '';
    const messages: ChatMessage[] = [];
    for (const [i, m] of b.messages.entries()) {
      const c = m.content;
      if (Array.isArray(c) && c.some((p) => p.type !== undefined && p.type !== 'text'))
        refuse(`messages[${i}].content`, 'only text parts are supported');
      const text = typeof c === 'string' ? c : (c ?? []).map((p) => p.text ?? '').join('');
      prompt += `${m.role}: ${text}\n`;
      if (prompt.length > MAX_PROMPT_CHARS) refuse('messages', 'are too long');
      messages.push({ role: m.role === 'developer' ? 'system' : m.role, content: text });
    }
    if (typeof b.logprobs === 'number') refuse('logprobs', 'is true or false on chat completions');
    if (b.top_logprobs != null && b.logprobs !== true) refuse('top_logprobs', 'needs logprobs: true');
    const base = Object.assign(
      common(b, DEFAULT_CHAT_TOKENS),
      b.logprobs === true ? { logprobs: b.top_logprobs ?? 0 } : {},
    );
    return Object.assign(base, { prompt, messages, promptTokens: estimateTokens(prompt) + 3 * b.messages.length });
  },
);

const nonEmpty = (v: unknown): boolean => !(Array.isArray(v) && v.length === 0);
const notNone = (v: unknown): boolean => v !== 'none';
const notFalse = (v: unknown): boolean => v !== false;
const nonZero = (v: unknown): boolean => v !== 0;
const TOOLS = 'tool and function calling are not supported';

/**
 * OpenAI fields switchyard does not implement, with when a value asks for them (null and an absent field never do): a
 * request that asks is refused with invalid_request naming the field, never served as if it had not asked.
 */
const UNSUPPORTED: ReadonlyMap<string, { asks: (v: unknown) => boolean; why: string }> = new Map([
  ['tools', { asks: nonEmpty, why: TOOLS }],
  ['functions', { asks: nonEmpty, why: TOOLS }],
  ['tool_choice', { asks: notNone, why: TOOLS }],
  ['function_call', { asks: notNone, why: TOOLS }],
  [
    'logit_bias',
    {
      asks: (v: unknown) => typeof v !== 'object' || Object.keys(v as object).length > 0,
      why: 'logit bias is not supported',
    },
  ],
  ['frequency_penalty', { asks: nonZero, why: 'penalties are not supported (0 only)' }],
  ['presence_penalty', { asks: nonZero, why: 'penalties are not supported (0 only)' }],
  ['modalities', { asks: (v: unknown) => !(Array.isArray(v) && v.every((m) => m === 'text')), why: 'text only' }],
  ['audio', { asks: () => true, why: 'audio output is not supported' }],
  ['echo', { asks: notFalse, why: 'echoing the prompt is not supported' }],
  ['suffix', { asks: (v: unknown) => v !== '', why: 'insertion (suffix) is not supported' }],
  ['best_of', { asks: (v: unknown) => v !== 1, why: 'best_of must be 1' }],
]);

/** The first unsupported field the body asks for, as a refusal naming it, or null. */
function unsupported(body: unknown): Failure | null {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return null;
  for (const [field, { asks, why }] of UNSUPPORTED) {
    if (!Object.hasOwn(body, field)) continue;
    const v = (body as Record<string, unknown>)[field];
    if (v !== null && v !== undefined && asks(v)) return bad(`${field}: ${why}`);
  }
  return null;
}

/** Checks a body against its schema; a failure names the field, as does a field switchyard does not implement. */
function parseWith(schema: Schema<Parsed>, body: unknown): Parsed | Failure {
  const refused = unsupported(body);
  if (refused) return refused;
  const v = validate(schema, body);
  return v.ok ? v.value : bad(`${fieldPath(v.error.path)}: ${v.error.message}`);
}

/** Parses a /v1/completions body. */
export function parseCompletion(body: unknown): Parsed | Failure {
  return parseWith(completionBody, body);
}

/** Parses a /v1/chat/completions body. */
export function parseChat(body: unknown): Parsed | Failure {
  return parseWith(chatBody, body);
}

const usageOf = (d: DoneInfo): { prompt_tokens: number; completion_tokens: number; total_tokens: number } => ({
  prompt_tokens: d.usage.promptTokens,
  completion_tokens: d.usage.completionTokens,
  total_tokens: d.usage.promptTokens + d.usage.completionTokens,
});

/**
 * One completion request's answer, and the sink serving talks to. A class, so a request makes no closures (under tsx
 * each named closure also gets a `name` property of its own: a property array per function, on every request).
 *
 * A streaming response's status line and headers are written with its first event (one write to the socket where
 * there were two), or once SSE_HEAD_WAIT_MS pass without one, so a client whose request waits in a queue still hears
 * soon that it was accepted. Without a clock they leave at once.
 *
 * Its first tokens are written at once; later ones wait until `flushMs` (TOKEN_FLUSH_MS unless the server says
 * otherwise) after the response's previous write, and the events that waited leave together, in order (the stream's
 * events are the same, in fewer writes). Its end takes whatever waits with it.
 */
class Completion implements StreamSink {
  /** The response's id, known once the request is admitted. */
  id = '';
  private text = '';
  private first = true;
  private finished = false;
  private streaming = false;
  private headers: Record<string, string> | null = null;
  private headSent = false;
  private headTimer: TimerId | null = null;
  // Later token events waiting for the next write, its timer, and when the response last wrote.
  private pending = '';
  private flushTimer: TimerId | null = null;
  private lastWriteAt = -Infinity;
  // A token chunk's constant parts, encoded once per request at its first token (the id is known by then).
  private tokenHead = '';
  private tokenTail = '';
  private readonly created = Math.floor(unixTimeMs() / 1000);
  // Log-probabilities of a response that asked for them (not streamed), and a streamed one's text offset.
  private readonly logprobs: TokenLogprob[] = [];
  private offset = 0;

  constructor(
    private readonly res: ServerResponse,
    private readonly chat: boolean,
    private readonly p: Parsed,
    private readonly clock: Clock | undefined,
    private readonly flushMs: number,
  ) {}

  /** The response streams from now on: its head leaves with the first event, or when the wait is over. */
  startStream(headers: Record<string, string>): void {
    this.headers = headers;
    this.streaming = true;
    if (this.clock) this.headTimer = this.clock.setTimeout(() => this.flushHead(), SSE_HEAD_WAIT_MS);
    else this.flushHead();
  }

  /** The connection closed: a request still running is cancelled. */
  closed(request: { cancel(): void }): void {
    this.clearHeadTimer();
    this.clearFlushTimer();
    if (!this.finished) request.cancel();
  }

  tokens(_seq: number, _n: number, t: string | undefined, lp?: readonly TokenLogprob[]): void {
    const asked = this.p.logprobs !== undefined;
    if (!this.p.stream) {
      if (asked) for (const x of lp ?? []) this.logprobs.push(x);
      this.text += t ?? '';
      return;
    }
    const role =
      this.chat && this.first
        ? event(this.chunk({ delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null }))
        : '';
    this.first = false;
    const sse = role + (asked ? this.logprobEvent(t ?? '', lp ?? []) : this.tokenEvent(t ?? ''));
    const { clock } = this;
    // The first tokens never wait: nothing was written before them (the head alone does not count).
    const wait = clock ? this.lastWriteAt + this.flushMs - clock.now() : 0;
    if (wait <= 0 && this.flushTimer === null) return this.send(sse);
    this.pending += sse;
    if (this.flushTimer === null) this.flushTimer = clock!.setTimeout(() => this.flushPending(), wait);
  }

  done(d: DoneInfo): void {
    this.finished = true;
    const { chat, p, res } = this;
    if (!p.stream) {
      const choice = chat
        ? {
            index: 0,
            message: { role: 'assistant', content: this.text, refusal: null },
            finish_reason: d.finishReason,
            logprobs: this.p.logprobs === undefined ? null : { content: this.logprobs.map(chatLogprob) },
          }
        : {
            index: 0,
            text: this.text,
            finish_reason: d.finishReason,
            logprobs: this.p.logprobs === undefined ? null : completionLogprobs(this.logprobs, 0),
          };
      return sendJson(res, 200, {
        id: this.id,
        object: chat ? 'chat.completion' : 'text_completion',
        created: this.created,
        model: p.model,
        choices: [choice],
        usage: usageOf(d),
        switchyard: { timings: d.timings },
      });
    }
    let last = event(
      chat
        ? this.chunk({ delta: {}, finish_reason: d.finishReason, logprobs: null })
        : this.chunk({ text: '', finish_reason: d.finishReason, logprobs: null }),
    );
    if (p.includeUsage)
      last += event({
        id: this.id,
        object: chat ? 'chat.completion.chunk' : 'text_completion',
        created: this.created,
        model: p.model,
        choices: [],
        usage: usageOf(d),
      });
    this.send(`${last}data: [DONE]\n\n`, true);
  }

  failed(f: Failure & { outcome: TerminalOutcome['outcome'] }): void {
    this.finished = true;
    // Once the stream is accepted its status is 200 (sent or not yet): the failure is an event of the stream.
    if (!this.p.stream || !this.streaming) return sendFailure(this.res, f);
    this.send(event(errorBody(f)), true);
  }

  private chunk(choice: Record<string, unknown>): Record<string, unknown> {
    return {
      id: this.id,
      object: this.chat ? 'chat.completion.chunk' : 'text_completion',
      created: this.created,
      model: this.p.model,
      choices: [{ index: 0, ...choice }],
    };
  }

  /** A token chunk carrying its log-probabilities (built whole: no template to fill). */
  private logprobEvent(t: string, lp: readonly TokenLogprob[]): string {
    const logprobs = this.chat ? { content: lp.map(chatLogprob) } : completionLogprobs(lp, this.offset);
    for (const x of lp) this.offset += x.text.length;
    return event(
      this.chat
        ? this.chunk({ delta: { content: t }, finish_reason: null, logprobs })
        : this.chunk({ text: t, finish_reason: null, logprobs }),
    );
  }

  private tokenEvent(t: string): string {
    if (this.tokenHead === '') {
      const mark = JSON.stringify(TOKEN_MARK);
      const tpl = event(
        this.chat
          ? this.chunk({ delta: { content: TOKEN_MARK }, finish_reason: null, logprobs: null })
          : this.chunk({ text: TOKEN_MARK, finish_reason: null, logprobs: null }),
      );
      // The text is the last string of the chunk (the model name, earlier, may be anything).
      const at = tpl.lastIndexOf(mark);
      this.tokenHead = tpl.slice(0, at);
      this.tokenTail = tpl.slice(at + mark.length);
    }
    return this.tokenHead + JSON.stringify(t) + this.tokenTail;
  }

  /** What one sink call says leaves in one write (the chat role chunk with the first token; the last chunk, usage and
   * [DONE] in the end). */
  private send(sse: string, end = false): void {
    const { res } = this;
    if (this.pending !== '') {
      sse = this.pending + sse;
      this.pending = '';
      this.clearFlushTimer();
    }
    if (res.writableEnded || res.destroyed) return;
    this.lastWriteAt = this.clock?.now() ?? 0;
    this.head();
    if (end) return void res.end(sse);
    res.write(sse);
    // A reader that stopped reading must not grow the buffer without bound: cut it off (its request is cancelled on close).
    if (res.writableLength > MAX_SSE_BUFFERED) res.destroy();
  }

  private head(): void {
    if (this.headers === null || this.headSent) return;
    this.headSent = true;
    this.clearHeadTimer();
    const { res } = this;
    if (!res.destroyed && !res.writableEnded) res.writeHead(200, this.headers);
  }

  private flushHead(): void {
    this.headTimer = null;
    this.head();
    const { res } = this;
    if (!res.destroyed && !res.writableEnded) res.flushHeaders();
  }

  /** Writes the token events that waited. */
  private flushPending(): void {
    this.flushTimer = null;
    if (this.pending !== '') this.send('');
  }

  private clearFlushTimer(): void {
    if (this.flushTimer !== null) this.clock?.clearTimeout(this.flushTimer);
    this.flushTimer = null;
  }

  private clearHeadTimer(): void {
    if (this.headTimer !== null) this.clock?.clearTimeout(this.headTimer);
    this.headTimer = null;
  }
}

const event = (data: unknown): string => `data: ${JSON.stringify(data)}\n\n`;

/** Handles POST /v1/completions (`chat` false) or /v1/chat/completions (`chat` true). `clock` times how long a
 * streaming response's headers may wait for its first event, and its later tokens for the next write (`flushMs`;
 * see Completion). */
export async function handleCompletion(
  serving: Serving,
  req: IncomingMessage,
  res: ServerResponse,
  chat: boolean,
  tenant?: string,
  clock?: Clock,
  flushMs = TOKEN_FLUSH_MS,
): Promise<void> {
  const body = await readJson(req);
  if (!body.ok) return sendFailure(res, body.failure, body.status);
  const p = chat ? parseChat(body.value) : parseCompletion(body.value);
  if ('code' in p) return sendFailure(res, p);
  const c = new Completion(res, chat, p, clock, flushMs);
  const { stream: _stream, includeUsage: _usage, ...request } = p;
  const r = serving.submit(request, c, { text: true, logprobs: true, ...(tenant !== undefined ? { tenant } : {}) });
  if (!r.ok) return sendFailure(res, r.failure);
  c.id = `${chat ? 'chatcmpl' : 'cmpl'}-${r.request}`;
  res.on('close', () => c.closed(r));
  if (p.stream)
    c.startStream({
      'Content-Type': 'text/event-stream',
      'Cache-Control': 'no-cache',
      Connection: 'keep-alive',
      'X-Request-Id': r.request,
    });
}

/** Handles GET /v1/models: every configured model, with the backend that serves it (llama.cpp or simulated). */
export function handleModels(serving: Serving, res: ServerResponse): void {
  const created = Math.floor(unixTimeMs() / 1000);
  const ready = serving.readiness();
  sendJson(res, 200, {
    object: 'list',
    data: serving.models().map(({ backend, runs, ...m }) => ({
      id: m.name,
      object: 'model',
      created,
      owned_by: 'switchyard',
      backend,
      switchyard: { backend: runs, ...m, ready: ready[m.name]?.ready ?? false },
    })),
  });
}
