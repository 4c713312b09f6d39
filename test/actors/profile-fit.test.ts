// The comparison of a calibrated profile with the engine's first steps: judged only after enough steps and engine
// time, a verdict change logged once each way, frozen after the first steps, and models without a profile ignored.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  createProfileFits,
  FIT_MAX_STEPS,
  FIT_MIN_BUSY_MS,
  FIT_AGAIN_TOLERANCE,
  FIT_MIN_STEPS,
  FIT_TOLERANCE,
  verdictOf,
} from '../../actors/profile-fit.ts';

function fits() {
  const lines: string[] = [];
  const f = createProfileFits(new Map([['m', 'p.json']]), (l) => lines.push(l));
  const steps = (n: number, predictedMs: number, busyMs: number) => {
    for (let i = 0; i < n; i++) f.observe('m', { steps: 1, predictedMs, busyMs });
  };
  return { f, lines, steps };
}

describe('profile fit', () => {
  it('measures until enough steps and engine time, then judges predicted ÷ measured', () => {
    const { f, lines, steps } = fits();
    steps(FIT_MIN_STEPS - 1, 30, 10);
    expect(f.of('m')).toMatchObject({ verdict: 'measuring', ratio: null, steps: FIT_MIN_STEPS - 1 });
    // Enough steps but too little engine time: still measuring.
    const g = fits();
    g.steps(FIT_MIN_STEPS, 0.3, 0.1);
    expect(FIT_MIN_STEPS * 0.1).toBeLessThan(FIT_MIN_BUSY_MS);
    expect(g.f.of('m')!.verdict).toBe('measuring');
    steps(1, 30, 10);
    expect(f.of('m')).toMatchObject({ verdict: 'off', ratio: 3 });
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/profile p\.json does not fit model m .* predicts steps 3\.00x slower/);
    // A profile file that cannot be read says nothing of where it was fitted.
    expect(lines[0]).toMatch(/fitted on unknown\)/);
  });

  it('judges within the tolerance either side as fitting', () => {
    expect(verdictOf(1 + FIT_TOLERANCE - 0.01)).toBe('fits');
    expect(verdictOf(1 - FIT_TOLERANCE + 0.01)).toBe('fits');
    expect(verdictOf(1 + FIT_TOLERANCE + 0.01)).toBe('off');
    expect(verdictOf(1 - FIT_TOLERANCE - 0.01)).toBe('off');
    // Judged off before, a ratio just inside the tolerance is still off: the verdict does not flip at the edge.
    expect(verdictOf(1 - FIT_TOLERANCE + 0.01, 'off')).toBe('off');
    expect(verdictOf(1 - FIT_AGAIN_TOLERANCE + 0.01, 'off')).toBe('fits');
  });

  it('names the engine build, device and threads the profile was fitted on', () => {
    const dir = mkdtempSync(join(tmpdir(), 'switchyard-fit-'));
    try {
      const file = join(dir, 'p.json');
      const profile = {
        kind: 'switchyard.engine-profile',
        version: 1,
        name: 'p',
        engine: 'llama.cpp',
        model: 'm.gguf',
        threads: 4,
        fittedOn: { nodeLlamaCpp: '3.22.1', build: 'vulkan', devices: ['NVIDIA L4'] },
        machine: { cpus: 8, platform: 'linux', arch: 'x64' },
        loadS: 1,
        capacity: { sequences: 4, cellsPerSequence: 511, totalCells: 2048, batchTokens: 64 },
        coefficients: { baseS: 0, perPrefillTokenS: 0, perPrefillPairS: 0, perDecodeSeqS: 1e-3, perContextTokenS: 0 },
        fit: { points: 1, meanRelError: 0, maxRelError: 0 },
        samples: [],
      };
      writeFileSync(file, JSON.stringify(profile));
      const lines: string[] = [];
      const f = createProfileFits(new Map([['m', file]]), (l) => lines.push(l));
      for (let i = 0; i < FIT_MIN_STEPS; i++) f.observe('m', { steps: 1, predictedMs: 2, busyMs: 4 });
      expect(f.of('m')).toMatchObject({ verdict: 'off', ratio: 0.5 });
      expect(f.of('m')!.fittedOn).toBe('node-llama-cpp 3.22.1 vulkan build on NVIDIA L4, 4 threads');
      expect(lines[0]).toMatch(
        /2\.00x faster .* fitted on node-llama-cpp 3\.22\.1 vulkan build on NVIDIA L4, 4 threads\)/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('says so once each way when the verdict changes, within the tolerance either side', () => {
    const { f, lines, steps } = fits();
    steps(FIT_MIN_STEPS, 10, 10 * (1 + FIT_TOLERANCE * 2));
    expect(f.of('m')!.verdict).toBe('off');
    expect(lines[0]).toMatch(/x faster/);
    steps(FIT_MIN_STEPS * 4, 10, 10);
    expect(f.of('m')!.verdict).toBe('fits');
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatch(/fits model m again/);
  });

  it('freezes after the first steps and ignores models without a profile and empty reports', () => {
    const { f, steps } = fits();
    steps(FIT_MAX_STEPS, 10, 10);
    steps(100, 100, 1);
    expect(f.of('m')).toMatchObject({ verdict: 'fits', ratio: 1, steps: FIT_MAX_STEPS });
    f.observe('other', { steps: 5, predictedMs: 1, busyMs: 1 });
    f.observe('constructor', { steps: 5, predictedMs: 1, busyMs: 1 });
    expect(f.of('other')).toBeUndefined();
    expect(f.of('constructor')).toBeUndefined();
    expect([...f.all().keys()]).toEqual(['m']);
  });
});
