// Wire fuzzing: a million random and mutated frames into the decoder, and hostile well-formed messages for every
// field of every protocol message. Only typed errors come out; nothing unvalidated gets through.
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { CODEC_ERROR_CODES, decodeMessage, encode } from '../../transport/codec.ts';
import { nodeMessageSchema, type NodeMessage } from '../../transport/protocol.ts';
import { validate } from '../../transport/schema.ts';
import { createRng, type Rng } from '../../runtime/rng.ts';

const FRAMES = Number(process.env['FUZZ_FRAMES'] ?? 1_000_000);

const CODES = CODEC_ERROR_CODES;

/** One valid sample of every protocol message. */
const samples: NodeMessage[] = [
  { type: 'node.register', node: 'node', protocol: 1, gpus: [0, 1, 2, 3, 4, 5, 6, 7], epoch: 3 },
  { type: 'node.registered', node: 'node', epoch: 3 },
  { type: 'node.heartbeat', node: 'node', epoch: 3, t: 1234.5 },
  {
    type: 'gpu.assign',
    gpu: 2,
    replica: 'replica.llama-3-8b@v1#0',
    epoch: 1,
    model: 'llama-3-8b',
    gpuType: 'H100-SXM',
    tp: 1,
    loadMs: 4000,
    unloadMs: 1000,
  },
  { type: 'gpu.release', gpu: 2, replica: 'replica.llama-3-8b@v1#0', epoch: 1 },
  { type: 'gpu.loaded', gpu: 2, replica: 'replica.llama-3-8b@v1#0', epoch: 1 },
  { type: 'gpu.released', gpu: 2, replica: 'replica.llama-3-8b@v1#0', epoch: 1 },
  { type: 'gpu.ready', gpu: 5 },
  { type: 'gpu.failed', gpu: 3, code: 'xid_79', replica: 'replica.llama-3-70b@v1#0', epoch: 2 },
  { type: 'gpu.inject', gpu: 3, fault: 'straggle', factor: 2 },
  {
    type: 'step.execute',
    replica: 'replica.llama-3-70b@v1#0',
    epoch: 2,
    step: 17,
    gpus: [0, 1, 2, 3, 4, 5, 6, 7],
    shape: { prefill: [[512, 0]], decodeBatch: 3, decodeContext: 4000 },
  },
  { type: 'step.completed', gpu: 4, replica: 'replica.llama-3-70b@v1#0', epoch: 2, step: 17, busyMs: 12.5 },
] as NodeMessage[];

const encoded = samples.filter((s) => validate(nodeMessageSchema, s).ok).map((s) => encode(s));

function mutate(rng: Rng, src: Uint8Array): Uint8Array {
  const b = Uint8Array.from(src);
  switch (rng.int(6)) {
    case 0: {
      const n = 1 + rng.int(4);
      for (let i = 0; i < n; i++) b[rng.int(b.length)]! ^= 1 << rng.int(8);
      return b;
    }
    case 1:
      return b.subarray(0, rng.int(b.length));
    case 2: {
      const at = rng.int(b.length);
      const extra = new Uint8Array(1 + rng.int(8)).map(() => rng.int(256));
      const out = new Uint8Array(b.length + extra.length);
      out.set(b.subarray(0, at));
      out.set(extra, at);
      out.set(b.subarray(at), at + extra.length);
      return out;
    }
    case 3: {
      b[rng.int(b.length)] = [0xc1, 0xd4, 0xc7, 0xdc, 0xdd, 0xdf, 0xdb, 0xcf, 0xd3, 0xde][rng.int(10)]!;
      return b;
    }
    case 4: {
      const other = encoded[rng.int(encoded.length)]!;
      const at = rng.int(b.length);
      const out = new Uint8Array(at + other.length - (other.length >> 1));
      out.set(b.subarray(0, at));
      out.set(other.subarray(other.length >> 1), at);
      return out;
    }
    default:
      b[rng.int(b.length)] = rng.int(256);
      return b;
  }
}

describe('wire fuzzing', () => {
  it(`turns ${FRAMES.toLocaleString('en')} random and mutated frames into values that passed the schema or typed errors, in bounded memory`, () => {
    const rng = createRng(20261129);
    const counts = new Map<string, number>();
    let accepted = 0;
    const heapBefore = process.memoryUsage().heapUsed;
    for (let i = 0; i < FRAMES; i++) {
      let frame: Uint8Array;
      if (i % 2 === 0) {
        frame = new Uint8Array(1 + rng.int(48));
        for (let j = 0; j < frame.length; j++) frame[j] = rng.int(256);
      } else {
        frame = mutate(rng, encoded[rng.int(encoded.length)]!);
      }
      const r = decodeMessage(frame, nodeMessageSchema);
      if (r.ok) {
        accepted++;
        // Whatever gets through is a valid protocol message.
        expect(validate(nodeMessageSchema, r.value).ok).toBe(true);
      } else {
        if (!CODES.has(r.error.code)) throw new Error(`untyped error ${r.error.code}`);
        counts.set(r.error.code, (counts.get(r.error.code) ?? 0) + 1);
      }
    }
    const heapGrowthMb = (process.memoryUsage().heapUsed - heapBefore) / 2 ** 20;
    console.log(
      `wire fuzz: ${FRAMES.toLocaleString('en')} frames tried, ${accepted} accepted (valid messages), refused by code: ${JSON.stringify(Object.fromEntries(counts))}, heap growth ${heapGrowthMb.toFixed(1)} MiB`,
    );
    expect([...counts.values()].reduce((a, b) => a + b, 0) + accepted).toBe(FRAMES);
    expect(heapGrowthMb).toBeLessThan(256);
  }, 600_000);
});

describe('hostile well-formed messages', () => {
  const wrongValues: unknown[] = [
    'x',
    '',
    -1,
    1.5,
    NaN,
    Infinity,
    -Infinity,
    2 ** 60,
    null,
    true,
    [],
    [1, 2],
    {},
    { nested: { deeper: 1 } },
    'y'.repeat(300),
  ];

  it('refuses every wrong-typed field of every protocol message with a typed error naming the field', () => {
    let tried = 0;
    for (const s of samples) {
      for (const key of Object.keys(s)) {
        if (key === 'type') continue;
        for (const bad of wrongValues) {
          const original = (s as Record<string, unknown>)[key];
          if (Object.is(original, bad)) continue;
          const msg = { ...s, [key]: bad };
          if (validate(nodeMessageSchema, msg).ok) continue;
          const r = decodeMessage(encode(msg), nodeMessageSchema);
          tried++;
          expect(r.ok).toBe(false);
          if (!r.ok) expect(CODES.has(r.error.code)).toBe(true);
        }
      }
    }
    console.log(`hostile fields: ${tried} wrong-typed messages refused`);
    expect(tried).toBeGreaterThan(400);
  });

  it('refuses unknown message types, unknown fields, __proto__ keys and msgpack extensions', () => {
    const bad: Uint8Array[] = [
      encode({ type: 'gpu.explode', gpu: 1 }),
      encode({ ...samples[7], extra: 1 }),
      new Packr({ useRecords: true }).pack({ type: 'gpu.ready', gpu: 1 }),
      new Packr({ structuredClone: true, moreTypes: true }).pack(new Map([[1, new Set([1])]])),
      new Packr({ moreTypes: true }).pack(new Error('boom')),
      new Packr({ moreTypes: true }).pack(new Date(0)),
      Uint8Array.from([
        0x82,
        0xa4,
        ...Buffer.from('type'),
        0xa9,
        ...Buffer.from('gpu.ready'),
        0xa9,
        ...Buffer.from('__proto__'),
        0x80,
      ]),
      Uint8Array.from([0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
      Uint8Array.from(Array.from({ length: 200 }, () => 0x91)),
      Uint8Array.from([0xdd, 0xff, 0xff, 0xff, 0xff]),
      Uint8Array.from([0xdb, 0xff, 0xff, 0xff, 0xff, 0x61]),
    ];
    for (const b of bad) {
      const r = decodeMessage(b, nodeMessageSchema);
      expect(r.ok).toBe(false);
      if (!r.ok) expect(CODES.has(r.error.code)).toBe(true);
    }
  });
});
