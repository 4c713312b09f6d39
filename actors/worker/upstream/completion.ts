// One request's streaming completion at an upstream model server (OpenAI `/v1/completions`, `stream: true`): the
// body from a submitted sequence (its prompt and any tokens already streamed, as ids or as their text), and the
// stream's untrusted chunks parsed with bounds into tokens, a finish, or a failure of that request.
import type { SubmitSeq } from '../../../machines/core-messages.ts';
import type { WireUpstreamSpec } from '../../../machines/messages.ts';
import { createSseParser } from './sse.ts';
import type { StreamHandlers, UpstreamHttp } from './http.ts';

/** The model's vocabulary, as the worker has it (the served model's tokenizer). */
export interface TextCodec {
  /** Text to token ids, without a BOS. */
  encode(text: string): number[];
  /** Token ids (without a leading BOS) to text. */
  decode(ids: readonly number[]): string;
}

/** What one completion reports. `failed` says whose fault: `request` (this request alone fails), `server` (the server
 * is not serving: the request waits to go again, and the error counts toward the replica's failure). */
export interface CompletionEvents {
  /** The server accepted the request (its response began). */
  accepted(): void;
  tokens(ids: number[], text: string): void;
  finished(reason: 'stop' | 'length', completionTokens: number | null): void;
  failed(whose: 'request' | 'server', message: string): void;
}

/** Most token ids and text of one chunk. */
const MAX_CHUNK_IDS = 65_536;
const MAX_CHUNK_TEXT = 64 * 1024;

/** The request body of a sequence: its prompt and the tokens already streamed, `left` tokens still to make. */
export function completionBody(
  spec: WireUpstreamSpec,
  seq: SubmitSeq,
  left: number,
  codec: TextCodec | null,
  bos: number | null,
): string {
  const prompt = seq.prompt ?? [];
  const ids = seq.out && seq.out.length > 0 ? [...prompt, ...seq.out] : prompt;
  let sent: number[] | string = ids;
  if (spec.prompt === 'text') {
    // The server tokenizes the text again and adds its own BOS.
    const body = bos !== null && ids[0] === bos ? ids.slice(1) : ids;
    sent = codec ? codec.decode(body) : '';
  }
  const s = seq.sampling ?? {};
  return JSON.stringify({
    model: spec.model,
    prompt: sent,
    max_tokens: left,
    stream: true,
    stream_options: { include_usage: true },
    ...(s.temperature !== undefined ? { temperature: s.temperature } : {}),
    ...(s.topP !== undefined ? { top_p: s.topP } : {}),
    ...(s.seed !== undefined ? { seed: s.seed } : {}),
    ...(s.stop !== undefined && s.stop.length > 0 ? { stop: s.stop } : {}),
    ...(spec.tokenIds ? { return_token_ids: true } : {}),
  });
}

const errorText = (v: unknown): string => {
  const e = (v as { error?: unknown } | null)?.error;
  const m = typeof e === 'object' && e !== null ? (e as { message?: unknown }).message : e;
  return (typeof m === 'string' ? m : JSON.stringify(e ?? v)).slice(0, 300);
};

/** Reads one parsed chunk: an error, a choice's text/ids/finish, or the usage. */
function onChunk(
  v: unknown,
  codec: TextCodec | null,
  ev: CompletionEvents,
  state: { reason: 'stop' | 'length' | null; usage: number | null },
): string | null {
  if (typeof v !== 'object' || v === null) return 'a chunk that is not an object';
  const o = v as { choices?: unknown; usage?: unknown; error?: unknown };
  if (o.error !== undefined) return `the server failed the request: ${errorText(o)}`;
  const u = (o.usage as { completion_tokens?: unknown } | null | undefined)?.completion_tokens;
  if (typeof u === 'number' && Number.isSafeInteger(u) && u >= 0) state.usage = u;
  if (!Array.isArray(o.choices) || o.choices.length === 0) return null;
  const c = o.choices[0] as { text?: unknown; token_ids?: unknown; finish_reason?: unknown; delta?: unknown };
  const text = typeof c.text === 'string' ? c.text : '';
  if (text.length > MAX_CHUNK_TEXT) return `a chunk of more than ${MAX_CHUNK_TEXT} characters`;
  let ids: number[] | null = null;
  if (Array.isArray(c.token_ids)) {
    if (c.token_ids.length > MAX_CHUNK_IDS) return `a chunk of more than ${MAX_CHUNK_IDS} token ids`;
    if (!c.token_ids.every((t) => Number.isSafeInteger(t) && (t as number) >= 0 && (t as number) < 2 ** 31))
      return 'a chunk with token ids that are not token ids';
    ids = c.token_ids as number[];
  }
  if (ids === null && text !== '') ids = codec ? codec.encode(text) : [0];
  if (ids !== null && (ids.length > 0 || text !== '')) ev.tokens(ids, text);
  if (c.finish_reason === 'length') state.reason = 'length';
  else if (typeof c.finish_reason === 'string') state.reason = 'stop';
  return null;
}

/** Sends one sequence upstream; answers the function that closes its stream (a cancel: the server's request ends). */
export function streamCompletion(
  http: UpstreamHttp,
  body: string,
  codec: TextCodec | null,
  ev: CompletionEvents,
): () => void {
  const state = { reason: null as 'stop' | 'length' | null, usage: null as number | null };
  let status = 0;
  let errorBody = '';
  let over: string | null = null;
  let close = (): void => undefined;
  const fail = (whose: 'request' | 'server', message: string): void => {
    if (over !== null) return;
    over = message;
    close();
    ev.failed(whose, message);
  };
  const parser = createSseParser((data) => {
    if (over !== null) return;
    if (data === '[DONE]') return;
    let v: unknown;
    try {
      v = JSON.parse(data);
    } catch {
      return fail('server', 'a chunk that is not JSON');
    }
    const bad = onChunk(v, codec, ev, state);
    if (bad) fail('server', bad);
  });
  const h: StreamHandlers = {
    head: (s) => {
      status = s;
      if (s === 200) ev.accepted();
    },
    chunk: (text) => {
      if (over !== null) return;
      if (status !== 200) {
        if (errorBody.length < 4096) errorBody += text;
        return;
      }
      const bad = parser.push(text);
      if (bad) fail('server', bad);
    },
    end: (error) => {
      if (over !== null) return;
      if (error !== null) return fail('server', error);
      if (status !== 200) {
        let why = errorBody.slice(0, 300);
        try {
          why = errorText(JSON.parse(errorBody));
        } catch {
          // not JSON: the text as it is
        }
        // 4xx but 408/429 is this request's fault; anything else is the server's.
        const mine = status >= 400 && status < 500 && status !== 408 && status !== 429;
        return fail(mine ? 'request' : 'server', `the server answered ${status}: ${why}`);
      }
      if (state.reason === null) return fail('server', 'the stream ended without a finish reason');
      over = 'finished';
      ev.finished(state.reason, state.usage);
    },
  };
  close = http.stream('/v1/completions', body, h);
  return () => {
    if (over === null) over = 'closed';
    close();
  };
}
