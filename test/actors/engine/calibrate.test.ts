// Tests of calibration: the least-squares solver, the profile's step time, and a small real calibration run.
import { cpus } from 'node:os';
import { describe, expect, it } from 'vitest';
import {
  decodesPerRound,
  DEFAULT_GRID,
  fitProfile,
  gridFor,
  timingFor,
  leastSquares,
  predictS,
  profileStepS,
  type CalibrationSample,
  type StepCoefficients,
} from '../../../actors/engine/calibrate.ts';
import { calibrateFile, QUICK_GRID } from '../../../actors/engine/calibrate-command.ts';
import type { Engine, EngineOffload } from '../../../actors/engine/engine.ts';
import { tinyModelFixture } from './fixtures.ts';

const TRUE: StepCoefficients = {
  baseS: 1e-3,
  perPrefillTokenS: 5e-5,
  // The fit prices a chunk after a cache by its cached tokens, not by pairs (actors/engine/calibrate.ts).
  perPrefillPairS: 0,
  perDecodeSeqS: 2e-4,
  perContextTokenS: 1e-6,
  perPrefillCachedS: 3e-6,
};

const syntheticSamples = (): CalibrationSample[] => {
  const out: CalibrationSample[] = [];
  for (const p of [0, 16, 64, 256]) {
    for (const k of p > 0 ? [0, 192] : [0]) {
      for (const d of [0, 1, 4, 8]) {
        for (const c of [32, 512]) {
          if (p + d === 0) continue;
          const prefill = { prefillTokens: p, prefillPairs: p * (k + p / 2), prefillCached: k };
          const s = { ...prefill, decodeSeqs: d, contextTokens: d * c };
          out.push({ ...s, seconds: predictS(TRUE, s) });
        }
      }
    }
  }
  return out;
};

describe('calibration', () => {
  describe('fitting', () => {
    it('solves an exactly determined linear system', () => {
      const b = leastSquares(
        [
          [2, 1],
          [1, 3],
        ],
        [5, 10],
      );
      expect(b[0]).toBeCloseTo(1, 10);
      expect(b[1]).toBeCloseTo(3, 10);
    });

    it('recovers the coefficients that generated noiseless step times, with zero fit error', () => {
      const { coefficients, fit } = fitProfile(syntheticSamples());
      for (const key of Object.keys(TRUE) as (keyof StepCoefficients)[]) {
        if (TRUE[key] === 0) expect(coefficients[key]).toBe(0);
        else expect(coefficients[key]! / TRUE[key]!).toBeCloseTo(1, 6);
      }
      expect(fit.maxRelError).toBeLessThan(1e-9);
    });

    it('reports the mean and max relative error when the times do not fit a line', () => {
      const samples = syntheticSamples().map((s, i) => ({ ...s, seconds: s.seconds * (i % 2 ? 1.1 : 0.9) }));
      const { fit } = fitProfile(samples);
      expect(fit.meanRelError).toBeGreaterThan(0.01);
      expect(fit.maxRelError).toBeGreaterThanOrEqual(fit.meanRelError);
      expect(fit.points).toBe(samples.length);
    });

    it('gives a cost model step time from a StepShape, zero for an empty step', () => {
      const profile = { coefficients: TRUE };
      const shape = { prefill: [{ tokens: 64, cached: 32 }], decodeBatch: 4, decodeContext: 400 };
      const expected = predictS(TRUE, {
        prefillTokens: 64,
        prefillPairs: 64 * (32 + 32),
        prefillCached: 32,
        decodeSeqs: 4,
        contextTokens: 400,
      });
      expect(profileStepS(profile, shape)).toBeCloseTo(expected, 12);
      expect(profileStepS(profile, { prefill: [], decodeBatch: 0, decodeContext: 0 })).toBe(0);
    });
  });

  describe('on the real engine', () => {
    it('times a grid of step shapes on the tiny model and returns a JSON profile with its fit error', async () => {
      const fixture = await tinyModelFixture();
      try {
        const grid = {
          ...QUICK_GRID,
          prefillTokens: [0, 32],
          decodeSeqs: [0, 1, 2, 4],
          contextTokens: [32],
          cachedTokens: [0],
          prefillChunks: [1, 2],
          repetitions: 2,
        };
        const profile = await calibrateFile(fixture.file, 1, grid);
        expect(profile.kind).toBe('switchyard.engine-profile');
        // (0,1) (0,2) (0,4), then 32 tokens in one chunk or two beside 0, 1, 2 or 4 decodes; 2 decodes alone and
        // beside one chunk once more with their slots spread.
        expect(profile.samples).toHaveLength(13);
        // Packed (slots 2, 3, chunks above), 2 decodes are one pass, one more for the chunks' tokens past their first;
        // spread (slots 0 and 2, the chunk in the top slot), a pass each.
        const twos = profile.samples.filter((s) => s.decodeSeqs === 2).map((s) => [s.prefillSeqs, s.passes]);
        expect(twos).toEqual([
          [0, 1],
          [0, 2],
          [1, 2],
          [1, 3],
          [2, 2],
        ]);
        const two = profile.samples.filter((s) => s.prefillSeqs === 2);
        expect(two).toHaveLength(4);
        for (const s of two) expect(s.prefillPairs).toBe(2 * 16 * 8);
        for (const s of profile.samples) expect(s.seconds).toBeGreaterThan(0);
        expect(profile.samples.find((s) => s.decodeSeqs === 4)!.contextTokens).toBeGreaterThanOrEqual(4 * 33);
        expect(Number.isFinite(profile.fit.meanRelError)).toBe(true);
        expect(profile.capacity.sequences).toBe(6);
        expect(profile.loadS).toBeGreaterThan(0);
        // Fitted on this machine's CPU by node-llama-cpp's CPU build, with the threads asked for.
        expect(profile.fittedOn).toEqual({
          nodeLlamaCpp: expect.stringMatching(/^\d+\.\d+\.\d+/),
          build: 'cpu',
          devices: [cpus()[0]!.model.trim()],
        });
        expect(profile.threads).toBe(1);
        expect(JSON.parse(JSON.stringify(profile))).toEqual(profile);
      } finally {
        await fixture.cleanup();
      }
    });
  });

  describe('the grid of a served model', () => {
    it('is the default grid for the bench model (8 running, a 64-token budget, 511 cells)', () => {
      const grid = gridFor({ maxRunning: 8, tokenBudget: 64, cellsPerSequence: 511 });
      expect(grid).toEqual({ ...DEFAULT_GRID, decodeOnlySeqs: [8] });
      // Its largest context and a round's decodes fit a sequence's cells.
      expect(Math.max(...grid.contextTokens) + decodesPerRound(grid) + 2).toBeLessThanOrEqual(511);
    });

    it("reaches a larger model's token budget, running sequences and context", () => {
      const cells = 1023;
      const grid = gridFor({ maxRunning: 12, tokenBudget: 256, cellsPerSequence: cells });
      expect(grid.prefillTokens).toEqual([0, 8, 24, 48, 64, 128, 256]);
      expect(grid.decodeOnlySeqs).toEqual([8, 12]);
      const top = Math.max(...grid.contextTokens);
      expect(top).toBe(cells - decodesPerRound(grid) - 2);
      expect(top).toBeGreaterThan(cells * 0.7);
    });

    it("stays within a small model's budget, slots and cells", () => {
      const grid = gridFor({ maxRunning: 4, tokenBudget: 32, cellsPerSequence: 255 });
      expect(grid.prefillTokens).toEqual([0, 8, 24, 32]);
      expect(grid.decodeSeqs).toEqual([0, 1, 2]);
      expect(grid.decodeOnlySeqs).toEqual([4]);
      expect(grid.cachedTokens).toEqual([0, 192]);
      expect(Math.max(...grid.contextTokens) + decodesPerRound(grid) + 2).toBeLessThanOrEqual(255);
    });

    it('counts the warming runs of decode-only steps in the context a round adds', () => {
      const cold = decodesPerRound({ ...DEFAULT_GRID, warmSteps: 0 });
      // Seven decode-only shapes (1, 2, 4, 6 packed; 2, 4 spread; 8 alone), each warmed three times.
      expect(decodesPerRound(DEFAULT_GRID)).toBe(cold + 7 * 3);
    });
  });

  describe('timing', () => {
    const engineOn = (offload: EngineOffload | undefined): Engine =>
      ({ capacity: () => ({ ...(offload ? { offload } : {}) }) }) as unknown as Engine;

    it('times by wall clock whenever an accelerator runs some layers, as asked otherwise', () => {
      const gpu = { backend: 'vulkan', devices: ['llvmpipe'], gpuLayers: 7, totalLayers: 7 };
      expect(timingFor(engineOn(gpu), 'cpu')).toBe('wall');
      expect(timingFor(engineOn({ ...gpu, gpuLayers: 0 }), 'cpu')).toBe('cpu');
      expect(timingFor(engineOn({ backend: 'cpu', devices: [], gpuLayers: 0, totalLayers: 7 }), 'cpu')).toBe('cpu');
      expect(timingFor(engineOn(undefined), 'wall')).toBe('wall');
    });
  });
});
