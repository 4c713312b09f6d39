import { describe, expect, it } from 'vitest';
import {
  createCostModel,
  DEFAULT_COST_PARAMS,
  type CostModel,
  type StepShape,
} from '../../../actors/gpu/cost-model.ts';
import {
  GPU_PROFILES,
  gpuProfile,
  MODEL_PROFILES,
  modelProfile,
  UnknownProfileError,
} from '../../../actors/gpu/profiles.ts';

const KiB = 1024;

const costModel = (model: string, gpu: string, tp: number): CostModel =>
  createCostModel(modelProfile(model), gpuProfile(gpu), tp);

// Published per-iteration times (ms) of the linear layers only, at 1 / 128 / 256 / 512 / 4096 tokens.
const PUBLISHED_LINEAR_MS = {
  'A100-80GB llama-3-8b TP1': { model: 'llama-3-8b', gpu: 'A100-80GB', tp: 1, ms: [9.7, 13.2, 19.5, 34.6, 273] },
  'H100-SXM llama-3-70b TP8': { model: 'llama-3-70b', gpu: 'H100-SXM', tp: 8, ms: [8.4, 10.0, 11.5, 17.7, 122] },
} as const;
const TOKENS = [1, 128, 256, 512, 4096] as const;

const checkCalibration = (key: keyof typeof PUBLISHED_LINEAR_MS): void => {
  const { model, gpu, tp, ms } = PUBLISHED_LINEAR_MS[key];
  const cm = costModel(model, gpu, tp);
  const rows = TOKENS.map((tokens, i) => {
    const published = ms[i]!;
    const predicted = cm.linearS(tokens) * 1e3;
    return {
      tokens,
      publishedMs: published,
      predictedMs: +predicted.toFixed(2),
      ratio: +(predicted / published).toFixed(3),
    };
  });
  console.log(`${key} linear layers, published vs predicted:`);
  console.table(rows);
  for (const row of rows) {
    expect(row.ratio, `${key} at ${row.tokens} tokens`).toBeGreaterThanOrEqual(0.8);
    expect(row.ratio, `${key} at ${row.tokens} tokens`).toBeLessThanOrEqual(1.2);
  }
};

const decodeShape = (batch: number, context: number): StepShape => ({
  prefill: [],
  decodeBatch: batch,
  decodeContext: context,
});

describe('gpu and model profiles', () => {
  it('store the three GPU types with GB = 1e9 bytes', () => {
    expect(Object.keys(GPU_PROFILES).sort()).toEqual(['A100-80GB', 'H100-SXM', 'H200']);
    expect(gpuProfile('H100-SXM')).toMatchObject({ memoryBytes: 80e9, hbmBytesPerS: 3.35e12, peakFlops: 989e12 });
    expect(gpuProfile('H200')).toMatchObject({ memoryBytes: 141e9, hbmBytesPerS: 4.8e12, peakFlops: 989e12 });
    expect(gpuProfile('A100-80GB')).toMatchObject({ memoryBytes: 80e9, hbmBytesPerS: 2.04e12, peakFlops: 312e12 });
  });

  it('store the Llama 3 models including an FP8 70B variant of the same shape', () => {
    expect(Object.keys(MODEL_PROFILES).sort()).toEqual(['llama-3-70b', 'llama-3-70b-fp8', 'llama-3-8b']);
    const { name: _a, weightBytes: _b, dtypeBytes: _c, ...shape70 } = modelProfile('llama-3-70b');
    const { name: _d, weightBytes: _e, dtypeBytes: _f, ...shapeFp8 } = modelProfile('llama-3-70b-fp8');
    expect(shapeFp8).toEqual(shape70);
    expect(modelProfile('llama-3-70b-fp8')).toMatchObject({ dtypeBytes: 1, weightBytes: 70.5e9 });
  });

  it('reject an unknown GPU name with an error listing the known names', () => {
    expect(() => gpuProfile('V100')).toThrow(UnknownProfileError);
    expect(() => gpuProfile('V100')).toThrow(/V100.*H100-SXM.*H200.*A100-80GB/);
  });

  it('reject an unknown model name with an error listing the known names', () => {
    expect(() => modelProfile('mistral-7b')).toThrow(UnknownProfileError);
    expect(() => modelProfile('mistral-7b')).toThrow(/mistral-7b.*llama-3-8b.*llama-3-70b.*llama-3-70b-fp8/);
  });

  it('do not treat inherited object keys as profile names', () => {
    expect(() => gpuProfile('toString')).toThrow(UnknownProfileError);
    expect(() => modelProfile('__proto__')).toThrow(UnknownProfileError);
  });
});

describe('cost model', () => {
  it('matches published A100 Llama-3-8B linear-layer times within 20 %', () => {
    checkCalibration('A100-80GB llama-3-8b TP1');
  });

  it('matches published H100 Llama-3-70B TP8 linear-layer times within 20 %', () => {
    checkCalibration('H100-SXM llama-3-70b TP8');
  });

  it('stores 128 KiB of KV per token for Llama-3-8B and 320 KiB for Llama-3-70B', () => {
    expect(costModel('llama-3-8b', 'H100-SXM', 1).kvBytesPerToken).toBe(128 * KiB);
    expect(costModel('llama-3-70b', 'H100-SXM', 8).kvBytesPerToken).toBe(320 * KiB);
    expect(costModel('llama-3-70b-fp8', 'H100-SXM', 4).kvBytesPerToken).toBe(160 * KiB);
  });

  it('splits weights evenly across tensor-parallel ranks', () => {
    expect(costModel('llama-3-70b', 'H100-SXM', 8).weightsBytesPerGpu).toBe(141e9 / 8);
    expect(costModel('llama-3-8b', 'H100-SXM', 1).weightsBytesPerGpu).toBe(16.1e9);
  });

  it('charges nothing for a step with no tokens', () => {
    const cm = costModel('llama-3-70b', 'H100-SXM', 8);
    const empty: StepShape = { prefill: [{ tokens: 0, cached: 100 }], decodeBatch: 0, decodeContext: 0 };
    expect(cm.stepS(empty)).toBe(0);
    expect(cm.step(empty)).toEqual({
      linearS: 0,
      attentionS: 0,
      allReduceS: 0,
      overheadS: 0,
      totalS: 0,
      flops: 0,
      bytes: 0,
    });
    expect(cm.prefillS(0, 0)).toBe(0);
    expect(cm.decodeS(0, 0)).toBe(0);
    expect(cm.linearS(0)).toBe(0);
  });

  it('reads the weights once per decode step, not once per sequence', () => {
    const cm = costModel('llama-3-8b', 'H100-SXM', 1);
    const one = cm.step(decodeShape(1, 0));
    const many = cm.step(decodeShape(64, 0));
    const kvWritePerToken = cm.kvBytesPerToken;
    expect(many.bytes - one.bytes).toBeCloseTo(63 * kvWritePerToken, 0);
    expect(cm.decodeS(64, 64 * 512)).toBeLessThan(2 * cm.decodeS(1, 512));
  });

  it('never gets cheaper with more prefill tokens', () => {
    for (const model of ['llama-3-8b', 'llama-3-70b'] as const) {
      const cm = costModel(model, 'H100-SXM', model === 'llama-3-8b' ? 1 : 8);
      let previous = 0;
      for (let tokens = 0; tokens <= 8192; tokens += 64) {
        const t = cm.prefillS(tokens, 0);
        expect(t).toBeGreaterThanOrEqual(previous);
        expect(cm.linearS(tokens)).toBeLessThanOrEqual(t);
        previous = t;
      }
    }
  });

  it('never gets cheaper with a larger decode batch', () => {
    const cm = costModel('llama-3-8b', 'A100-80GB', 1);
    let previous = 0;
    for (let batch = 0; batch <= 512; batch += 8) {
      const t = cm.decodeS(batch, batch * 1000);
      expect(t).toBeGreaterThanOrEqual(previous);
      previous = t;
    }
  });

  it('never gets cheaper with more context', () => {
    const cm = costModel('llama-3-70b', 'H100-SXM', 8);
    let previousDecode = 0;
    let previousPrefill = 0;
    for (let context = 0; context <= 256 * 8192; context += 16 * 1024) {
      const decode = cm.decodeS(32, context);
      const prefill = cm.prefillS(512, Math.floor(context / 256));
      expect(decode).toBeGreaterThanOrEqual(previousDecode);
      expect(prefill).toBeGreaterThanOrEqual(previousPrefill);
      previousDecode = decode;
      previousPrefill = prefill;
    }
    expect(cm.decodeS(32, 32 * 8192)).toBeGreaterThan(cm.decodeS(32, 32 * 128));
  });

  it('agrees between step, stepS, prefillS and decodeS for the same shape', () => {
    const cm = costModel('llama-3-70b', 'H100-SXM', 8);
    const prefill: StepShape = { prefill: [{ tokens: 512, cached: 1024 }], decodeBatch: 0, decodeContext: 0 };
    expect(cm.stepS(prefill)).toBe(cm.prefillS(512, 1024));
    expect(cm.step(prefill).totalS).toBe(cm.stepS(prefill));
    expect(cm.stepS(decodeShape(48, 48 * 2000))).toBe(cm.decodeS(48, 48 * 2000));
  });

  it('breaks a mixed step into parts that add up to the total', () => {
    const cm = costModel('llama-3-70b', 'H100-SXM', 8);
    const mixed: StepShape = {
      prefill: [
        { tokens: 256, cached: 0 },
        { tokens: 256, cached: 3000 },
      ],
      decodeBatch: 40,
      decodeContext: 40 * 1500,
    };
    const b = cm.step(mixed);
    expect(b.linearS).toBeCloseTo(cm.linearS(552), 2);
    expect(b.attentionS).toBeGreaterThan(0);
    expect(b.overheadS).toBe(DEFAULT_COST_PARAMS.cpuOverheadS);
    expect(b.linearS + b.attentionS + b.allReduceS + b.overheadS).toBeCloseTo(b.totalS, 12);
    expect(b.flops).toBeGreaterThan(0);
    expect(b.bytes).toBeGreaterThan(cm.weightsBytesPerGpu * 0.9);
    expect(b.totalS).toBeGreaterThan(cm.prefillS(512, 0));
    expect(b.totalS).toBeGreaterThan(cm.decodeS(40, 40 * 1500));
  });

  it('includes all-reduce time for 70B on TP8 and none on TP1', () => {
    const shape: StepShape = { prefill: [{ tokens: 128, cached: 0 }], decodeBatch: 16, decodeContext: 16 * 1000 };
    expect(costModel('llama-3-70b', 'H100-SXM', 8).step(shape).allReduceS).toBeGreaterThan(0);
    expect(costModel('llama-3-8b', 'H100-SXM', 1).step(shape).allReduceS).toBe(0);
  });

  it('fits about 25,000 KV blocks of 16 tokens for 8B on one H100 at 0.9 utilisation', () => {
    const cm = costModel('llama-3-8b', 'H100-SXM', 1);
    const blocks = cm.kvBlocks(16);
    console.log(`llama-3-8b H100 TP1: ${blocks} blocks of 16 tokens (${blocks * 16} tokens)`);
    // (0.9 * 80e9 - 16.1e9 - ~2.1e9 reserve) / (16 * 128 KiB) ~= 25,650.
    expect(blocks).toBeGreaterThan(24_000);
    expect(blocks).toBeLessThan(28_000);
    const budget = 0.9 * 80e9 - 16.1e9 - cm.activationReserveBytesPerGpu;
    expect(blocks).toBe(Math.floor(budget / (16 * 128 * KiB)));
    expect(cm.fits()).toBe(true);
  });

  it('fits KV blocks for 70B on TP8', () => {
    const cm = costModel('llama-3-70b', 'H100-SXM', 8);
    expect(cm.kvBlocks(16)).toBeGreaterThan(10_000);
    expect(cm.fits()).toBe(true);
  });

  it('does not fit 70B on a single GPU', () => {
    for (const gpu of ['H100-SXM', 'H200', 'A100-80GB']) {
      const cm = costModel('llama-3-70b', gpu, 1);
      expect(cm.fits()).toBe(false);
      expect(cm.kvBlocks(16)).toBe(0);
    }
  });

  it('fits the FP8 70B on TP4 H100 but not the bf16 one on TP2', () => {
    expect(costModel('llama-3-70b-fp8', 'H100-SXM', 4).fits()).toBe(true);
    expect(costModel('llama-3-70b', 'H100-SXM', 2).fits()).toBe(false);
  });

  it('loads 70B on TP8 H100 in a plausible tens of seconds', () => {
    const cm = costModel('llama-3-70b', 'H100-SXM', 8);
    const expected =
      141e9 / 8 / DEFAULT_COST_PARAMS.loadBytesPerS + DEFAULT_COST_PARAMS.engineInitS + DEFAULT_COST_PARAMS.warmupS;
    expect(cm.loadS()).toBeCloseTo(expected, 9);
    expect(cm.loadS()).toBeGreaterThan(10);
    expect(cm.loadS()).toBeLessThan(120);
  });

  it('takes overrides for individual parameters and keeps the other defaults', () => {
    const cm = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1, { loadBytesPerS: 1e9 });
    expect(cm.params).toEqual({ ...DEFAULT_COST_PARAMS, loadBytesPerS: 1e9 });
    expect(cm.loadS()).toBeCloseTo(16.1 + 8 + 2, 9);
  });

  it('rejects a tensor-parallel degree that does not divide the heads', () => {
    expect(() => costModel('llama-3-8b', 'H100-SXM', 3)).toThrow(RangeError);
    expect(() => costModel('llama-3-8b', 'H100-SXM', 0)).toThrow(RangeError);
    expect(() => costModel('llama-3-70b', 'H100-SXM', 16)).toThrow(RangeError);
  });

  it('rejects a non-positive KV block size', () => {
    expect(() => costModel('llama-3-8b', 'H100-SXM', 1).kvBlocks(0)).toThrow(RangeError);
  });
});
