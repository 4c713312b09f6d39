import { describe, expect, it } from 'vitest';
import { spawnSync } from 'node:child_process';
import { normalizeScenario, ConfigError, loadScenario } from '../../../actors/config.ts';
import { simulate } from '../../../actors/sim/simulate.ts';

const small = (over: Record<string, unknown> = {}) =>
  normalizeScenario({
    name: 'small',
    seed: 3,
    models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', replicas: 2 }],
    traffic: [
      {
        model: 'llama-3-8b',
        requests: 300,
        lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
        arrival: { process: 'poisson', rate: 20 },
      },
    ],
    ...over,
  });

describe('simulate', () => {
  it('produces the same report, byte for byte, for the same scenario and seed', () => {
    const a = JSON.stringify(simulate(small()));
    const b = JSON.stringify(simulate(small()));
    expect(a).toBe(b);
  });

  it('produces a different run for a different seed', () => {
    expect(JSON.stringify(simulate(small(), { seed: 4 }))).not.toBe(JSON.stringify(simulate(small(), { seed: 3 })));
  });

  it('reports outcomes, throughput, latency percentiles, batching, GPU use and simulation size', () => {
    const r = simulate(small());
    expect(r.requests.total).toBe(300);
    expect(r.requests['done']).toBe(300);
    expect(r.throughput.requestsPerS).toBeGreaterThan(0);
    expect(r.throughput.outputTokensPerS).toBeGreaterThan(0);
    for (const s of [r.ttftMs, r.tpotMs, r.tbtMs, r.e2eMs, r.queueWaitMs]) {
      expect(s.p50).toBeLessThanOrEqual(s.p90);
      expect(s.p90).toBeLessThanOrEqual(s.p99);
      expect(s.count).toBeGreaterThan(0);
    }
    expect(r.batch.meanSize).toBeGreaterThan(1);
    expect(r.gpus.utilisation).toHaveLength(8);
    expect(r.gpus.utilisation[0]).toBeGreaterThan(0);
    expect(r.gpus.utilisation[7]).toBe(0);
    expect(r.sim.requests).toBe(300);
    expect(r.sim.simulatedSeconds).toBeGreaterThan(0);
    expect(r.invariants).toEqual({ violations: [], overBudget: 0, withoutOneOutcome: 0 });
  });

  it('gives every request exactly one outcome and never exceeds a queue budget under overload', () => {
    const r = simulate(
      small({
        models: [
          { name: 'llama-3-8b', profile: 'llama-3-8b', replicas: 2, classes: { interactive: { maxQueueMs: 1000 } } },
        ],
        traffic: [
          {
            model: 'llama-3-8b',
            requests: 600,
            lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
            arrival: { process: 'poisson', rate: 200 },
          },
        ],
      }),
    );
    expect(r.requests.total).toBe(600);
    expect(r.invariants.withoutOneOutcome).toBe(0);
    expect(r.invariants.overBudget).toBe(0);
    expect(r.requests['overloaded'] ?? 0).toBeGreaterThan(0);
  });
});

describe('scenario validation', () => {
  it('names the bad field', () => {
    expect(() => small({ models: [{ name: 'x', profile: 'llama-9' }] })).toThrow(ConfigError);
    expect(() => small({ models: [{ name: 'x', profile: 'llama-9' }] })).toThrow(/models\[0\]\.profile/);
    expect(() =>
      small({
        traffic: [{ model: 'nope', requests: 1, lengths: { trace: 'splitwise_conv' }, arrival: { process: 'trace' } }],
      }),
    ).toThrow(/traffic\[0\]\.model/);
    expect(() => small({ faults: [{ at: 1, gpu: 9, kind: 'fault' }] })).toThrow(/faults\[0\]\.gpu/);
  });

  it('loads the shipped example scenarios', () => {
    expect(loadScenario('scenarios/chat-8b.yaml').models[0]!.name).toBe('llama-3-8b');
  });
});

describe('switchyard simulate --json', () => {
  const run = () =>
    spawnSync(
      process.execPath,
      ['--import', 'tsx', 'bin/switchyard.ts', 'simulate', 'scenarios/chat-8b.yaml', '--seed', '1', '--json'],
      {
        encoding: 'utf8',
      },
    );

  it('prints one JSON report that is identical across two runs with the same seed', () => {
    const a = run();
    const b = run();
    expect(a.status).toBe(0);
    expect(a.stdout).toBe(b.stdout);
    const report = JSON.parse(a.stdout);
    for (const k of [
      'requests',
      'throughput',
      'ttftMs',
      'tpotMs',
      'tbtMs',
      'e2eMs',
      'queueWaitMs',
      'batch',
      'gpus',
      'sim',
    ])
      expect(report).toHaveProperty(k);
    expect(report.requests.total).toBe(2000);
    expect(a.stderr).toMatch(/wall/);
  });

  it('exits non-zero naming the bad field of an invalid scenario', () => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', 'bin/switchyard.ts', 'simulate', 'package.json'], {
      encoding: 'utf8',
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/invalid scenario/);
  });
});
