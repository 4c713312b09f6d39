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
  { type: 'node.register', node: 'node', protocol: 2, gpus: [0, 1, 2, 3, 4, 5, 6, 7], epoch: 3 },
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
    type: 'gpu.assign',
    gpu: 0,
    replica: 'replica.llama-3-70b@v1#0',
    epoch: 2,
    model: 'llama-3-70b',
    gpuType: 'H100-SXM',
    tp: 8,
    loadMs: 13500,
    unloadMs: 1000,
    core: {
      gpus: [0, 1, 2, 3, 4, 5, 6, 7],
      owner: 'llama-3-70b@v1',
      limits: {
        policy: 'chunked',
        maxRunning: 256,
        tokenBudget: 2048,
        blockTokens: 16,
        blocksTotal: 40000,
        maxContext: 8192,
        watermarkBlocks: 400,
      },
      check: true,
    },
  },
  {
    type: 'seq.submit',
    replica: 'replica.llama-3-70b@v1#0',
    epoch: 2,
    seqs: [
      {
        id: 'req.17',
        priority: 0,
        order: 17,
        promptTokens: 512,
        outputTokens: 64,
        maxTokens: 128,
        estOutputTokens: 128,
        generated: 0,
        prompt: [1, 2, 3],
        sampling: { temperature: 0.7, stop: ['\n'] },
      },
    ],
    items: [{ id: 'req.18', tokens: 40, dtype: 'bf16', adapter: null, options: { normalize: true } }],
  },
  { type: 'seq.cancel', replica: 'replica.llama-3-70b@v1#0', epoch: 2, ids: ['req.17'] },
  {
    type: 'seq.progress',
    replica: 'replica.llama-3-70b@v1#0',
    epoch: 2,
    at: 1250.5,
    start: 1238,
    events: [
      { k: 's', id: 'req.17' },
      { k: 't', id: 'req.17', n: 1 },
      { k: 'g', ids: ['req.9', 'req.12'] },
      { k: 'f', id: 'req.9', reason: 'done' },
    ],
    load: {
      waiting: 0,
      running: 2,
      blocksUsed: 90,
      blocksTotal: 40000,
      prefillTokensAhead: 0,
      decodeTokensAhead: 100,
      waitingBlocks: 0,
      waitingByClass: [0, 0],
      waitingTokensByClass: [0, 0],
      committedBlocks: 100,
      runningCommittedBlocks: 100,
      runningContext: 1400,
      preemptions: 0,
      steps: 40,
      received: 3,
      queued: 0,
      saturated: false,
      stepCount: 40,
      stepMembers: 80,
      stepTokens: 600,
      stepPredictedMs: 480,
      stepBusyMs: 480,
      inflightPredictedMs: 0,
      inflightMs: 0,
    },
  },
  {
    type: 'seq.progress',
    replica: 'replica.llama-3-70b@v1#0',
    epoch: 2,
    at: 1300,
    start: 1250.5,
    events: [],
    load: {
      waiting: 0,
      running: 2,
      blocksUsed: 90,
      blocksTotal: 40000,
      prefillTokensAhead: 0,
      decodeTokensAhead: 100,
      waitingBlocks: 0,
      waitingByClass: [],
      waitingTokensByClass: [],
      committedBlocks: 100,
      runningCommittedBlocks: 100,
      runningContext: 1400,
      preemptions: 0,
      steps: 40,
      received: 3,
      queued: 0,
      saturated: false,
      stepCount: 40,
      stepMembers: 80,
      stepTokens: 600,
      stepPredictedMs: 480,
      stepBusyMs: 480,
      inflightPredictedMs: 12,
      inflightMs: 49.5,
    },
    ranks: [0, 1, 2, 3, 4, 5, 6],
  },
] as NodeMessage[];

/** A peer's msgpack encoder without the codec's checks. */
const plain = new Packr({ useRecords: false });

const encoded = samples.filter((s) => validate(nodeMessageSchema, s).ok).map((s) => encode(s));

/** Every path to a value nested in `v` (object keys and array indexes), the type tags excepted. */
function nestedPaths(v: unknown, prefix: (string | number)[] = []): (string | number)[][] {
  const out: (string | number)[][] = [];
  if (Array.isArray(v)) {
    v.forEach((x, i) => {
      out.push([...prefix, i]);
      out.push(...nestedPaths(x, [...prefix, i]));
    });
  } else if (typeof v === 'object' && v !== null) {
    for (const [k, x] of Object.entries(v)) {
      if (k === 'type' || k === 'k') continue;
      out.push([...prefix, k]);
      out.push(...nestedPaths(x, [...prefix, k]));
    }
  }
  return prefix.length === 0 ? out.filter((p) => p.length > 1) : out;
}

/** The value at `path` in `v`. */
function getAt(v: unknown, path: readonly (string | number)[]): unknown {
  let at = v;
  for (const p of path) at = (at as Record<string | number, unknown>)[p];
  return at;
}

/** A copy of `v` with `value` at `path` (copied along the path only). */
function withAt(v: unknown, path: readonly (string | number)[], value: unknown): unknown {
  if (path.length === 0) return value;
  const [head, ...rest] = path;
  const copy = (Array.isArray(v) ? [...(v as unknown[])] : { ...(v as object) }) as Record<string | number, unknown>;
  copy[head!] = withAt(copy[head!], rest, value);
  return copy;
}

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

  it('refuses every wrong-typed nested field (core spec, submitted sequences, events, load) with a typed error', () => {
    let tried = 0;
    for (const s of samples) {
      for (const path of nestedPaths(s)) {
        for (const bad of wrongValues) {
          const msg = withAt(s, path, bad);
          if (validate(nodeMessageSchema, msg).ok) continue;
          const r = decodeMessage(encode(msg), nodeMessageSchema);
          tried++;
          expect(r.ok).toBe(false);
          if (!r.ok) expect(CODES.has(r.error.code)).toBe(true);
        }
      }
    }
    console.log(`hostile nested fields: ${tried} wrong-typed messages refused`);
    expect(tried).toBeGreaterThan(1500);
  });

  it('refuses a key named __proto__, constructor or prototype in any object of any message, as a typed error', () => {
    let tried = 0;
    for (const s of samples) {
      for (const path of [[], ...nestedPaths(s)]) {
        const at = getAt(s, path);
        if (typeof at !== 'object' || at === null || Array.isArray(at)) continue;
        for (const key of ['__proto__', 'constructor', 'prototype']) {
          // A computed key defines an own property, as a decoded map key does.
          const msg = withAt(s, path, { ...at, [key]: { polluted: true } });
          // The codec's own encoder refuses such a key: a peer's plain msgpack encoder is what sends one.
          const r = decodeMessage(plain.pack(msg), nodeMessageSchema);
          tried++;
          expect(r.ok).toBe(false);
          if (!r.ok) expect(CODES.has(r.error.code)).toBe(true);
          expect(validate(nodeMessageSchema, msg).ok).toBe(false);
        }
      }
    }
    expect(({} as Record<string, unknown>)['polluted']).toBeUndefined();
    expect(tried).toBeGreaterThan(60);
  });

  it('takes ids, replica names and option values named constructor or __proto__ as plain strings', () => {
    const names = ['constructor', '__proto__', 'prototype', 'toString', 'hasOwnProperty'];
    for (const name of names) {
      const msgs: NodeMessage[] = [
        { type: 'seq.cancel', replica: name, epoch: 1, ids: [name] },
        {
          type: 'seq.submit',
          replica: name,
          epoch: 1,
          items: [{ id: name, tokens: 4, dtype: name, adapter: name, options: { mode: name } }],
        },
      ];
      for (const msg of msgs) {
        const r = decodeMessage(encode(msg), nodeMessageSchema);
        expect(r).toEqual({ ok: true, value: msg });
      }
    }
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
