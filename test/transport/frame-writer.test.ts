// The server's directly written msgpack frames, and `encode` (which is the same writer), are byte for byte what msgpackr
// writes with the codec's options for the same values: any JSON-like message, and tokens entries as `tokens` messages.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LIMITS, decodeUntrusted, encode, packrEncode } from '../../transport/codec.ts';
import { decodeServerFrame } from '../../transport/client-protocol.ts';
import { tokensMessage, writeFrame, type TokensEntry } from '../../transport/frame-writer.ts';

class Entry implements TokensEntry {
  constructor(
    readonly id: string,
    public seq: number,
    public n: number,
    public text: string | undefined,
  ) {}
}
const isEntry = (x: unknown): boolean => x instanceof Entry;

// Values as messages hold them: strings of any code points and lengths (the header widths), numbers of every
// msgpack width and sign, floats, booleans, null, nested arrays and objects, undefined properties (omitted).
const number = fc.oneof(
  fc.integer({ min: -40, max: 300 }),
  fc.integer(),
  fc.constantFrom(0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000, 2 ** 53 - 1, -(2 ** 53 - 1)),
  fc.constantFrom(-32, -33, -128, -129, -32768, -32769, -(2 ** 31), -(2 ** 31) - 1),
  fc.double(),
  fc.constantFrom(-0, NaN, Infinity, -Infinity, 2 ** 32, -(2 ** 31) - 0.5, 1.5, 2 ** 60),
);
const text = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 300 }),
  // Any UTF-16, lone surrogates included (both write U+FFFD for one), past msgpackr's 64-character switch of path.
  fc.string({ unit: 'binary', maxLength: 100 }),
  fc.constant(''),
);
const key = fc.string({ maxLength: 12 }).filter((k) => !['__proto__', 'constructor', 'prototype'].includes(k));
const { value } = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small' },
    text,
    number,
    fc.boolean(),
    fc.constant(null),
    fc.array(tie('value'), { maxLength: 20 }),
    // Keys as the server's schema has them (the decoder refuses __proto__, constructor and prototype either way).
    fc.dictionary(key, fc.oneof(tie('value'), fc.constant(undefined)), { maxKeys: 20 }),
  ),
}));
const entry = fc
  .record({
    id: fc.string({ minLength: 1, maxLength: 128 }),
    seq: fc.nat(10_000_000),
    n: fc.integer({ min: 1, max: 10_000_000 }),
    text: fc.option(text, { nil: undefined }),
  })
  .map((e) => new Entry(e.id, e.seq, e.n, e.text));

const decoded = (b: Uint8Array): unknown => {
  const d = decodeUntrusted(b, { ...DEFAULT_LIMITS, maxBytes: 16 * 1024 * 1024 });
  if (!d.ok) throw new Error(`${d.error.code}: ${d.error.message}`);
  return d.value;
};

const same = (a: Uint8Array, b: Uint8Array): void => {
  expect(Buffer.from(a).toString('hex')).toBe(Buffer.from(b).toString('hex'));
};

describe('frame writer', () => {
  it('writes the bytes msgpackr writes, for any message and tokens entry', () => {
    fc.assert(
      fc.property(fc.array(fc.oneof(value, entry), { maxLength: 40 }), (items) => {
        const expected = items.map((x) => (x instanceof Entry ? tokensMessage(x) : x));
        same(writeFrame(items, isEntry), packrEncode(expected));
      }),
      { numRuns: 300 },
    );
  });

  it('encode writes the bytes msgpackr writes, for any plain value (bytes included)', () => {
    const safe = fc.bigInt({ min: BigInt(Number.MIN_SAFE_INTEGER), max: BigInt(Number.MAX_SAFE_INTEGER) });
    const anything = fc.oneof(
      value,
      fc.uint8Array({ maxLength: 300 }),
      fc.array(fc.oneof(value, fc.constant(undefined), safe)),
    );
    fc.assert(
      fc.property(anything, (v) => same(encode(v), packrEncode(v))),
      { numRuns: 500 },
    );
    for (const n of [0x100, 0xffff, 0x10000]) same(encode(new Uint8Array(n)), packrEncode(new Uint8Array(n)));
  });

  it('an encode inside an encode (a getter that encodes) leaves both whole', () => {
    let inner: Uint8Array | null = null;
    const v = {
      a: 'x'.repeat(40),
      get b(): number {
        inner = encode({ deep: ['y'.repeat(50), 7] });
        return 2 ** 40;
      },
      c: [1, 2, 3],
    };
    const outer = encode(v);
    expect(inner).not.toBeNull();
    same(inner!, packrEncode({ deep: ['y'.repeat(50), 7] }));
    same(outer, packrEncode({ a: 'x'.repeat(40), b: 2 ** 40, c: [1, 2, 3] }));
    // And inside a frame.
    const frame = writeFrame([v, new Entry('r', 1, 1, 'z')], isEntry);
    same(
      frame,
      packrEncode([{ a: 'x'.repeat(40), b: 2 ** 40, c: [1, 2, 3] }, tokensMessage(new Entry('r', 1, 1, 'z'))]),
    );
  });

  it('encode refuses, at the sender, what no receiver accepts', () => {
    for (const bad of [new Date(0), new Map(), 2n ** 63n, Symbol('s'), () => 1, new (class X {})()])
      expect(() => encode({ v: bad })).toThrow(TypeError);
    expect(() => encode(JSON.parse('{"__proto__": 1}'))).toThrow(TypeError);
    const cyclic: Record<string, unknown> = {};
    cyclic['self'] = cyclic;
    expect(() => encode(cyclic)).toThrow(TypeError);
  });

  it('writes an entry again in a later frame with its new numbers and text (its head is encoded once)', () => {
    fc.assert(
      fc.property(
        fc.array(entry, { minLength: 1, maxLength: 20 }),
        fc.array(fc.tuple(fc.nat(10_000_000), fc.integer({ min: 1, max: 1000 }), fc.option(text, { nil: undefined }))),
        (entries, changes) => {
          same(writeFrame(entries, isEntry), packrEncode(entries.map(tokensMessage)));
          entries.forEach((e, i) => {
            const c = changes[i % Math.max(1, changes.length)];
            if (c) [e.seq, e.n, e.text] = c;
          });
          const again = [...entries].reverse();
          same(writeFrame(again, isEntry), packrEncode(again.map(tokensMessage)));
        },
      ),
      { numRuns: 200 },
    );
  });

  it('writes long frames and long strings (16- and 32-bit headers) and survives buffer growth', () => {
    const many = Array.from({ length: 70_000 }, (_, i) => new Entry(`r${i}`, i, 1, undefined));
    const big = 'é'.repeat(40_000);
    const frame = writeFrame([...many, { type: 'error', code: 'x', message: big, retryable: false }], isEntry);
    const out = decoded(frame) as unknown[];
    expect(out.length).toBe(70_001);
    expect(out[69_999]).toEqual({ type: 'tokens', id: 'r69999', seq: 69_999, n: 1 });
    expect((out[70_000] as { message: string }).message).toBe(big);
  });

  it('a server frame of tokens and ends passes the client schema', () => {
    const f = writeFrame(
      [
        { type: 'accepted', id: 'a', request: 'req.1', model: 'm', version: 'v1' },
        new Entry('a', 0, 3, 'hé llo'),
        {
          type: 'done',
          id: 'a',
          finishReason: 'length',
          usage: { promptTokens: 1, completionTokens: 3 },
          timings: { queueMs: 0.5, ttftMs: 1.25, e2eMs: 3 },
        },
      ],
      isEntry,
    );
    const r = decodeServerFrame(f, 'msgpack');
    expect(r.ok && r.messages.map((m) => m.type)).toEqual(['accepted', 'tokens', 'done']);
  });

  it('writes strings at every header boundary, ASCII and not', () => {
    for (const len of [0, 31, 32, 33, 255, 256, 257, 65_535, 65_536, 65_537]) {
      for (const s of ['a'.repeat(len), 'é'.repeat(Math.floor(len / 2)) + 'a'.repeat(len % 2)]) {
        expect(decoded(writeFrame([{ s }], isEntry))).toEqual([{ s }]);
      }
    }
  });

  it('refuses what a frame cannot carry', () => {
    expect(() => writeFrame([{ f: () => 1 }], isEntry)).toThrow(TypeError);
    expect(() => writeFrame([new Map()], isEntry)).toThrow(TypeError);
  });
});
