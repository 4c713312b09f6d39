// Operator state and rollouts users start: the state file round-trips, is written atomically and is refused with a
// typed error naming it when corrupt or foreign; rollouts are checked before they start; the scenario's `rollout:`
// runs in simulation, and a rollout goes on past a GPU that fails while its new replica loads.
import { mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadState, saveState, StateFileError, type OperatorState } from '../../../actors/placement/state-file.ts';
import { checkRollout } from '../../../actors/placement/rollouts.ts';
import { simulate } from '../../../actors/sim/simulate.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';
import { ConfigError, normalizeScenario } from '../../../actors/config.ts';
import { poisson, smallScenario } from '../router/sim-helpers.ts';

const state: OperatorState = {
  placement: { policy: 'switch' },
  routing: { policy: 'round-robin' },
  failedGpus: [3],
  rollouts: [{ model: 'llama', from: 'v1', to: 'v2', steps: 2, replicas: 3 }],
  counts: { 'llama@v1': 1, 'llama@v2': 2 },
};

const refusal = (f: () => unknown): StateFileError => {
  try {
    f();
  } catch (e) {
    if (e instanceof StateFileError) return e;
    throw e;
  }
  throw new Error('not refused');
};

describe('the operator state file', () => {
  it('round-trips, leaves no temporary file behind, and reads as nothing when absent', () => {
    const dir = mkdtempSync(join(tmpdir(), 'state-'));
    const path = join(dir, 'node.state.json');
    expect(loadState(path, 'node')).toBeNull();
    saveState(path, 'node', state);
    saveState(path, 'node', { ...state, failedGpus: [] });
    expect(loadState(path, 'node')).toEqual({ ...state, failedGpus: [] });
    expect(readdirSync(dir)).toEqual(['node.state.json']);
  });

  it('never writes through a symlink planted where a temporary file could be predicted', () => {
    const dir = mkdtempSync(join(tmpdir(), 'state-'));
    const path = join(dir, 'node.state.json');
    const victim = join(mkdtempSync(join(tmpdir(), 'victim-')), 'precious');
    writeFileSync(victim, 'untouched');
    // The name a pid-based writer would use, planted by someone who may write the directory.
    symlinkSync(victim, join(dir, `.node.state.json.${process.pid}.tmp`));
    saveState(path, 'node', state);
    expect(readFileSync(victim, 'utf8')).toBe('untouched');
    expect(loadState(path, 'node')).toEqual(state);
    expect(readdirSync(dir).sort()).toEqual([`.node.state.json.${process.pid}.tmp`, 'node.state.json']);
  });

  it('refuses a corrupt, a foreign, and another config’s file with a typed error naming it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'state-'));
    const path = join(dir, 's.json');
    writeFileSync(path, '{"format": "switchyard-state", "version": 1, "con');
    let e = refusal(() => loadState(path, 'node'));
    expect(e.code).toBe('state_corrupt');
    expect(e.message).toContain(path);
    writeFileSync(path, JSON.stringify({ hello: 'world' }));
    expect(refusal(() => loadState(path, 'node')).code).toBe('state_foreign');
    saveState(path, 'other', state);
    e = refusal(() => loadState(path, 'node'));
    expect(e.code).toBe('state_foreign');
    expect(e.message).toMatch(/written for config "other"/);
    saveState(path, 'node', state);
    const bad = JSON.parse(JSON.stringify({ format: 'switchyard-state', version: 1, config: 'node', ...state }));
    bad.placement.policy = 'anywhere';
    writeFileSync(path, JSON.stringify(bad));
    e = refusal(() => loadState(path, 'node'));
    expect(e.code).toBe('state_corrupt');
    expect(e.message).toContain('placement.policy');
  });
});

describe('rollouts users start', () => {
  it('are refused with a typed failure for an unknown model or version, the same version, or one already running', () => {
    let cp!: ControlPlane;
    simulate(smallScenario({ gpus: 2, replicas: 1, versions: ['v1', 'v2'], traffic: [poisson(5, 5)] }), {
      onStart: (c) => (cp = c),
    });
    expect(checkRollout(cp, { model: 'nope', from: 'v1', to: 'v2' }, [])?.code).toBe('model_not_found');
    expect(checkRollout(cp, { model: 'llama', from: 'v1', to: 'v9' }, [])?.message).toMatch(/no version v9/);
    expect(checkRollout(cp, { model: 'llama', from: 'v1', to: 'v1' }, [])?.code).toBe('invalid_request');
    expect(checkRollout(cp, { model: 'llama', from: 'v1', to: 'v2', steps: 0 }, [])?.code).toBe('invalid_request');
    const running = { spec: { model: 'llama', from: 'v1', to: 'v2' }, done: false, events: [] };
    expect(checkRollout(cp, { model: 'llama', from: 'v1', to: 'v2' }, [running])?.message).toMatch(/already/);
    expect(checkRollout(cp, { model: 'llama', from: 'v1', to: 'v2' }, [])).toBeNull();
  });

  it('run from the scenario’s rollout: entry, and a bad entry is refused naming its field', () => {
    const sc = (rollout: object[], faults: object[] = []): object => ({
      name: 'rollout-test',
      seed: 3,
      node: { gpu: 'H100-SXM', gpus: 3 },
      models: [{ name: 'llama', profile: 'llama-3-8b', tp: 1, replicas: 3, versions: ['v1', 'v2'] }],
      traffic: [{ ...(poisson(300, 10) as Record<string, unknown>), priority: undefined }],
      faults,
      rollout,
    });
    expect(() => normalizeScenario(sc([{ model: 'llama', from: 'v1', to: 'v3' }]))).toThrow(ConfigError);
    expect(() => normalizeScenario(sc([{ model: 'llama', from: 'v1', to: 'v3' }]))).toThrow(/rollout\[0\]\.to/);
    const report = simulate(normalizeScenario(sc([{ at: 1, model: 'llama', from: 'v1', to: 'v2' }])));
    expect(report.invariants.violations).toEqual([]);
    const ready = report.placement.filter((e) => e.kind === 'replica.ready' && e.replica?.includes('@v2'));
    expect(ready).toHaveLength(3);
    // A GPU fails while a v2 replica loads on it: the rollout carries on over the two GPUs left, not after the repair.
    let cp!: ControlPlane;
    const faulted = simulate(
      normalizeScenario(
        sc([{ at: 1, model: 'llama', from: 'v1', to: 'v2' }], [{ at: 6, gpu: 2, kind: 'fault', repairAt: 200 }]),
      ),
      { onStart: (c) => (cp = c) },
    );
    const origin = faulted.sim.originMs ?? 0;
    const v1Gone = faulted.placement.filter((e) => e.kind === 'replica.stopped' && e.replica?.includes('@v1'));
    expect(v1Gone.length).toBeGreaterThanOrEqual(2);
    expect(Math.max(...v1Gone.map((e) => e.t)) - origin).toBeLessThan(200_000);
    expect(cp.router.registry.get('llama')!.aliases['stable']).toBe('v2');
  });
});
