// Regressions of DST seeds 70 and 124: a fence repeated after its GPU came back, and an assignment of a failed
// replica's epoch reaching a GPU reset by that fence, left the 70B model loading forever.
import { describe, expect, it } from 'vitest';
import { createActor } from 'xstate';
import { runDstSeed, type DstFault } from '../../../actors/sim/dst.ts';
import { gpuMachine } from '../../../machines/gpu.machine.ts';

describe('fences and assignments across a stalled or cut-off node', () => {
  it('serves the 70B model again after a worker crash followed by a slow link (seed 70)', () => {
    const faults: DstFault[] = [
      { kind: 'delay', at: 23.8, until: 29.2, ms: 406 },
      { kind: 'worker-crash', at: 15, restartAt: 23.6 },
    ];
    const r = runDstSeed(70, { simSeconds: 60, faults });
    expect(r.layout).toBe('large-exclusive');
    expect(r.violations).toEqual([]);
  });

  it('serves the 70B model again after a one-way partition on a slow link (seed 124)', () => {
    const faults: DstFault[] = [
      { kind: 'partition', at: 7.3, until: 12.5, direction: 'aToB' },
      { kind: 'delay', at: 6.4, until: 15.5, ms: 364 },
    ];
    const r = runDstSeed(124, { simSeconds: 60, faults });
    expect(r.layout).toBe('large-exclusive');
    expect(r.violations).toEqual([]);
  });

  it('lets a later epoch of the same replica take over a GPU still loading for an earlier one', () => {
    const gpu = createActor(gpuMachine, { input: { index: 0 } });
    gpu.start();
    gpu.send({ type: 'gpu.register' });
    gpu.send({ type: 'gpu.probed' });
    gpu.send({ type: 'gpu.assign', replica: 'r', epoch: 2, loadMs: 0, unloadMs: 0 });
    gpu.send({ type: 'gpu.assign', replica: 'r', epoch: 3, loadMs: 0, unloadMs: 0 });
    expect(gpu.getSnapshot().context.epoch).toBe(3);
    expect(gpu.getSnapshot().hasTag('holdsGpu')).toBe(true);
    // An earlier epoch's assignment arriving late does not take the GPU back.
    gpu.send({ type: 'gpu.assign', replica: 'r', epoch: 2, loadMs: 0, unloadMs: 0 });
    expect(gpu.getSnapshot().context.epoch).toBe(3);
    gpu.stop();
  });
});
