// A switch prices bringing a model in by its measured wake time when its server sleeps instead of stopping
// (`engine: openai` with `upstream.sleep` and a calibrated profile that timed the wake), else by its load time.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { normalizeScenario, type ModelConfig } from '../../../actors/config.ts';
import { loadMsOf, switchInMsOf } from '../../../actors/placement/layout.ts';
import { sizedEngineProfile } from '../../../actors/gpu/profile-cost-model.ts';

const scenario = () =>
  normalizeScenario({
    placement: { policy: 'switch' },
    models: [
      { name: 'big', profile: 'llama-3-70b', tp: 8, replicas: 1 },
      { name: 'small', profile: 'llama-3-8b', tp: 1, replicas: 8 },
    ],
  });

/** A calibrated openai profile with the given load and wake times, written to a file. */
function profileFile(loadS: number, wakeS?: number): string {
  const p = { ...sizedEngineProfile(1e6, { threads: 1, sequences: 4, contextTokens: 512 }), engine: 'openai', loadS };
  const file = join(mkdtempSync(join(tmpdir(), 'switch-pricing-')), 'small.json');
  writeFileSync(file, JSON.stringify(wakeS === undefined ? p : { ...p, sleepS: 0.2, wakeS }));
  return file;
}

/** The small model as an engine openai model on that profile, sleeping on release or not. */
function openaiSmall(sc: ReturnType<typeof scenario>, file: string, sleep: boolean): ModelConfig {
  const m = sc.models.find((x) => x.name === 'small')!;
  m.calibration = file;
  m.engine = {
    kind: 'openai',
    file: 'vocab.gguf',
    contextTokens: 512,
    sequences: 4,
    threads: 1,
    upstream: {
      model: 'small',
      command: ['vllm', 'serve', '--port', '{port}'],
      health: '/health',
      metrics: '/metrics',
      gauges: { waiting: [], running: [], kvUsage: [] },
      prompt: 'ids',
      tokenIds: false,
      startTimeoutMs: 600_000,
      hangMs: 60_000,
      maxErrors: 3,
      queue: 64,
      sleep,
      logLines: 500,
    },
  };
  return m;
}

describe('switch pricing', () => {
  it('prices a sleeping server’s return by its measured wake time', () => {
    const sc = scenario();
    const m = openaiSmall(sc, profileFile(40, 1.5), true);
    expect(loadMsOf(sc, m)).toBe(40_000);
    expect(switchInMsOf(sc, m)).toBe(1_500);
  });

  it('prices a model by its load time when its server does not sleep, or no wake was measured', () => {
    const sc = scenario();
    const stops = openaiSmall(sc, profileFile(40, 1.5), false);
    expect(switchInMsOf(sc, stops)).toBe(40_000);
    const sc2 = scenario();
    const unmeasured = openaiSmall(sc2, profileFile(30), true);
    expect(switchInMsOf(sc2, unmeasured)).toBe(30_000);
    const sc3 = scenario();
    const roofline = sc3.models.find((x) => x.name === 'big')!;
    expect(switchInMsOf(sc3, roofline)).toBe(loadMsOf(sc3, roofline));
  });
});
