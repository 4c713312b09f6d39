// Parsing OpenAI request bodies: defaults, the prompt-token estimate, and typed refusals.
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_CHAT_TOKENS,
  DEFAULT_COMPLETION_TOKENS,
  parseChat,
  parseCompletion,
} from '../../../api/http/openai.ts';
import { estimateTokens, textRange, textSeed, tokenText } from '../../../api/pseudo-text.ts';
import { clientRequestSchema } from '../../../transport/client-protocol.ts';
import { validate } from '../../../transport/schema.ts';

describe('openai bodies', () => {
  it('fills the default max_tokens and estimates prompt tokens at four characters each', () => {
    expect(parseCompletion({ model: 'm', prompt: 'abcdefghi' })).toMatchObject({
      model: 'm',
      maxTokens: DEFAULT_COMPLETION_TOKENS,
      promptTokens: 3,
      stream: false,
    });
    const chat = parseChat({
      model: 'm',
      messages: [{ role: 'user', content: 'hello' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(chat).toMatchObject({
      maxTokens: DEFAULT_CHAT_TOKENS,
      stream: true,
      includeUsage: true,
      promptTokens: estimateTokens('user: hello\n') + 3,
    });
  });

  it('accepts content parts, max_completion_tokens and the priority and deadline extensions', () => {
    const p = parseChat({
      model: 'm',
      messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }],
      max_completion_tokens: 7,
      priority: 'batch',
      deadline_ms: 500,
    });
    expect(p).toMatchObject({ maxTokens: 7, priority: 'batch', deadlineMs: 500, prompt: 'user: hi\n' });
  });

  it('yields the one client request type the stream API also hands to serving, sampling included', () => {
    const p = parseChat({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      temperature: 0.2,
      top_p: 0.5,
      seed: 9,
      stop: 'END',
      stream: true,
    });
    if ('code' in p) throw new Error(p.message);
    // The chat endpoint adds its messages (for the model's chat template); the rest is the stream API's request.
    const { stream: _s, includeUsage: _u, messages, ...request } = p;
    expect(messages).toEqual([{ role: 'user', content: 'hi' }]);
    const v = validate(clientRequestSchema, request);
    expect(v.ok).toBe(true);
    expect(request).toMatchObject({ temperature: 0.2, topP: 0.5, seed: 9, stop: ['END'] });
  });

  it('refuses bad bodies with invalid_request', () => {
    for (const body of [
      null,
      [],
      { prompt: 'x' },
      { model: 'm', max_tokens: 0 },
      { model: 'm', n: 2 },
      { model: 'm', stream: 'yes' },
      { model: 'm', prompt: ['a', 'b'] },
    ]) {
      expect(parseCompletion(body)).toMatchObject({ code: 'invalid_request', retryable: false });
    }
    expect(parseChat({ model: 'm', messages: [] })).toMatchObject({ code: 'invalid_request' });
    expect(parseChat({ model: 'm', messages: [{ content: 'no role' }] })).toMatchObject({ code: 'invalid_request' });
  });

  it('reads response_format as a JSON schema for the engine: JSON mode any object, json_schema its schema', () => {
    const user = [{ role: 'user', content: 'hi' }];
    const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] };
    expect(parseChat({ model: 'm', messages: user, response_format: { type: 'json_object' } })).toMatchObject({
      jsonSchema: '{"type":"object"}',
    });
    const r = parseChat({
      model: 'm',
      messages: user,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema, strict: true } },
    });
    expect(JSON.parse((r as { jsonSchema: string }).jsonSchema)).toEqual(schema);
    expect(parseChat({ model: 'm', messages: user, response_format: { type: 'text' } })).not.toHaveProperty(
      'jsonSchema',
    );
    const xml = parseChat({ model: 'm', messages: user, response_format: { type: 'xml' } });
    expect(xml).toMatchObject({ code: 'invalid_request', message: expect.stringMatching(/^response_format\.type: /) });
  });

  it('reads log-probabilities: chat logprobs with top_logprobs alternatives, completions logprobs: n', () => {
    const user = [{ role: 'user', content: 'hi' }];
    expect(parseChat({ model: 'm', messages: user, logprobs: true, top_logprobs: 3 })).toMatchObject({ logprobs: 3 });
    expect(parseChat({ model: 'm', messages: user, logprobs: true })).toMatchObject({ logprobs: 0 });
    expect(parseChat({ model: 'm', messages: user, logprobs: false })).not.toHaveProperty('logprobs');
    expect(parseCompletion({ model: 'm', prompt: 'x', logprobs: 2 })).toMatchObject({ logprobs: 2 });
    expect(parseCompletion({ model: 'm', prompt: 'x', logprobs: 0 })).toMatchObject({ logprobs: 0 });
  });

  it('refuses every field it does not implement, naming it, and accepts the values that ask for nothing', () => {
    const user = [{ role: 'user', content: 'hi' }];
    const tool = { type: 'function', function: { name: 'f', parameters: { type: 'object' } } };
    const asks: [string, unknown][] = [
      ['tools', [tool]],
      ['tool_choice', 'auto'],
      ['tool_choice', { type: 'function', function: { name: 'f' } }],
      ['functions', [{ name: 'f' }]],
      ['function_call', 'auto'],
      ['logprobs', 3],
      ['top_logprobs', 2],
      ['logit_bias', { '42': 5 }],
      ['frequency_penalty', 0.5],
      ['presence_penalty', -1],
      ['modalities', ['text', 'audio']],
      ['audio', { voice: 'alloy', format: 'mp3' }],
    ];
    for (const [field, value] of asks) {
      const r = parseChat({ model: 'm', messages: user, [field]: value });
      expect(r, field).toMatchObject({ code: 'invalid_request' });
      expect((r as { message: string }).message.startsWith(`${field}: `), field).toBe(true);
    }
    for (const [field, value] of [
      ['logprobs', true],
      ['logprobs', 6],
      ['top_logprobs', 2],
      ['echo', true],
      ['suffix', 'end'],
      ['best_of', 2],
    ] as const) {
      const r = parseCompletion({ model: 'm', prompt: 'x', [field]: value });
      expect((r as { message?: string }).message?.startsWith(`${field}: `), field).toBe(true);
    }
    const none = {
      tools: [],
      tool_choice: 'none',
      functions: null,
      logprobs: false,
      top_logprobs: null,
      response_format: { type: 'text' },
      logit_bias: {},
      frequency_penalty: 0,
      presence_penalty: 0,
      modalities: ['text'],
    };
    expect(parseChat({ model: 'm', messages: user, ...none })).toMatchObject({ model: 'm' });
    expect(parseCompletion({ model: 'm', prompt: 'x', logprobs: null, echo: false, best_of: 1 })).toMatchObject({
      model: 'm',
    });
  });

  it('refuses tool messages and non-text content parts, and takes developer messages as the system’s', () => {
    const tool = parseChat({ model: 'm', messages: [{ role: 'tool', content: '42', tool_call_id: 'c' }] });
    expect(tool).toMatchObject({ code: 'invalid_request' });
    expect((tool as { message: string }).message).toMatch(/^messages\[0\]\.role: /);
    const image = parseChat({
      model: 'm',
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }],
    });
    expect(image).toMatchObject({
      code: 'invalid_request',
      message: 'messages[0].content: only text parts are supported',
    });
    const dev = parseChat({ model: 'm', messages: [{ role: 'developer', content: 'be brief' }] });
    expect(dev).toMatchObject({ messages: [{ role: 'system', content: 'be brief' }] });
  });
});

describe('pseudo-text', () => {
  it('is deterministic per seed and token index, one word per token', () => {
    const seed = textSeed('m\u0000prompt');
    expect(textRange(seed, 0, 5)).toBe(textRange(seed, 0, 5));
    expect(textRange(seed, 0, 5)).toBe(textRange(seed, 0, 2) + textRange(seed, 2, 3));
    expect(textRange(seed, 0, 5).trim().split(' ')).toHaveLength(5);
    expect(tokenText(seed, 0)).toMatch(/^ [a-z]+$/);
    expect(textRange(textSeed('other'), 0, 20)).not.toBe(textRange(seed, 0, 20));
  });
});
