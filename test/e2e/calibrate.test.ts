// `switchyard calibrate` end to end on the generated tiny model: it writes a profile by name next to the config,
// and the same config then simulates on it.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadScenario } from '../../actors/config.ts';
import { readEngineProfile } from '../../actors/gpu/profile-cost-model.ts';
import { simulate } from '../../actors/sim/simulate.ts';
import { runCalibrateCommand } from '../../bin/calibrate-command.ts';
import { tinyModelFixture } from '../actors/engine/fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
let config: string;

beforeAll(async () => {
  fixture = await tinyModelFixture();
  config = join(fixture.dir, 'tiny.yaml');
  writeFileSync(
    config,
    `name: tiny-calibrated
node: { gpus: 1 }
models:
  - name: tiny
    profile: llama-3-8b
    engine: llama.cpp
    file: ${fixture.file}
    calibration: tiny-cpu
    batching: { maxRunning: 4, tokenBudget: 64, maxContext: 200 }
traffic:
  - model: tiny
    requests: 20
    lengths: { prompt: { mean: 60, max: 150 }, output: { mean: 10, max: 40 } }
    arrival: { process: poisson, rate: 20 }
`,
  );
}, 60_000);
afterAll(() => fixture?.cleanup());

describe('switchyard calibrate', () => {
  it('writes profiles/<name>.json next to the config with the fit and the serving cache', async () => {
    expect(await runCalibrateCommand(['--config', config, '--quick'])).toBe(0);
    const file = join(fixture.dir, 'profiles', 'tiny-cpu.json');
    expect(existsSync(file)).toBe(true);
    const profile = readEngineProfile(file);
    expect(profile.name).toBe('tiny-cpu');
    expect(profile.timing).toBe('cpu');
    expect(profile.capacity).toEqual({ sequences: 4, cellsPerSequence: 511, totalCells: 2048, batchTokens: 64 });
    expect(profile.fit.points).toBe(profile.samples.length);
    expect(profile.samples.some((s) => s.prefillPairs > (s.prefillTokens * s.prefillTokens) / 2)).toBe(true);
    expect(profile.coefficients.perDecodeSeqS).toBeGreaterThan(0);
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual(profile);
  }, 240_000);

  it('lets simulate use the profile by name: every request is served on it', () => {
    const scenario = loadScenario(config);
    expect(scenario.models[0]!.batching.maxContext).toBe(200);
    const report = simulate(scenario);
    expect(report.requests.done).toBe(20);
    expect(report.invariants.violations).toEqual([]);
  });

  it('refuses a config without a llama.cpp model, exit code 2', async () => {
    const plain = join(fixture.dir, 'plain.yaml');
    writeFileSync(plain, 'models:\n  - name: m\n    profile: llama-3-8b\n');
    expect(await runCalibrateCommand(['--config', plain])).toBe(2);
    expect(await runCalibrateCommand([])).toBe(2);
  });
});
