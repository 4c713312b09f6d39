// Tests of the GGUF writer and the seeded tiny-model generator, including loading the result in llama.cpp.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getLlama, LlamaLogLevel, type Token } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { f32ToF16Bits, writeGguf } from '../../../actors/engine/gguf-writer.ts';
import { buildTinyModel, ensureTinyModel, TINY_VOCAB } from '../../../actors/engine/tiny-model.ts';

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

  it('converts floats to half precision with round to nearest even', () => {
    expect(f32ToF16Bits(1)).toBe(0x3c00);
    expect(f32ToF16Bits(-2)).toBe(0xc000);
    expect(f32ToF16Bits(65504)).toBe(0x7bff);
    expect(f32ToF16Bits(1e6)).toBe(0x7c00);
    expect(f32ToF16Bits(2 ** -24)).toBe(0x0001);
    expect(f32ToF16Bits(1 + 2 ** -11)).toBe(0x3c00); // a tie rounds to the even mantissa
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
