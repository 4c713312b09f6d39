// A node's engine cores by themselves: when a core starts and stops as its ranks change, how it times steps, and a
// loop that throws failing its replica as a unit.
import { describe, expect, it } from 'vitest';
import { createNodeCores, type CoreDevice, type NodeCoresOptions } from '../../../actors/worker/cores.ts';
import { costModelFor } from '../../../actors/gpu/profile-cost-model.ts';
import type { CostModel } from '../../../actors/gpu/cost-model.ts';
import { createVirtualClock } from '../../../runtime/clock.ts';
import type { MessageOf } from '../../../machines/messages.ts';
import type { CoreReport } from '../../../actors/engine-core/types.ts';

const R = 'replica.m@v#0';

const assignMsg = (gpus: number[], epoch = 1): MessageOf<'gpu.assign'> => ({
  type: 'gpu.assign',
  gpu: gpus[0]!,
  replica: R,
  epoch,
  model: 'llama-3-8b',
  gpuType: 'H100-SXM',
  tp: gpus.length,
  loadMs: 0,
  unloadMs: 0,
  core: {
    gpus,
    owner: 'm@v',
    limits: {
      policy: 'chunked',
      maxRunning: 8,
      tokenBudget: 512,
      blockTokens: 16,
      blocksTotal: 1_000,
      maxContext: 4_096,
      watermarkBlocks: 0,
    },
  },
});

const submitMsg = (id: string, epoch = 1): MessageOf<'seq.submit'> => ({
  type: 'seq.submit',
  replica: R,
  epoch,
  seqs: [
    { id, priority: 0, order: 0, promptTokens: 64, outputTokens: 3, maxTokens: 3, estOutputTokens: 3, generated: 0 },
  ],
});

function harness(o: Partial<NodeCoresOptions> = {}) {
  const clock = createVirtualClock();
  const devices = new Map<number, CoreDevice>();
  const reports: CoreReport[] = [];
  const crashes: { gpus: readonly number[]; error: unknown }[] = [];
  const serve = (g: number, epoch = 1): void =>
    void devices.set(g, { replica: R, epoch, serving: true, hung: false, silent: false, slowdown: 1 });
  const cores = createNodeCores({
    clock,
    device: (g) => devices.get(g),
    credit: () => {},
    report: (_replica, _epoch, r) => reports.push(r),
    crashed: (_replica, _epoch, gpus, error) => crashes.push({ gpus, error }),
    ...o,
  });
  return { clock, devices, reports, crashes, serve, cores };
}

const cost = costModelFor('llama-3-8b', 'H100-SXM', 2);

describe('node cores', () => {
  it('waits for every rank to serve, and forgets a waiting core whose rank stopped holding its epoch', () => {
    const h = harness();
    h.serve(0);
    h.devices.set(1, { replica: R, epoch: 1, serving: false, hung: false, silent: false, slowdown: 1 });
    h.cores.assign(assignMsg([0, 1]), cost);
    expect(h.cores.submit(submitMsg('req.1'))).toBe(false);
    h.devices.delete(1);
    h.cores.deviceChanged(1);
    h.serve(1);
    h.cores.deviceChanged(1);
    expect(h.cores.core(R)).toBeNull();
  });

  it('ignores a repeated or older assignment and replaces the core for a newer epoch', () => {
    const h = harness();
    h.serve(0, 2);
    h.cores.assign(assignMsg([0], 2), cost);
    const first = h.cores.core(R);
    expect(first).not.toBeNull();
    h.cores.assign(assignMsg([0], 2), cost);
    h.cores.assign(assignMsg([0], 1), cost);
    expect(h.cores.core(R)).toBe(first);
    h.serve(0, 3);
    h.cores.assign(assignMsg([0], 3), cost);
    expect(h.cores.core(R)?.epoch).toBe(3);
  });

  it('times a step at the fixed time it is given, whatever the shape', () => {
    const h = harness({ timing: { fixedMs: 7 } });
    h.serve(0);
    h.serve(1);
    h.cores.assign(assignMsg([0, 1]), cost);
    expect(h.cores.submit(submitMsg('req.1'))).toBe(true);
    h.clock.run();
    expect(h.reports.map((r) => r.at - r.start)).toEqual([7, 7, 7]);
  });

  it('scales the roofline time by the timing scale and the replica slowdown', () => {
    const h = harness({ timing: { scale: 0.5 } });
    h.serve(0);
    h.serve(1);
    h.cores.assign({ ...assignMsg([0, 1]), slowdown: 3 }, cost);
    h.cores.submit(submitMsg('req.1'));
    h.clock.run();
    const prefill = cost.stepS({ prefill: [{ tokens: 64, cached: 0 }], decodeBatch: 0, decodeContext: 0 }) * 1000;
    expect(h.reports[0]!.at - h.reports[0]!.start).toBeCloseTo(1.5 * prefill, 9);
  });

  it('fails the replica as a unit when its loop throws, and forgets its core', () => {
    const h = harness();
    h.serve(0);
    h.serve(1);
    const broken: CostModel = {
      ...cost,
      stepS: () => {
        throw new Error('no price for this shape');
      },
    };
    h.cores.assign(assignMsg([0, 1]), broken);
    expect(h.cores.submit(submitMsg('req.1'))).toBe(true);
    expect(h.crashes).toHaveLength(1);
    expect(h.crashes[0]!.gpus).toEqual([0, 1]);
    expect(String(h.crashes[0]!.error)).toMatch(/no price/);
    expect(h.cores.core(R)).toBeNull();
    expect(h.cores.submit(submitMsg('req.2'))).toBe(false);
  });
});
