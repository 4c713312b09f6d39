// The replica actor: its GPU commands are repeated until answered, by the machine's `after` transitions.
import { describe, expect, it } from 'vitest';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime, type Msg } from '../../runtime/system.ts';
import { createReplica, GPU_RETRY_MS, type ReplicaHandle } from '../../actors/replica.ts';
import { createCostModel } from '../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../actors/gpu/profiles.ts';

const ID = 'replica.big@v1#0';

/** A TP-2 replica whose GPUs live elsewhere: every command it sends is recorded with its virtual time. */
function setup(): { r: ReplicaHandle; sent: { t: number; to: string; msg: Msg }[]; run(ms: number): void } {
  const clock = createVirtualClock();
  const runtime = createRuntime({ name: 't', clock, rng: createRng(1) });
  const sent: { t: number; to: string; msg: Msg }[] = [];
  runtime.setRemote((to, msg) => sent.push({ t: clock.now(), to, msg }));
  const r = createReplica(runtime, {
    id: ID,
    model: 'big',
    version: 'v1',
    gpus: [0, 1],
    epoch: 1,
    gpuType: 'H100-SXM',
    modelProfile: 'llama-3-70b',
    cost: createCostModel(modelProfile('llama-3-70b'), gpuProfile('H100-SXM'), 2),
    limits: {
      policy: 'chunked',
      maxRunning: 8,
      tokenBudget: 2048,
      blockTokens: 16,
      maxContext: 8192,
      watermarkBlocks: 0,
    },
    onInterrupted: () => {},
  });
  return { r, sent, run: (ms) => void clock.run(clock.now() + ms) };
}

const to = (sent: { to: string; msg: Msg }[], type: string): string[] =>
  sent.filter((s) => s.msg.type === type).map((s) => s.to);

describe('replica', () => {
  describe('loading', () => {
    it('repeats the assignment of a GPU that has not reported loaded, and only of that GPU', () => {
      const { r, sent, run } = setup();
      r.actor.send({ type: 'replica.start' });
      expect(to(sent, 'gpu.assign')).toEqual(['gpu.0', 'gpu.1']);
      r.actor.send({ type: 'gpu.loaded', gpu: 0, epoch: 1 });
      const period = Math.max(GPU_RETRY_MS, r.cost.loadS() * 1000);
      run(period - 1);
      expect(to(sent, 'gpu.assign')).toEqual(['gpu.0', 'gpu.1']);
      run(1);
      expect(to(sent, 'gpu.assign')).toEqual(['gpu.0', 'gpu.1', 'gpu.1']);
      r.actor.send({ type: 'gpu.loaded', gpu: 1, epoch: 1 });
      expect(r.ready()).toBe(true);
      run(10 * period);
      expect(to(sent, 'gpu.assign')).toHaveLength(3);
    });
  });

  describe('unloading', () => {
    it('repeats unanswered releases every retry period until every GPU is released', () => {
      const { r, sent, run } = setup();
      r.actor.send({ type: 'replica.start' });
      for (const gpu of [0, 1]) r.actor.send({ type: 'gpu.loaded', gpu, epoch: 1 });
      r.actor.send({ type: 'replica.stop' });
      expect(to(sent, 'gpu.release')).toEqual(['gpu.0', 'gpu.1']);
      r.actor.send({ type: 'gpu.released', gpu: 1, epoch: 1 });
      run(GPU_RETRY_MS);
      run(GPU_RETRY_MS);
      expect(to(sent, 'gpu.release')).toEqual(['gpu.0', 'gpu.1', 'gpu.0', 'gpu.0']);
      r.actor.send({ type: 'gpu.released', gpu: 0, epoch: 1 });
      expect(r.actor.getSnapshot().status).toBe('done');
      run(10 * GPU_RETRY_MS);
      expect(to(sent, 'gpu.release')).toHaveLength(4);
    });
  });
});
