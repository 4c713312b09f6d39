// The client protocol's frame decoding: JSON and msgpack, one message or an array, bounded and validated.
import { describe, expect, it } from 'vitest';
import { encode } from '../../transport/codec.ts';
import {
  MAX_MESSAGES_PER_FRAME,
  decodeClientFrame,
  decodeServerFrame,
  encodeFrame,
  formatOf,
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
} from '../../transport/client-protocol.ts';

const submit = { type: 'submit', id: 'a', model: 'm', prompt: 'hi', maxTokens: 4 };

describe('client protocol', () => {
  it('decodes one message or an array of them, in either format', () => {
    expect(decodeClientFrame(JSON.stringify(submit), 'json')).toEqual({ ok: true, messages: [submit] });
    expect(decodeClientFrame(encode([submit, { type: 'cancel', id: 'a' }]), 'msgpack')).toEqual({
      ok: true,
      messages: [submit, { type: 'cancel', id: 'a' }],
    });
  });

  it('refuses frames of the wrong kind for the connection’s format', () => {
    expect(decodeClientFrame(encode(submit), 'json').ok).toBe(false);
    expect(decodeClientFrame(JSON.stringify(submit), 'msgpack').ok).toBe(false);
  });

  it('refuses unknown types, undeclared fields, bad values and forbidden keys with the path', () => {
    const bad = (m: unknown): string => {
      const r = decodeClientFrame(JSON.stringify(m), 'json');
      if (r.ok) throw new Error('accepted');
      return r.error.message;
    };
    expect(bad({ type: 'launch' })).toMatch(/\$\.type/);
    expect(bad({ ...submit, extra: 1 })).toMatch(/undeclared key/);
    expect(bad({ ...submit, maxTokens: 0 })).toMatch(/\$\.maxTokens/);
    expect(bad({ ...submit, maxTokens: 1.5 })).toMatch(/\$\.maxTokens/);
    expect(decodeClientFrame('{"type":"cancel","id":"a","__proto__":{"x":1}}', 'json').ok).toBe(false);
  });

  it('bounds a frame’s size, nesting and message count before parsing it', () => {
    expect(decodeClientFrame('['.repeat(100) + ']'.repeat(100), 'json')).toMatchObject({
      ok: false,
      error: { message: expect.stringMatching(/deeper/) },
    });
    expect(decodeClientFrame(' '.repeat(2 * 1024 * 1024), 'json')).toMatchObject({
      ok: false,
      error: { message: expect.stringMatching(/exceeds/) },
    });
    const many = Array.from({ length: MAX_MESSAGES_PER_FRAME + 1 }, () => ({ type: 'cancel', id: 'a' }));
    expect(decodeClientFrame(JSON.stringify(many), 'json').ok).toBe(false);
    expect(decodeClientFrame(encode(many), 'msgpack').ok).toBe(false);
    expect(decodeClientFrame('not json', 'json').ok).toBe(false);
  });

  it('round-trips server frames and picks the format from the subprotocol', () => {
    const frame = [
      { type: 'tokens', id: 'a', seq: 0, n: 2, text: ' a b' },
      {
        type: 'done',
        id: 'a',
        finishReason: 'length',
        usage: { promptTokens: 1, completionTokens: 2 },
        timings: { queueMs: 0, ttftMs: 1, e2eMs: 2 },
      },
    ];
    expect(decodeServerFrame(encodeFrame(frame, 'msgpack'), 'msgpack')).toEqual({ ok: true, messages: frame });
    expect(decodeServerFrame(encodeFrame(frame, 'json'), 'json')).toEqual({ ok: true, messages: frame });
    expect(formatOf(SUBPROTOCOL_JSON)).toBe('json');
    expect(formatOf(SUBPROTOCOL_MSGPACK)).toBe('msgpack');
  });
});
