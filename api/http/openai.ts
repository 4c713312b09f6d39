// OpenAI-compatible HTTP: POST /v1/completions and /v1/chat/completions (whole reply or SSE stream) and GET
// /v1/models. Admission happens before any byte is written, so overload is a real 429 with Retry-After and
// unavailability a real 503; a failure after streaming began is an SSE `error` event, and the stream then ends.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { unixTimeMs } from '../../runtime/clock.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';
import type { DoneInfo, Serving, StreamSink } from '../serving.ts';
import { estimateTokens } from '../pseudo-text.ts';
import { errorBody, readJson, sendFailure, sendJson } from './io.ts';

/** Default max_tokens of /v1/completions (OpenAI's own default). */
export const DEFAULT_COMPLETION_TOKENS = 16;
/** Default max_tokens of /v1/chat/completions. */
export const DEFAULT_CHAT_TOKENS = 64;
/** Bytes an SSE response may have queued before a slow reader is cut off. */
const MAX_SSE_BUFFERED = 4 * 1024 * 1024;

interface Parsed {
  model: string;
  prompt: string;
  promptTokens: number;
  maxTokens: number;
  stream: boolean;
  includeUsage: boolean;
  priority?: string;
  deadlineMs?: number;
}

const bad = (message: string): Failure => failure('invalid_request', message);
const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function common(body: Record<string, unknown>, dflt: number): Failure | Omit<Parsed, 'prompt' | 'promptTokens'> {
  const { model, stream, n } = body;
  if (typeof model !== 'string' || model.length === 0 || model.length > 100)
    return bad('model must be a non-empty string');
  const max = body['max_completion_tokens'] ?? body['max_tokens'] ?? dflt;
  if (typeof max !== 'number' || !Number.isSafeInteger(max) || max < 1 || max > 1_000_000)
    return bad('max_tokens must be an integer >= 1');
  if (stream !== undefined && typeof stream !== 'boolean') return bad('stream must be a boolean');
  if (n !== undefined && n !== null && n !== 1) return bad('only n = 1 is supported');
  const so = body['stream_options'];
  const priority = body['priority'];
  if (priority !== undefined && (typeof priority !== 'string' || priority.length > 50))
    return bad('priority must be a class name');
  const deadline = body['deadline_ms'];
  if (deadline !== undefined && (typeof deadline !== 'number' || !(deadline >= 0)))
    return bad('deadline_ms must be a number >= 0');
  return {
    model,
    maxTokens: max,
    stream: stream === true,
    includeUsage: isObj(so) && so['include_usage'] === true,
    ...(typeof priority === 'string' ? { priority } : {}),
    ...(typeof deadline === 'number' ? { deadlineMs: deadline } : {}),
  };
}

/** Parses a /v1/completions body. */
export function parseCompletion(body: unknown): Parsed | Failure {
  if (!isObj(body)) return bad('body must be a JSON object');
  const c = common(body, DEFAULT_COMPLETION_TOKENS);
  if ('code' in c) return c;
  let prompt = body['prompt'] ?? '';
  if (Array.isArray(prompt)) {
    if (prompt.length !== 1) return bad('prompt arrays must hold exactly one prompt');
    prompt = prompt[0];
  }
  if (typeof prompt !== 'string' || prompt.length > 1_000_000) return bad('prompt must be a string');
  return { ...c, prompt, promptTokens: estimateTokens(prompt) };
}

/** Parses a /v1/chat/completions body; prompt tokens are the estimate of every message's text plus 3 per message. */
export function parseChat(body: unknown): Parsed | Failure {
  if (!isObj(body)) return bad('body must be a JSON object');
  const c = common(body, DEFAULT_CHAT_TOKENS);
  if ('code' in c) return c;
  const messages = body['messages'];
  if (!Array.isArray(messages) || messages.length === 0 || messages.length > 10_000)
    return bad('messages must be a non-empty array');
  let prompt = '';
  for (const [i, m] of messages.entries()) {
    if (!isObj(m) || typeof m['role'] !== 'string') return bad(`messages[${i}] must have a role`);
    const content = m['content'];
    let text = '';
    if (typeof content === 'string') text = content;
    else if (Array.isArray(content)) {
      for (const part of content) if (isObj(part) && typeof part['text'] === 'string') text += part['text'];
    } else if (content !== null && content !== undefined)
      return bad(`messages[${i}].content must be a string or an array of parts`);
    prompt += `${m['role']}: ${text}\n`;
  }
  if (prompt.length > 1_000_000) return bad('messages are too long');
  return { ...c, prompt, promptTokens: estimateTokens(prompt) + 3 * messages.length };
}

const usageOf = (d: DoneInfo): { prompt_tokens: number; completion_tokens: number; total_tokens: number } => ({
  prompt_tokens: d.usage.promptTokens,
  completion_tokens: d.usage.completionTokens,
  total_tokens: d.usage.promptTokens + d.usage.completionTokens,
});

/** Handles POST /v1/completions (`chat` false) or /v1/chat/completions (`chat` true). */
export async function handleCompletion(
  serving: Serving,
  req: IncomingMessage,
  res: ServerResponse,
  chat: boolean,
): Promise<void> {
  const body = await readJson(req);
  if (!body.ok) return sendFailure(res, body.failure, body.status);
  const p = chat ? parseChat(body.value) : parseCompletion(body.value);
  if ('code' in p) return sendFailure(res, p);
  const created = Math.floor(unixTimeMs() / 1000);
  const object = chat ? 'chat.completion' : 'text_completion';
  let text = '';
  let id = '';
  let first = true;
  let finished = false;
  const chunk = (choice: Record<string, unknown>, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
    id,
    object: chat ? 'chat.completion.chunk' : 'text_completion',
    created,
    model: p.model,
    choices: [{ index: 0, ...choice }],
    ...extra,
  });
  const write = (data: unknown): void => {
    if (res.writableEnded || res.destroyed) return;
    res.write(`data: ${JSON.stringify(data)}\n\n`);
    // A reader that stopped reading must not grow the buffer without bound: cut it off (its request is cancelled on close).
    if (res.writableLength > MAX_SSE_BUFFERED) res.destroy();
  };

  const sink: StreamSink = {
    tokens: (_seq, _n, t) => {
      if (!p.stream) {
        text += t ?? '';
        return;
      }
      if (chat && first)
        write(chunk({ delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null }));
      first = false;
      write(
        chat
          ? chunk({ delta: { content: t ?? '' }, finish_reason: null, logprobs: null })
          : chunk({ text: t ?? '', finish_reason: null, logprobs: null }),
      );
    },
    done: (d) => {
      finished = true;
      if (!p.stream) {
        const choice = chat
          ? {
              index: 0,
              message: { role: 'assistant', content: text, refusal: null },
              finish_reason: d.finishReason,
              logprobs: null,
            }
          : { index: 0, text, finish_reason: d.finishReason, logprobs: null };
        return sendJson(res, 200, {
          id,
          object,
          created,
          model: p.model,
          choices: [choice],
          usage: usageOf(d),
          switchyard: { timings: d.timings },
        });
      }
      write(
        chat
          ? chunk({ delta: {}, finish_reason: d.finishReason, logprobs: null })
          : chunk({ text: '', finish_reason: d.finishReason, logprobs: null }),
      );
      if (p.includeUsage)
        write({
          id,
          object: chat ? 'chat.completion.chunk' : 'text_completion',
          created,
          model: p.model,
          choices: [],
          usage: usageOf(d),
        });
      if (!res.writableEnded) res.end('data: [DONE]\n\n');
    },
    failed: (f) => {
      finished = true;
      if (!p.stream || !res.headersSent) return sendFailure(res, f);
      write(errorBody(f));
      if (!res.writableEnded) res.end();
    },
  };
  const r = serving.submit(
    {
      model: p.model,
      prompt: p.prompt,
      promptTokens: p.promptTokens,
      maxTokens: p.maxTokens,
      text: true,
      ...(p.priority !== undefined ? { priority: p.priority } : {}),
      ...(p.deadlineMs !== undefined ? { deadlineMs: p.deadlineMs } : {}),
    },
    sink,
  );
  if (!r.ok) return sendFailure(res, r.failure);
  id = `${chat ? 'chatcmpl' : 'cmpl'}-${r.request}`;
  res.on('close', () => {
    if (!finished) r.cancel();
  });
  if (p.stream) {
    res.writeHead(200, {
      'Content-Type': 'text/event-stream',
      'Cache-Control': 'no-cache',
      Connection: 'keep-alive',
      'X-Request-Id': r.request,
    });
    res.flushHeaders();
  }
}

/** Handles GET /v1/models: every configured model, marked as served by the simulated backend. */
export function handleModels(serving: Serving, res: ServerResponse): void {
  const created = Math.floor(unixTimeMs() / 1000);
  const ready = serving.readiness();
  sendJson(res, 200, {
    object: 'list',
    data: serving.models().map((m) => ({
      id: m.name,
      object: 'model',
      created,
      owned_by: 'switchyard',
      backend: 'simulated',
      switchyard: {
        backend: 'simulated: cost-model executor, deterministic pseudo-text',
        ...m,
        ready: ready[m.name]?.ready ?? false,
      },
    })),
  });
}
