// A calibrated profile from another machine: `switchyard serve` compares its predicted step times with what the
// engine measures over its first steps and says, when they differ by more than 25 %, that the profile does not fit
// (a log line naming the profile and what to do, the model's /readyz detail, a metric), and serves on.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectClient } from '../../api/client.ts';
import { tinyModelFixture } from '../actors/engine/fixtures.ts';
import { serve, type Served } from './harness.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
let s: Served;
let profile: string;

/** A profile as another, much slower machine would have fitted it: 40 ms a step, whatever the step. */
function slowMachineProfile(dir: string): string {
  const file = join(dir, 'elsewhere.json');
  writeFileSync(
    file,
    JSON.stringify({
      kind: 'switchyard.engine-profile',
      version: 1,
      name: 'elsewhere',
      engine: 'llama.cpp',
      model: 'tiny.gguf',
      threads: 1,
      timing: 'cpu',
      machine: { cpus: 1, platform: 'linux', arch: 'arm64' },
      loadS: 1,
      capacity: { sequences: 4, cellsPerSequence: 511, totalCells: 2048, batchTokens: 64 },
      coefficients: {
        baseS: 0.04,
        perPrefillTokenS: 0,
        perPrefillPairS: 0,
        perDecodeSeqS: 0,
        perContextTokenS: 0,
        perPrefillSeqS: 0,
      },
      fit: { points: 10, meanRelError: 0.01, maxRelError: 0.02 },
      samples: [],
    }),
  );
  return file;
}

beforeAll(async () => {
  fixture = await tinyModelFixture();
  profile = slowMachineProfile(fixture.dir);
  const config = join(fixture.dir, 'fit.yaml');
  writeFileSync(
    config,
    `name: profile-fit
node: { gpus: 1 }
models:
  - name: tiny
    profile: llama-3-8b
    engine: llama.cpp
    file: ${fixture.file}
    calibration: ${profile}
    threads: 1
    sequences: 4
    contextTokens: 512
    classes: { interactive: { ttftMs: 600000, tpotMs: 60000, maxQueueMs: 600000 } }
    batching: { maxRunning: 4, tokenBudget: 64, maxContext: 400 }
`,
  );
  s = await serve(['--config', config]);
  await s.waitReady('tiny', true, 60_000);
}, 120_000);
afterAll(async () => {
  await s?.stop();
  await fixture?.cleanup();
});

interface Fit {
  verdict: string;
  ratio: number | null;
  steps: number;
  profile: string;
}

describe('a profile fitted on another machine', () => {
  it('is found not to fit over the first steps: log line, /readyz detail and metric, and the model serves on', async () => {
    const before = (await s.get('/readyz')).body as { models: Record<string, { profile?: Fit }> };
    expect(before.models['tiny']?.profile).toMatchObject({ verdict: 'measuring', ratio: null, profile });
    const c = await connectClient(s.wsUrl);
    const results = await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        let n = 0;
        const st = c.stream({ model: 'tiny', prompt: `profile fit ${i}`, maxTokens: 60 });
        for await (const ch of st) n += ch.n;
        return { n, r: await st.result };
      }),
    );
    c.close();
    for (const { r } of results) expect(r.ok).toBe(true);
    const line = await s.waitForLine(/does not fit model tiny/, 10_000);
    expect(line).toContain(profile);
    expect(line).toMatch(/predicts steps [\d.]+x slower than the engine ran/);
    expect(line).toContain('switchyard calibrate');
    const ready = (await s.get('/readyz')).body as { models: Record<string, { ready: boolean; profile?: Fit }> };
    const fit = ready.models['tiny']!.profile!;
    expect(ready.models['tiny']!.ready).toBe(true);
    expect(fit.verdict).toBe('off');
    expect(fit.steps).toBeGreaterThanOrEqual(50);
    expect(fit.ratio!).toBeGreaterThan(1.25);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    const m = /switchyard_profile_fit_ratio\{model="tiny"\} ([\d.e+-]+)/.exec(metrics);
    expect(Number(m?.[1])).toBeCloseTo(fit.ratio!, 1);
  }, 120_000);
});
