// Tests of the GGUF writer and the seeded tiny-model generator, including loading the result in llama.cpp.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getLlama, LlamaLogLevel, type Token } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { f32ToF16Bits, Q8_0_BLOCK, writeGguf } from '../../../actors/engine/gguf-writer.ts';
import { parseMakeTinyModelArgs } from '../../../actors/engine/make-tiny-model.ts';
import {
  buildTinyModel,
  ensureTinyModel,
  specOf,
  specProblem,
  TINY_MODEL_SIZES,
  TINY_VOCAB,
  type TinyModelSpec,
} from '../../../actors/engine/tiny-model.ts';

let dir = '';
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'switchyard-tiny-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('gguf writer', () => {
  it('writes the GGUF v3 magic, version and counts at the start of the file', () => {
    const image = writeGguf(
      [{ key: 'general.architecture', type: 'string', value: 'llama' }],
      [{ name: 't', dims: [2, 3], type: 'f32', data: new Float32Array(6) }],
    );
    const view = new DataView(image.buffer);
    expect(new TextDecoder().decode(image.subarray(0, 4))).toBe('GGUF');
    expect(view.getUint32(4, true)).toBe(3);
    expect(view.getBigUint64(8, true)).toBe(1n);
    expect(view.getBigUint64(16, true)).toBe(1n);
    expect(image.length % 32).toBe(0);
  });

  it('refuses a tensor whose dims do not match its data', () => {
    expect(() => writeGguf([], [{ name: 'bad', dims: [4], type: 'f32', data: new Float32Array(3) }])).toThrow(/bad/);
  });

  it('writes q8_0 blocks whose dequantised values are within half a step of the input', () => {
    const data = new Float32Array(64).map((_, i) => Math.sin(i * 0.7) * (i < 32 ? 0.5 : 3));
    const image = writeGguf([], [{ name: 'q', dims: [32, 2], type: 'q8_0', data }]);
    const view = new DataView(image.buffer);
    // One tensor info: name (8 + 1), n_dims (4), two dims (16), type (4), offset (8), after the 24-byte header.
    expect(view.getUint32(24 + 9 + 4 + 16, true)).toBe(8); // GGML_TYPE_Q8_0
    const dataStart = image.length - 2 * Q8_0_BLOCK.bytes - ((image.length - 2 * Q8_0_BLOCK.bytes) % 32);
    const half = (bits: number): number => {
      const e = (bits >> 10) & 0x1f;
      const m = bits & 0x3ff;
      return (bits & 0x8000 ? -1 : 1) * (e === 0 ? m * 2 ** -24 : (1 + m / 1024) * 2 ** (e - 15));
    };
    for (let b = 0; b < 2; b++) {
      const at = dataStart + b * Q8_0_BLOCK.bytes;
      const d = half(view.getUint16(at, true));
      let amax = 0;
      for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(data[b * 32 + i]!));
      expect(d).toBeCloseTo(amax / 127, 3);
      for (let i = 0; i < 32; i++) expect(Math.abs(view.getInt8(at + 2 + i) * d - data[b * 32 + i]!)).toBeLessThan(d);
    }
  });

  it('refuses a q8_0 tensor whose rows are not whole blocks', () => {
    expect(() => writeGguf([], [{ name: 'odd', dims: [48], type: 'q8_0', data: new Float32Array(48) }])).toThrow(
      /odd.*32-value blocks/,
    );
  });

  it('converts floats to half precision with round to nearest even', () => {
    expect(f32ToF16Bits(1)).toBe(0x3c00);
    expect(f32ToF16Bits(-2)).toBe(0xc000);
    expect(f32ToF16Bits(65504)).toBe(0x7bff);
    expect(f32ToF16Bits(1e6)).toBe(0x7c00);
    expect(f32ToF16Bits(2 ** -24)).toBe(0x0001);
    expect(f32ToF16Bits(1 + 2 ** -11)).toBe(0x3c00); // a tie rounds to the even mantissa
  });
});

describe('generated model shapes', () => {
  it('names sizes up to a ~100M-parameter q8_0 model and checks every field of a shape', () => {
    const m100 = TINY_MODEL_SIZES.get('m100')!;
    const kv = (m100.embedding / m100.heads) * m100.kvHeads;
    const perLayer = 2 * m100.embedding ** 2 + 2 * m100.embedding * kv + 3 * m100.embedding * m100.feedForward;
    const params = m100.layers * perLayer + 2 * m100.embedding * m100.vocab!;
    expect(params).toBeGreaterThan(90e6);
    expect(params).toBeLessThan(110e6);
    expect(specProblem(m100)).toBeNull();
    const bad: [Partial<TinyModelSpec>, RegExp][] = [
      [{ heads: 5 }, /kvHeads/],
      [{ layers: 0 }, /layers/],
      [{ embedding: 100 }, /embedding/],
      [{ vocab: 10 }, /vocab/],
      [{ dtype: 'q8_0', feedForward: 200 }, /q8_0/],
    ];
    for (const [change, why] of bad) expect(specProblem({ ...specOf({}), ...change })).toMatch(why);
    expect(() => buildTinyModel({ spec: { ...specOf({}), layers: 0 } })).toThrow(/layers/);
  });

  it('parses a shape from the CLI flags and refuses bad ones with the usage', () => {
    const { opts } = parseMakeTinyModelArgs(['o.gguf', '--layers', '3', '--dtype', 'q8_0', '--vocab', '1000']);
    expect(opts.spec).toMatchObject({ layers: 3, dtype: 'q8_0', vocab: 1000, embedding: 64 });
    expect(() => parseMakeTinyModelArgs(['o.gguf', '--size', 'constructor'])).toThrow(/--size must be one of/);
    expect(() => parseMakeTinyModelArgs(['o.gguf', '--dtype', 'q4'])).toThrow(/--dtype/);
    expect(() => parseMakeTinyModelArgs(['o.gguf', '--layers', '-1'])).toThrow(/positive integer/);
  });

  it('loads a q8_0 model with filler vocabulary in llama.cpp and samples tokens from all of it', async () => {
    const spec: TinyModelSpec = { ...specOf({}), name: 'q8', dtype: 'q8_0', vocab: 2000, feedForward: 192 };
    const path = join(dir, 'q8.gguf');
    await writeFile(path, buildTinyModel({ seed: 2, spec }));
    const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 1 });
    const model = await llama.loadModel({ modelPath: path });
    try {
      expect(model.fileInfo.metadata.general.file_type).toBe(7); // MOSTLY_Q8_0
      expect(model.tokens.eos).toBe(TINY_VOCAB.eos);
      const filler = model.detokenize([1999 as Token]);
      expect(filler).toMatch(/^[a-z]{2,}$/);
      const context = await model.createContext({ contextSize: 256, threads: 1 });
      const out: number[] = [];
      const prompt = [TINY_VOCAB.bos as Token, ...model.tokenize('hello the world')];
      for await (const token of context.getSequence().evaluate(prompt, { temperature: 0 })) {
        out.push(token);
        if (out.length === 24) break;
      }
      expect(out.every((t) => Number.isInteger(t) && t >= 0 && t < 2000)).toBe(true);
      expect(out.some((t) => t >= 262)).toBe(true);
      await context.dispose();
    } finally {
      await model.dispose();
      await llama.dispose();
    }
  });
});

describe('tiny model', () => {
  it('gives identical bytes for the same seed and different bytes for another seed', () => {
    const a = buildTinyModel({ seed: 7 });
    const b = buildTinyModel({ seed: 7 });
    const c = buildTinyModel({ seed: 8 });
    expect(Buffer.compare(a, b)).toBe(0);
    expect(Buffer.compare(a, c)).not.toBe(0);
    expect(a.length).toBeGreaterThan(300_000);
    expect(a.length).toBeLessThan(1_000_000);
  });

  it('is written only when absent or different', async () => {
    const path = join(dir, 'ensure.gguf');
    const first = await ensureTinyModel(path, { seed: 3 });
    const again = await ensureTinyModel(path, { seed: 3 });
    expect(first.written).toBe(true);
    expect(again.written).toBe(false);
    expect(again.sha256).toBe(first.sha256);
    await writeFile(path, 'not a model');
    const repaired = await ensureTinyModel(path, { seed: 3 });
    expect(repaired.written).toBe(true);
    expect(Buffer.compare(await readFile(path), buildTinyModel({ seed: 3 }))).toBe(0);
  });

  it('loads in llama.cpp and generates tokens greedily from a byte-level vocabulary', async () => {
    const { path } = await ensureTinyModel(join(dir, 'tiny.gguf'), { seed: 1 });
    const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 1 });
    const model = await llama.loadModel({ modelPath: path });
    try {
      expect(model.tokens.bos).toBe(TINY_VOCAB.bos);
      expect(model.tokens.eos).toBe(TINY_VOCAB.eos);
      const text = 'hello the world é✓';
      const tokens = model.tokenize(text);
      expect(tokens).toContain(TINY_VOCAB.firstMerge + 2); // " the" is one merged token
      expect(model.detokenize(tokens)).toBe(text);
      const context = await model.createContext({ contextSize: 256, threads: 1 });
      const out: number[] = [];
      for await (const token of context
        .getSequence()
        .evaluate([TINY_VOCAB.bos as Token, ...tokens], { temperature: 0 })) {
        out.push(token);
        if (out.length === 16) break;
      }
      expect(out).toHaveLength(16);
      expect(out.every((t) => Number.isInteger(t) && t >= 0 && t < 262)).toBe(true);
      await context.dispose();
    } finally {
      await model.dispose();
      await llama.dispose();
    }
  });
});
