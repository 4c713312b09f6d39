// The replica actor: its GPU commands are repeated until answered, by the machine's `after` transitions.
import { describe, expect, it } from 'vitest';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime, type Msg } from '../../runtime/system.ts';
import { createReplica, GPU_RETRY_MS } from '../../actors/replica.ts';
import { createCostModel } from '../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../actors/gpu/profiles.ts';
import { createSequence } from '../../actors/batcher/sequence.ts';
import type { MessageOf } from '../../machines/messages.ts';
import { BrokenInvariant } from '../../runtime/contain.ts';

const ID = 'replica.big@v1#0';

/** A TP-2 replica whose GPUs live elsewhere: every command it sends is recorded with its virtual time. */
function setup(opts: { stepByStep?: boolean; onStep?: () => void; onInterrupted?: (ids: string[]) => void } = {}) {
  const clock = createVirtualClock();
  const runtime = createRuntime({ name: 't', clock, rng: createRng(1), stepByStep: opts.stepByStep === true });
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
      // Llama-3-70B leaves no room for KV on two GPUs; the steps tests need some.
      blocksTotal: 1024,
    },
    onInterrupted: (seqs) => opts.onInterrupted?.(seqs.map((q) => q.id)),
    ...(opts.onStep ? { onStep: opts.onStep } : {}),
  });
  return { r, sent, runtime, run: (ms: number) => void clock.run(clock.now() + ms) };
}

/** A loaded replica with `n` sequences of 3 output tokens; `report()` answers the step in flight from both ranks. */
function stepping(opts: { stepByStep?: boolean; onStep?: () => void; onInterrupted?: (ids: string[]) => void }) {
  const t = setup(opts);
  t.r.send({ type: 'replica.start' });
  for (const gpu of [0, 1]) t.r.send({ type: 'gpu.loaded', gpu, epoch: 1 });
  const listener = { scheduled: () => {}, preempted: () => {}, tokens: () => {}, finished: () => {} };
  for (const id of ['a', 'b'])
    t.r.enqueue(
      createSequence({
        id,
        priority: 0,
        order: 1,
        promptTokens: 32,
        outputTokens: 3,
        maxTokens: 3,
        receivedAt: 0,
        listener,
      }),
    );
  const report = (): void => {
    const last = t.sent.filter((x) => x.msg.type === 'step.execute').at(-1)!.msg as MessageOf<'step.execute'>;
    for (const gpu of [0, 1])
      t.runtime.send(ID, { type: 'step.completed', gpu, replica: ID, epoch: 1, step: last.step, busyMs: 1 });
  };
  return { ...t, report };
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

  describe('direct steps (outside the machine, unless step by step)', () => {
    for (const stepByStep of [false, true]) {
      it(`numbers, sends and ends steps as the machine does (stepByStep ${stepByStep})`, () => {
        const { r, sent, report } = stepping({ stepByStep });
        // Step 1 prefills `a` alone (dispatched as it arrives); `b` joins in step 2 and finishes in step 4.
        for (let i = 0; i < 4; i++) report();
        const steps = sent.filter((x) => x.msg.type === 'step.execute').map((x) => (x.msg as { step: number }).step);
        expect(steps).toEqual([1, 2, 3, 4]);
        expect(r.steps.count).toBe(4);
        expect(r.batcher.hasWork()).toBe(false);
        expect(r.state()).toBe('ready.idle');
      });

      it(`fails as a unit when its step loop throws, its requests handed back once (stepByStep ${stepByStep})`, () => {
        const thrown = new Error('ledger drift');
        let n = 0;
        const interrupted: string[][] = [];
        const { r, runtime, report, sent } = stepping({
          stepByStep,
          onStep: () => {
            if (++n === 2) throw thrown;
          },
          onInterrupted: (ids) => interrupted.push(ids),
        });
        report();
        report();
        // Reported as a fault (the simulator's checks still see it), contained, naming the requests it held.
        expect(runtime.faults).toEqual([{ actor: ID, error: thrown, requests: ['a', 'b'], contained: true }]);
        expect(interrupted).toEqual([['a', 'b']]);
        expect(r.hasTag('failed')).toBe(true);
        expect(r.epoch).toBe(2);
        expect(r.actor.getSnapshot().status).toBe('active');
        expect(sent.filter((x) => x.msg.type === 'replica.failed').map((x) => x.to)).toEqual(['placement']);
        expect(to(sent, 'gpu.release')).toEqual(['gpu.0', 'gpu.1']);
        // No step after it: a late report of the dead epoch changes nothing.
        const steps = to(sent, 'step.execute').length;
        for (const gpu of [0, 1])
          runtime.send(ID, { type: 'step.completed', gpu, replica: ID, epoch: 1, step: 2, busyMs: 1 });
        expect(to(sent, 'step.execute')).toHaveLength(steps);
        expect(interrupted).toHaveLength(1);
      });

      it(`errors, not contained, on a broken invariant of the step loop (stepByStep ${stepByStep})`, () => {
        const broken = new BrokenInvariant('ledger drift', ['a']);
        let n = 0;
        const { r, runtime, report } = stepping({
          stepByStep,
          onStep: () => {
            if (++n === 2) throw broken;
          },
        });
        report();
        report();
        expect(runtime.faults).toEqual([{ actor: ID, error: broken }]);
        expect(r.actor.getSnapshot().status).toBe('error');
      });
    }
  });
});
