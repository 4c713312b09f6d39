// Tests of calibrated models in a config: profiles found by name next to the config, the engine's limits applied,
// typed refusals naming the field, and simulate running on the profile's step times.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, loadScenario } from '../../actors/config.ts';
import { profilePath } from '../../actors/calibration.ts';
import { simulate } from '../../actors/sim/simulate.ts';

const dir = mkdtempSync(join(tmpdir(), 'switchyard-calibration-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A profile whose steps cost `baseMs` plus 2 ms a decoding sequence and 0.1 ms a prefill token. */
const profileJson = (name: string, baseMs: number): string =>
  JSON.stringify({
    kind: 'switchyard.engine-profile',
    version: 1,
    name,
    engine: 'llama.cpp',
    model: 'm.gguf',
    threads: 1,
    machine: { cpus: 2, platform: 'linux', arch: 'x64' },
    loadS: 2,
    capacity: { sequences: 4, cellsPerSequence: 511, totalCells: 2048, batchTokens: 64 },
    coefficients: {
      baseS: baseMs / 1e3,
      perPrefillTokenS: 1e-4,
      perPrefillPairS: 0,
      perDecodeSeqS: 2e-3,
      perContextTokenS: 0,
    },
    fit: { points: 1, meanRelError: 0, maxRelError: 0 },
    samples: [],
  });

const config = (calibration: string, extra = ''): string => `
name: calibrated
node: { gpus: 1 }
models:
  - name: m
    profile: llama-3-8b
    engine: llama.cpp
    file: m.gguf
    generate: tiny
    calibration: ${calibration}
${extra}
traffic:
  - model: m
    requests: 30
    lengths: { prompt: { mean: 100, cv: 0.5, max: 200 }, output: { mean: 20, cv: 0.5, max: 40 } }
    arrival: { process: poisson, rate: 5 }
`;

const write = (name: string, text: string): string => {
  const file = join(dir, name);
  writeFileSync(file, text);
  return file;
};
mkdirSync(join(dir, 'profiles'), { recursive: true });
write('profiles/fast.json', profileJson('fast', 1));
write('profiles/slow.json', profileJson('slow', 20));

describe('a calibrated model in a config', () => {
  it('finds the profile by name in profiles/ next to the config, or by a path relative to it', () => {
    expect(profilePath('fast', dir)).toBe(join(dir, 'profiles', 'fast.json'));
    expect(profilePath('other/p.json', dir)).toBe(join(dir, 'other', 'p.json'));
    const s = loadScenario(write('by-name.yaml', config('fast')));
    expect(s.models[0]!.calibration).toBe(join(dir, 'profiles', 'fast.json'));
  });

  it("bounds the batching by the engine's slots, a sequence's cells and its batch", () => {
    const m = loadScenario(write('bounds.yaml', config('fast'))).models[0]!;
    expect(m.batching.maxRunning).toBe(4);
    expect(m.batching.maxContext).toBe(511);
    expect(m.batching.tokenBudget).toBe(64);
  });

  it('refuses a missing profile with a ConfigError naming the field and the file', () => {
    const file = write('missing.yaml', config('nowhere'));
    expect(() => loadScenario(file)).toThrow(ConfigError);
    expect(() => loadScenario(file)).toThrow(/models\[0\]\.calibration: .*nowhere\.json/);
  });

  it('reads the config without its profiles when asked (calibrate writes them)', () => {
    const s = loadScenario(write('uncalibrated.yaml', config('nowhere')), { calibrations: false });
    expect(s.models[0]!.engine?.kind).toBe('llama.cpp');
  });

  it('refuses a llama.cpp model without a model file', () => {
    const file = write('nofile.yaml', config('fast').replace('    file: m.gguf\n', ''));
    expect(() => loadScenario(file)).toThrow(/models\[0\]\.file: is required for engine llama\.cpp/);
  });
});

describe('simulating on a calibrated profile', () => {
  it("takes every step's time from the profile: a slower profile gives slower tokens, same requests", () => {
    const fast = simulate(loadScenario(write('fast.yaml', config('fast'))));
    const slow = simulate(loadScenario(write('slow.yaml', config('slow'))));
    expect(fast.requests.done).toBe(30);
    expect(slow.requests.done).toBe(30);
    // A decode step of B sequences costs base + 2 ms x B: at least 20 ms on the slow profile, from 3 ms on the fast.
    expect(slow.tpotMs.p50).toBeGreaterThanOrEqual(20);
    expect(fast.tpotMs.p50).toBeLessThan(20);
    expect(fast.tpotMs.p50).toBeGreaterThanOrEqual(3);
  });

  it('gives a byte-identical report for the same calibrated scenario and seed', () => {
    const file = write('again.yaml', config('fast'));
    expect(JSON.stringify(simulate(loadScenario(file)))).toBe(JSON.stringify(simulate(loadScenario(file))));
  });
});
