import { describe, expect, it } from 'vitest';
import { runDstSeed, shrinkFaults } from '../../../actors/sim/dst.ts';

describe('deterministic simulation testing', () => {
  it('keeps every promise on a handful of seeds with random faults', () => {
    for (let seed = 101; seed <= 106; seed++) {
      const r = runDstSeed(seed, { simSeconds: 60 });
      expect(r.violations, `seed ${seed}: ${r.violations.join('; ')}`).toEqual([]);
      expect(r.requests).toBeGreaterThan(0);
    }
  }, 240_000);

  it('gives the same trace hash for the same seed', () => {
    for (const seed of [7, 8])
      expect(runDstSeed(seed, { simSeconds: 60 }).traceHash).toBe(runDstSeed(seed, { simSeconds: 60 }).traceHash);
  });

  it('catches a build that skips releasing GPUs on failure, within a few seeds, and shrinks its schedule', () => {
    const failing = [1, 2, 3, 4, 5, 6]
      .map((seed) => runDstSeed(seed, { simSeconds: 60, mutation: 'skip-gpu-release' }))
      .filter((r) => r.violations.length > 0);
    expect(failing.length).toBeGreaterThan(0);
    expect(failing[0]!.violations.some((v) => v.startsWith('P9'))).toBe(true);
    const shrunk = shrinkFaults(failing[0]!.seed, { simSeconds: 60, mutation: 'skip-gpu-release' }, failing[0]!.faults);
    expect(shrunk.length).toBeLessThanOrEqual(failing[0]!.faults.length);
    expect(
      runDstSeed(failing[0]!.seed, { simSeconds: 60, mutation: 'skip-gpu-release', faults: shrunk }).violations.length,
    ).toBeGreaterThan(0);
  }, 240_000);

  it('adopts what the worker holds across a control-plane restart, and catches a build that reloads it', () => {
    const restart = [{ kind: 'control-restart' as const, at: 10, downMs: 500 }];
    for (const seed of [0, 1]) {
      const ok = runDstSeed(seed, { simSeconds: 60, faults: restart });
      expect(ok.violations, `seed ${seed}`).toEqual([]);
      expect(ok.outcomes['connection_lost']).toBeGreaterThan(0);
      const mutant = runDstSeed(seed, { simSeconds: 60, faults: restart, mutation: 'adopt-nothing' });
      expect(mutant.violations.some((v) => v.startsWith('P12'))).toBe(true);
    }
  }, 240_000);

  it('catches a control plane that forgets interrupted requests', () => {
    const r = runDstSeed(1, { simSeconds: 60, mutation: 'drop-interrupted' });
    expect(r.violations.some((v) => v.startsWith('P1'))).toBe(true);
  });

  it('catches request actors whose compiled machine ignores the root transitions (interrupted, failed, cancel)', () => {
    const r = runDstSeed(1, { simSeconds: 60, mutation: 'flat-drops-root-transitions' });
    expect(r.violations.some((v) => v.startsWith('P1'))).toBe(true);
  });

  it('catches submits that never reach their core: the view of its work goes stale (P15)', () => {
    const r = runDstSeed(1, { simSeconds: 60, mutation: 'lose-submits', faults: [] });
    expect(r.violations.some((v) => v.startsWith('P15'))).toBe(true);
    expect(runDstSeed(1, { simSeconds: 60, faults: [] }).violations).toEqual([]);
  });

  it('catches a prefix index that keeps what a failed replica cached (P16), on conversation traffic', () => {
    // Seed 3 serves multi-turn conversations to replicas with a prefix cache; GPU 0 fails at 10 s and is repaired.
    const faults = [{ kind: 'gpu-fault' as const, at: 10, gpu: 0, repairAt: 20 }];
    const r = runDstSeed(3, { simSeconds: 60, mutation: 'keep-prefix-on-failure', faults });
    expect(r.violations.some((v) => v.startsWith('P16'))).toBe(true);
    const clean = runDstSeed(3, { simSeconds: 60, faults });
    expect(clean.violations).toEqual([]);
    expect(clean.outcomes['done']).toBeGreaterThan(400);
  });
});
