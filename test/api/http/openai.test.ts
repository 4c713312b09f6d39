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
    const { stream: _s, includeUsage: _u, ...request } = p;
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
