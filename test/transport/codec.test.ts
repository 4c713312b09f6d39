import fc from 'fast-check';
import { Packr, pack } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import {
  CODEC_ERROR_CODES,
  DEFAULT_LIMITS,
  decodeMessage,
  decodeUntrusted,
  encode,
  roundTrip,
  type CodecErrorCode,
  type CodecLimits,
  type DecodeResult,
} from '../../transport/codec.ts';
import { arr, bytes, int, num, obj, optional, str, union } from '../../transport/schema.ts';

const CODES = CODEC_ERROR_CODES;

const HUGE: CodecLimits = {
  maxBytes: 2 ** 33,
  maxDepth: 32,
  maxArrayLength: 2 ** 33,
  maxMapSize: 2 ** 33,
  maxStringBytes: 2 ** 33,
};

function hex(h: string): Uint8Array {
  return Uint8Array.from(Buffer.from(h.replace(/\s+/g, ''), 'hex'));
}

function ascii(s: string): string {
  return Buffer.from(s, 'latin1').toString('hex');
}

function codeOf(r: DecodeResult<unknown>): CodecErrorCode | 'ok' {
  return r.ok ? 'ok' : r.error.code;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const Gpu = obj({ id: int({ min: 0, max: 7 }), epoch: int({ min: 0 }), memFree: num({ min: 0 }) });
const Message = union('type', {
  status: obj({ node: str({ max: 64 }), gpus: arr(Gpu, { max: 8 }), note: optional(str({ max: 1000 })) }),
  infer: obj({
    id: str({ max: 64 }),
    prompt: str({ max: 100_000 }),
    maxTokens: int({ min: 1, max: 32_768 }),
    temperature: num({ min: 0, max: 2 }),
  }),
  blob: obj({ id: int(), data: bytes({ max: 1 << 20 }) }),
});

const representative: unknown[] = [
  {
    type: 'status',
    node: 'node-1',
    gpus: [
      { id: 0, epoch: 12, memFree: 79.5 },
      { id: 7, epoch: 2 ** 40, memFree: 0 },
    ],
  },
  { type: 'infer', id: 'req-🚀-1', prompt: 'Résumé: 日本語のテキスト '.repeat(20), maxTokens: 256, temperature: 0.7 },
  { type: 'status', node: 'n', gpus: [], note: 'x'.repeat(300) },
  {
    ints: [
      0,
      1,
      127,
      128,
      255,
      256,
      65535,
      65536,
      2 ** 32 - 1,
      2 ** 32,
      Number.MAX_SAFE_INTEGER,
      -1,
      -32,
      -33,
      -128,
      -129,
      -32768,
      -32769,
      -(2 ** 31),
      -(2 ** 31) - 1,
      Number.MIN_SAFE_INTEGER,
    ],
  },
  { floats: [1.5, -2.25, 1e300, 5e-324, Math.PI] },
  { flags: [true, false, null], empty: { obj: {}, arr: [], str: '' } },
  {
    wide: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`k${i}`, i])),
    long: Array.from({ length: 70_000 }, (_, i) => i % 7),
  },
  { str8: 'a'.repeat(200), str16: 'b'.repeat(70_000), nested: [[[[{ deep: ['x'] }]]]] },
  [1, 'two', { three: 3 }],
  'just a string',
  42,
  null,
];

describe('codec round trip', () => {
  it('round-trips representative messages through encode and decodeUntrusted', () => {
    for (const m of representative) {
      const r = decodeUntrusted(encode(m));
      expect(r).toEqual({ ok: true, value: m });
    }
  });

  it('round-trips through roundTrip and returns a fresh copy', () => {
    for (const m of representative) {
      const copy = roundTrip(m);
      expect(copy).toEqual(m);
      if (typeof m === 'object' && m !== null) expect(copy).not.toBe(m);
    }
  });

  it('decodes and validates a message with decodeMessage', () => {
    const m = representative[0];
    expect(decodeMessage(encode(m), Message)).toEqual({ ok: true, value: m });
  });

  it('round-trips bytes as a copy that does not alias the frame', () => {
    const data = Uint8Array.from({ length: 300 }, (_, i) => i & 0xff);
    const frame = encode({ type: 'blob', id: 1, data });
    const r = decodeMessage(frame, Message);
    if (!r.ok || r.value.type !== 'blob') throw new Error('expected a blob');
    expect(r.value.data).toBeInstanceOf(Uint8Array);
    expect(Uint8Array.from(r.value.data)).toEqual(data);
    frame.fill(0);
    expect(Uint8Array.from(r.value.data)).toEqual(data);
  });

  it('omits undefined properties and encodes undefined array items as nil', () => {
    expect(roundTrip({ a: 1, b: undefined, c: [undefined, 2] })).toEqual({ a: 1, c: [null, 2] });
    expect(Object.keys(roundTrip({ a: 1, b: undefined }))).toEqual(['a']);
  });

  it('decodes a safe bigint as a number, never as a bigint', () => {
    expect(roundTrip({ n: 5n, m: -(2n ** 53n - 1n) })).toEqual({ n: 5, m: -(2 ** 53 - 1) });
  });

  it('refuses at encode time values with no plain msgpack form', () => {
    expect(() => encode(new Date(0))).toThrow(/extension_refused/);
    expect(() => encode({ when: new Date(0) })).toThrow(/extension_refused/);
    expect(() => encode(new Map([[1, 'a']]))).toThrow(/extension_refused/);
    expect(() => encode({ v: new (class Point {})() })).toThrow(/extension_refused: a Point/);
    expect(() => encode(JSON.parse('{"__proto__":1}'))).toThrow(/forbidden_key/);
    expect(() => encode(2n ** 63n)).toThrow(/unsafe_integer/);
  });

  it('refuses in roundTrip what a peer with default limits would refuse', () => {
    expect(() => roundTrip(new Array(DEFAULT_LIMITS.maxArrayLength + 1).fill(0))).toThrow(/too_many_items/);
  });

  it('decodes NaN and infinite floats but num() refuses them', () => {
    for (const v of [NaN, Infinity, -Infinity]) {
      const frame = encode({ t: v });
      expect(decodeUntrusted(frame)).toEqual({ ok: true, value: { t: v } });
      const r = decodeMessage(frame, obj({ t: num() }));
      expect(r.ok ? 'ok' : [r.error.code, r.error.path]).toEqual(['invalid_message', '$.t']);
    }
  });
});

describe('codec refusals', () => {
  it('refuses a frame larger than maxBytes with frame_too_large', () => {
    expect(codeOf(decodeUntrusted(new Uint8Array(DEFAULT_LIMITS.maxBytes + 1)))).toBe('frame_too_large');
    expect(codeOf(decodeUntrusted(encode('x'.repeat(100)), { ...DEFAULT_LIMITS, maxBytes: 50 }))).toBe(
      'frame_too_large',
    );
  });

  it('refuses 1000 levels of nested arrays and maps with too_deep', () => {
    const arrays = concat(new Uint8Array(1000).fill(0x91), hex('c0'));
    expect(codeOf(decodeUntrusted(arrays))).toBe('too_deep');
    const maps = concat(hex(`81a161`.repeat(1000)), hex('c0'));
    expect(codeOf(decodeUntrusted(maps))).toBe('too_deep');
  });

  it('allows exactly maxDepth levels of nesting and refuses one more', () => {
    const nested = (n: number): Uint8Array => concat(new Uint8Array(n).fill(0x91), hex('c0'));
    expect(codeOf(decodeUntrusted(nested(32)))).toBe('ok');
    expect(codeOf(decodeUntrusted(nested(33)))).toBe('too_deep');
    expect(codeOf(decodeUntrusted(concat(new Uint8Array(32).fill(0x91), hex('90'))))).toBe('too_deep');
  });

  it('refuses an array header declaring 2^32-1 items with no body', () => {
    expect(decodeUntrusted(hex('dd ffffffff'))).toEqual({
      ok: false,
      error: { code: 'too_many_items', message: 'array of 4294967295 items at byte 0 exceeds maxArrayLength 100000' },
    });
    expect(codeOf(decodeUntrusted(hex('dd ffffffff'), HUGE))).toBe('malformed');
    expect(codeOf(decodeUntrusted(hex('df ffffffff')))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(hex('df ffffffff'), HUGE))).toBe('malformed');
  });

  it('refuses a str32 declaring 4 GB', () => {
    const frame = hex(`db ffffffff ${ascii('aaaaa')}`);
    expect(frame.length).toBe(10);
    expect(codeOf(decodeUntrusted(frame))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(frame, HUGE))).toBe('malformed');
    expect(codeOf(decodeUntrusted(hex('c6 ffffffff 00')))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(hex('c6 ffffffff 00'), HUGE))).toBe('malformed');
  });

  it('enforces maxArrayLength, maxMapSize and maxStringBytes on complete values', () => {
    const limits: CodecLimits = { ...DEFAULT_LIMITS, maxArrayLength: 3, maxMapSize: 2, maxStringBytes: 4 };
    expect(codeOf(decodeUntrusted(encode([1, 2, 3]), limits))).toBe('ok');
    expect(codeOf(decodeUntrusted(encode([1, 2, 3, 4]), limits))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(encode({ a: 1, b: 2, c: 3 }), limits))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(encode('abcde'), limits))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(encode(new Uint8Array(5)), limits))).toBe('too_many_items');
    expect(codeOf(decodeUntrusted(encode(new Array(DEFAULT_LIMITS.maxArrayLength).fill(0))))).toBe('ok');
  });

  it('refuses every ext type with extension_refused', () => {
    const exts = [
      'd4 01 00',
      'd5 01 0000',
      'd6 01 00000000',
      'd7 01 0000000000000000',
      `d8 01 ${'00'.repeat(16)}`,
      'c7 01 01 00',
      'c8 0001 01 00',
      'c9 00000001 01 00',
    ];
    for (const e of exts) {
      expect(codeOf(decodeUntrusted(hex(e)))).toBe('extension_refused');
      expect(codeOf(decodeUntrusted(hex(`92 01 ${e}`)))).toBe('extension_refused');
      expect(codeOf(decodeUntrusted(hex(`81 a1 61 ${e}`)))).toBe('extension_refused');
    }
    expect(codeOf(decodeUntrusted(hex('d6 ff 00000000')))).toBe('extension_refused');
  });

  it("refuses msgpackr's own extensions: Error, RegExp, records, Date, Set, undefined, bigint, structured clone and bundled strings", () => {
    const cyclic: { self?: unknown } = {};
    cyclic.self = cyclic;
    const frames: Uint8Array[] = [
      pack(new Error('x')),
      new Packr({ moreTypes: true }).pack(new Error('x')),
      new Packr({ moreTypes: true }).pack(/re/),
      new Packr({ structuredClone: true }).pack(/re/),
      new Packr({ structuredClone: true }).pack(cyclic),
      new Packr({ useRecords: true }).pack({ a: 1, b: 2 }),
      new Packr({ useRecords: true }).pack([{ a: 1 }, { a: 2 }]),
      pack(new Date()),
      pack(new Date(0)),
      new Packr({ moreTypes: true }).pack(new Set([1])),
      new Packr({ moreTypes: true }).pack(new Float64Array([1.5])),
      pack(undefined),
      new Packr({ useBigIntExtension: true }).pack(2n ** 70n),
      new Packr({ bundleStrings: true }).pack({ a: 'x'.repeat(40), b: 'y'.repeat(40) }),
    ];
    for (const frame of frames) expect(codeOf(decodeUntrusted(frame))).toBe('extension_refused');
  });

  it('decodes a RegExp packed without extensions as a plain array, never as a RegExp', () => {
    expect(decodeUntrusted(pack(/re/g))).toEqual({ ok: true, value: ['re', 'g'] });
  });

  it('refuses the never-used byte 0xc1 as malformed', () => {
    expect(codeOf(decodeUntrusted(hex('c1')))).toBe('malformed');
    expect(codeOf(decodeUntrusted(hex('92 01 c1')))).toBe('malformed');
  });

  it('refuses 64-bit integers outside the safe range with unsafe_integer', () => {
    expect(codeOf(decodeUntrusted(hex('cf 8000000000000000')))).toBe('unsafe_integer');
    expect(codeOf(decodeUntrusted(hex('cf 0020000000000000')))).toBe('unsafe_integer');
    expect(codeOf(decodeUntrusted(hex('cf ffffffffffffffff')))).toBe('unsafe_integer');
    expect(codeOf(decodeUntrusted(hex('d3 8000000000000000')))).toBe('unsafe_integer');
    expect(codeOf(decodeUntrusted(hex('d3 ffe0000000000000')))).toBe('unsafe_integer');
    expect(codeOf(decodeUntrusted(hex('d3 0020000000000000')))).toBe('unsafe_integer');
    expect(codeOf(decodeUntrusted(hex('81 a1 61 cf 8000000000000000')))).toBe('unsafe_integer');
  });

  it('decodes 64-bit integers inside the safe range as exact numbers', () => {
    expect(decodeUntrusted(hex('cf 001fffffffffffff'))).toEqual({ ok: true, value: Number.MAX_SAFE_INTEGER });
    expect(decodeUntrusted(hex('d3 ffe0000000000001'))).toEqual({ ok: true, value: Number.MIN_SAFE_INTEGER });
    expect(decodeUntrusted(hex('d3 ffffffffffffffff'))).toEqual({ ok: true, value: -1 });
    expect(decodeUntrusted(hex('d3 0000000100000000'))).toEqual({ ok: true, value: 2 ** 32 });
  });

  it('refuses trailing garbage as malformed', () => {
    expect(codeOf(decodeUntrusted(concat(encode({ a: 1 }), hex('00'))))).toBe('malformed');
    expect(codeOf(decodeUntrusted(concat(encode({ a: 1 }), encode({ b: 2 }))))).toBe('malformed');
  });

  it('refuses empty and truncated input as malformed', () => {
    expect(codeOf(decodeUntrusted(new Uint8Array(0)))).toBe('malformed');
    for (const m of representative.slice(0, 6)) {
      const frame = encode(m);
      for (let n = 0; n < frame.length; n++) expect(codeOf(decodeUntrusted(frame.subarray(0, n)))).toBe('malformed');
    }
  });

  it('refuses __proto__, constructor and prototype map keys with forbidden_key', () => {
    for (const key of ['__proto__', 'constructor', 'prototype']) {
      const k = ascii(key);
      const len = key.length.toString(16).padStart(2, '0');
      expect(codeOf(decodeUntrusted(hex(`81 ${(0xa0 + key.length).toString(16)} ${k} 01`)))).toBe('forbidden_key');
      expect(codeOf(decodeUntrusted(hex(`81 d9 ${len} ${k} 01`)))).toBe('forbidden_key');
      expect(codeOf(decodeUntrusted(hex(`81 a1 61 91 81 da 00${len} ${k} 80`)))).toBe('forbidden_key');
    }
    expect(({} as { polluted?: unknown }).polluted).toBeUndefined();
  });

  it('accepts forbidden words as string values and as keys that merely resemble them', () => {
    expect(decodeUntrusted(hex(`81 a1 61 a9 ${ascii('__proto__')}`))).toEqual({ ok: true, value: { a: '__proto__' } });
    expect(decodeUntrusted(hex(`81 a9 ${ascii('__proto_x')} 01`))).toEqual({ ok: true, value: { __proto_x: 1 } });
    expect(decodeUntrusted(hex(`81 ab ${ascii('constructoR')} 01`))).toEqual({ ok: true, value: { constructoR: 1 } });
  });

  it('refuses map keys that are not strings with forbidden_key', () => {
    for (const key of ['01', 'c0', 'c3', '90', '80', 'cb 3ff8000000000000', `c4 01 61`]) {
      expect(codeOf(decodeUntrusted(hex(`81 ${key} 01`)))).toBe('forbidden_key');
    }
    expect(codeOf(decodeUntrusted(hex(`82 a1 61 01 02 02`)))).toBe('forbidden_key');
  });

  it('reports schema failures as invalid_message with the path', () => {
    const frame = encode({
      type: 'status',
      node: 'n',
      gpus: [0, 1, 2, 3].map((id) => ({ id, epoch: 1, memFree: id === 3 ? -1 : 1 })),
    });
    const r = decodeMessage(frame, Message);
    expect(r).toEqual({
      ok: false,
      error: {
        code: 'invalid_message',
        path: '$.gpus[3].memFree',
        message: 'expected finite number >= 0, got integer -1',
      },
    });
  });

  it('refuses input that is not a Uint8Array without throwing', () => {
    for (const bad of ['abc', null, undefined, [1, 2], new ArrayBuffer(2), { length: 1, 0: 1 }]) {
      expect(codeOf(decodeUntrusted(bad as never))).toBe('malformed');
    }
  });
});

describe('codec robustness', () => {
  it('never throws on random byte arrays and always returns ok or a typed error', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (b) => {
        const r = decodeUntrusted(b);
        expect(r.ok || CODES.has(r.error.code)).toBe(true);
      }),
      { numRuns: 20_000 },
    );
  });

  it('never throws on mutated valid encodings: bit flips, truncations and splices', () => {
    const json = fc.jsonValue({ maxDepth: 4 }).filter((v) => {
      try {
        encode(v);
        return true;
      } catch {
        return false;
      }
    });
    const mutation = fc.oneof(
      fc.record({ kind: fc.constant('flip' as const), at: fc.nat(), bit: fc.integer({ min: 0, max: 7 }) }),
      fc.record({ kind: fc.constant('truncate' as const), at: fc.nat() }),
      fc.record({
        kind: fc.constant('splice' as const),
        at: fc.nat(),
        remove: fc.nat({ max: 8 }),
        insert: fc.uint8Array({ maxLength: 8 }),
      }),
    );
    fc.assert(
      fc.property(json, fc.array(mutation, { minLength: 1, maxLength: 4 }), (value, mutations) => {
        let b: Uint8Array = Uint8Array.from(encode(value));
        for (const m of mutations) {
          const at = b.length === 0 ? 0 : m.at % b.length;
          if (m.kind === 'flip' && b.length > 0) b[at] = (b[at] as number) ^ (1 << m.bit);
          else if (m.kind === 'truncate') b = b.slice(0, at);
          else if (m.kind === 'splice') b = concat(b.subarray(0, at), m.insert, b.subarray(at + m.remove));
        }
        const r = decodeUntrusted(b);
        expect(r.ok || CODES.has(r.error.code)).toBe(true);
        const v = decodeMessage(b, Message);
        expect(v.ok || CODES.has(v.error.code)).toBe(true);
      }),
      { numRuns: 20_000 },
    );
  });

  it('round-trips arbitrary JSON values exactly', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), (value) => {
        const plain = JSON.parse(JSON.stringify(value)) as unknown;
        let frame: Uint8Array;
        try {
          frame = encode(plain);
        } catch (e) {
          expect(String(e)).toMatch(/forbidden_key/);
          return;
        }
        expect(decodeUntrusted(frame)).toEqual({ ok: true, value: plain });
      }),
      { numRuns: 2_000 },
    );
  });

  it('does not allocate what a 10-byte frame declares: a 4 GiB string, bin, array or map', () => {
    const frames = [
      hex(`db ffffffff ${ascii('aaaaa')}`),
      hex('c6 ffffffff 0000000000'),
      hex('dd ffffffff 0000000000'),
      hex('df ffffffff 0000000000'),
    ];
    const before = process.memoryUsage();
    for (let i = 0; i < 10_000; i++) {
      for (const f of frames) {
        expect(f.length).toBe(10);
        const r = decodeUntrusted(f, HUGE);
        if (r.ok || r.error.code !== 'malformed') throw new Error('expected malformed');
      }
    }
    const after = process.memoryUsage();
    expect(after.arrayBuffers - before.arrayBuffers).toBeLessThan(64 * 1024 * 1024);
    expect(after.rss - before.rss).toBeLessThan(256 * 1024 * 1024);
  });
});
