// The SSE a streaming completion writes: every event is `data: <JSON of the chunk>` exactly as JSON.stringify makes
// it, though a token chunk's constant parts are encoded once per request (model names and token texts that need
// escaping included); the role chunk leaves with the first token and the last chunk, usage and [DONE] together.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { handleCompletion } from '../../../api/http/openai.ts';
import type { Serving, StreamSink } from '../../../api/serving.ts';

const TEXTS = ['plain ', 'quote " and \\ ', '\u0000token\u0000', 'line\nbreak \u2028 </script> é'];

/** A serving facade that streams TEXTS as soon as the request is accepted, then ends it. */
function fakeServing(): Serving {
  return {
    submit: (_req: unknown, sink: StreamSink) => {
      queueMicrotask(() => {
        TEXTS.forEach((t, i) => sink.tokens(i, 1, t));
        sink.done({
          finishReason: 'length',
          usage: { promptTokens: 2, completionTokens: TEXTS.length },
          timings: { queueMs: 0, ttftMs: 0, e2eMs: 0 },
        });
      });
      return { ok: true, request: 'r1', model: 'm', version: 'v1', promptTokens: 2, cancel: () => {} };
    },
  } as unknown as Serving;
}

let server: Server | null = null;
afterEach(() => {
  server?.close();
  server = null;
});

async function stream(chat: boolean, model: string): Promise<string[]> {
  const serving = fakeServing();
  server = createServer((req, res) => void handleCompletion(serving, req, res, chat));
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const body = chat
    ? { model, messages: [{ role: 'user', content: 'hi' }], stream: true, stream_options: { include_usage: true } }
    : { model, prompt: 'hi', stream: true };
  const r = await fetch(`http://127.0.0.1:${port}/v1/${chat ? 'chat/' : ''}completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(r.status).toBe(200);
  const text = await r.text();
  expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  return text.split('\n\n').filter((e) => e !== '' && e !== 'data: [DONE]');
}

/** Each event must be exactly JSON.stringify of what it parses to, and say what the chunk says. */
function checkEvents(events: string[]): Record<string, unknown>[] {
  return events.map((e) => {
    expect(e.startsWith('data: ')).toBe(true);
    const v = JSON.parse(e.slice(6)) as Record<string, unknown>;
    expect(e.slice(6)).toBe(JSON.stringify(v));
    return v;
  });
}

describe('OpenAI SSE chunks', () => {
  for (const model of ['m', '\u0000token\u0000', 'a "quoted" model']) {
    it(`streams text completions token by token (model ${JSON.stringify(model)})`, async () => {
      const chunks = checkEvents(await stream(false, model));
      expect(chunks).toHaveLength(TEXTS.length + 1);
      TEXTS.forEach((t, i) =>
        expect(chunks[i]).toEqual({
          id: 'cmpl-r1',
          object: 'text_completion',
          created: chunks[0]!['created'],
          model,
          choices: [{ index: 0, text: t, finish_reason: null, logprobs: null }],
        }),
      );
      expect(chunks[TEXTS.length]!['choices']).toEqual([
        { index: 0, text: '', finish_reason: 'length', logprobs: null },
      ]);
    });

    it(`streams chat deltas after the role chunk, then usage (model ${JSON.stringify(model)})`, async () => {
      const chunks = checkEvents(await stream(true, model));
      expect(chunks).toHaveLength(TEXTS.length + 3);
      expect(chunks[0]!['choices']).toEqual([
        { index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null },
      ]);
      TEXTS.forEach((t, i) =>
        expect(chunks[i + 1]).toEqual({
          id: 'chatcmpl-r1',
          object: 'chat.completion.chunk',
          created: chunks[0]!['created'],
          model,
          choices: [{ index: 0, delta: { content: t }, finish_reason: null, logprobs: null }],
        }),
      );
      expect(chunks[TEXTS.length + 1]!['choices']).toEqual([
        { index: 0, delta: {}, finish_reason: 'length', logprobs: null },
      ]);
      expect(chunks[TEXTS.length + 2]).toMatchObject({ choices: [], usage: { total_tokens: 2 + TEXTS.length } });
    });
  }
});
