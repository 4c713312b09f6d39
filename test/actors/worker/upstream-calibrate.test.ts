// Request-level calibration of an `engine: openai` server: the fit recovers the step costs its samples were made
// with, and a real fixture server (test/fixtures/openai-server.ts) is started, timed over a grid, put to sleep and
// woken, and stopped, giving a profile the cost model reads.
import { describe, expect, it } from 'vitest';
import { join } from 'node:path';
import {
  calibrateUpstream,
  fitRequestLevel,
  samplesOf,
  UPSTREAM_QUICK_GRID,
} from '../../../actors/worker/upstream/calibrate.ts';
import { createProfileCostModel, type EngineProfile } from '../../../actors/gpu/profile-cost-model.ts';
import { modelProfile } from '../../../actors/gpu/profiles.ts';
import { GAUGE_NAMES } from '../../../actors/engine-config.ts';
import { ROOT } from '../../e2e/harness.ts';
import { tinyModel } from '../../e2e/engine-harness.ts';

describe('upstream calibration', () => {
  it('recovers the step costs the request-level samples were made with', () => {
    const c = { base: 0.004, perToken: 5e-5, perSeq: 0.0015, perCtx: 2e-6 };
    const samples = [1, 2, 4, 8].flatMap((b) =>
      [16, 64, 192].flatMap((l) =>
        samplesOf(b, l, 24, [
          {
            ttftMs: (c.base + c.perToken * b * l) * 1000,
            tpotMs: (c.base + c.perSeq * b + c.perCtx * b * (l + 12)) * 1000,
          },
        ]),
      ),
    );
    const { coefficients: k, fit } = fitRequestLevel(samples);
    expect(fit.points).toBe(24);
    expect(fit.maxRelError).toBeLessThan(1e-6);
    expect(k.baseS).toBeCloseTo(c.base, 6);
    expect(k.perPrefillTokenS).toBeCloseTo(c.perToken, 8);
    expect(k.perDecodeSeqS).toBeCloseTo(c.perSeq, 7);
    expect(k.perContextTokenS).toBeCloseTo(c.perCtx, 9);
  });

  it('keeps every fitted term a cost (none negative)', () => {
    // Decode time falling with the batch would fit a negative per-sequence cost: that term is dropped instead.
    const samples = [1, 2, 4].flatMap((b) => samplesOf(b, 16, 8, [{ ttftMs: 10, tpotMs: 8 - b }]));
    const { coefficients } = fitRequestLevel(samples);
    for (const v of Object.values(coefficients)) expect(v).toBeGreaterThanOrEqual(0);
  });

  it('times a real server over the grid, its sleep and its wake, and writes a profile the cost model reads', async () => {
    const file = await tinyModel();
    const profile = await calibrateUpstream({
      name: 'fixture',
      tp: 1,
      tokenBudget: 256,
      grid: UPSTREAM_QUICK_GRID,
      log: () => undefined,
      engine: {
        kind: 'openai',
        file,
        contextTokens: 511,
        sequences: 4,
        threads: 1,
        upstream: {
          model: 'fixture',
          command: [
            process.execPath,
            '--import',
            'tsx',
            join(ROOT, 'test/fixtures/openai-server.ts'),
            '--port',
            '{port}',
          ],
          cwd: ROOT,
          health: '/health',
          metrics: '/metrics',
          gauges: {
            waiting: [...GAUGE_NAMES.vllm.waiting],
            running: [...GAUGE_NAMES.vllm.running],
            kvUsage: [...GAUGE_NAMES.vllm.kvUsage],
          },
          prompt: 'ids',
          tokenIds: true,
          startTimeoutMs: 60_000,
          hangMs: 10_000,
          maxErrors: 3,
          queue: 64,
          sleep: true,
          logLines: 100,
        },
      },
    });
    expect(profile.engine).toBe('openai');
    // Two batches by two lengths, a TTFT and a TPOT sample each.
    expect(profile.fit.points).toBe(8);
    expect(profile.samples.every((s) => s.seconds > 0)).toBe(true);
    expect(profile.loadS).toBeGreaterThan(0);
    expect(profile.sleepS).toBeGreaterThan(0);
    expect(profile.wakeS).toBeGreaterThan(0);
    for (const v of Object.values(profile.coefficients)) expect(v).toBeGreaterThanOrEqual(0);
    const cost = createProfileCostModel(profile as unknown as EngineProfile, modelProfile('llama-3-8b'));
    expect(cost.decodeS(4, 4 * 100)).toBeGreaterThan(0);
    expect(cost.kvBlocks(16)).toBe(Math.floor((4 * 511) / 16));
  }, 120_000);
});
