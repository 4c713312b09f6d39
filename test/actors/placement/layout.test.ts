import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { normalizeScenario } from '../../../actors/config.ts';
import { costOf, layoutFor, shareMemory, type LayoutMode } from '../../../actors/placement/layout.ts';

const scenario = (policy: 'exclusive' | 'switch' | 'share', largeReplicas = 1, smallReplicas = 8) =>
  normalizeScenario({
    placement: { policy },
    models: [
      { name: 'big', profile: 'llama-3-70b', tp: 8, replicas: largeReplicas },
      { name: 'small', profile: 'llama-3-8b', tp: 1, replicas: smallReplicas },
    ],
  });
const MODES: LayoutMode[] = ['large', 'small', 'mixed', 'share'];

describe('layouts', () => {
  it('never split the large model and never give a device to two replicas, for any healthy set and mode', () => {
    fc.assert(
      fc.property(
        fc.subarray([0, 1, 2, 3, 4, 5, 6, 7]),
        fc.constantFrom(...MODES),
        fc.integer({ min: 0, max: 8 }),
        (healthy, mode, small) => {
          const sc = scenario(mode === 'share' ? 'share' : 'switch', 1, small);
          const entries = layoutFor(sc, mode, new Set(healthy));
          const owners = new Map<number, string>();
          for (const e of entries) {
            expect(e.devices.length).toBe(e.model.tp);
            for (const d of e.devices) {
              expect(owners.has(d)).toBe(false);
              owners.set(d, e.id);
              expect(healthy).toContain(d % 8);
            }
          }
          const gangs = entries.filter((e) => e.model.name === 'big');
          if (healthy.length < 8) expect(gangs).toEqual([]);
          else if (mode !== 'small') expect(gangs.map((g) => g.devices)).toEqual([[0, 1, 2, 3, 4, 5, 6, 7]]);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('give the seven healthy GPUs to small replicas when one of eight fails', () => {
    const entries = layoutFor(scenario('switch'), 'large', new Set([0, 1, 2, 4, 5, 6, 7]));
    expect(entries.map((e) => `${e.model.name}:${e.devices.join(',')}`)).toEqual([
      'small:0',
      'small:1',
      'small:2',
      'small:4',
      'small:5',
      'small:6',
      'small:7',
    ]);
  });

  it('keep a replica on its GPU when another GPU fails (no reshuffle)', () => {
    const before = layoutFor(scenario('switch'), 'small', new Set([0, 1, 2, 3, 4, 5, 6, 7])).map((e) => e.id);
    const after = layoutFor(scenario('switch'), 'small', new Set([0, 1, 2, 4, 5, 6, 7])).map((e) => e.id);
    expect(after).toEqual(before.filter((id) => !id.endsWith('#3')));
  });

  it('co-locate a small replica beside each shard only where memory allows, slowing both', () => {
    const sc = scenario('share');
    const mem = shareMemory(sc, sc.models[0]!, sc.models[1]!)!;
    expect(mem.largeBlocks).toBeGreaterThan(0);
    const entries = layoutFor(sc, 'share', new Set([0, 1, 2, 3, 4, 5, 6, 7]));
    const gang = entries.find((e) => e.model.name === 'big')!;
    const guests = entries.filter((e) => e.model.name === 'small');
    expect(guests.map((g) => g.devices[0])).toEqual([8, 9, 10, 11, 12, 13, 14, 15]);
    expect(guests.every((g) => g.lane === 1 && g.slowdown === sc.placement.interference)).toBe(true);
    expect(gang.slowdown).toBe(sc.placement.interference);
    // Per GPU: both models' weights, reserves and KV stay within the memory the engine may use.
    const L = costOf(sc, sc.models[0]!);
    const S = costOf(sc, sc.models[1]!);
    const used =
      L.weightsBytesPerGpu +
      L.activationReserveBytesPerGpu +
      (gang.blocksTotal! * 16 * L.kvBytesPerToken) / 8 +
      S.weightsBytesPerGpu +
      S.activationReserveBytesPerGpu +
      guests[0]!.blocksTotal! * 16 * S.kvBytesPerToken;
    expect(used).toBeLessThanOrEqual(L.params.gpuMemoryUtilization * L.gpu.memoryBytes);
  });

  it('give the exclusive split a fixed place for each replica', () => {
    const sc = normalizeScenario({
      models: [
        { name: 'big', profile: 'llama-3-70b-fp8', tp: 4, replicas: 1 },
        { name: 'small', profile: 'llama-3-8b', tp: 1, replicas: 4 },
      ],
    });
    const entries = layoutFor(sc, 'mixed', new Set([0, 1, 2, 3, 4, 5, 6, 7]));
    expect(entries.map((e) => e.devices)).toEqual([[0, 1, 2, 3], [4], [5], [6], [7]]);
    expect(layoutFor(sc, 'mixed', new Set([0, 1, 2, 4, 5, 6, 7])).map((e) => e.devices)).toEqual([[4], [5], [6], [7]]);
  });
});
