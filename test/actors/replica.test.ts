// The replica actor: its GPU commands are repeated until answered, by the machine's `after` transitions; it hands
// work to its engine core and applies the core's progress to its sequences.
import { describe, expect, it } from 'vitest';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime, type Msg } from '../../runtime/system.ts';
import { createReplica, GPU_RETRY_MS } from '../../actors/replica.ts';
import { createCostModel } from '../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../actors/gpu/profiles.ts';
import { createSequence, type Sequence } from '../../actors/batcher/sequence.ts';
import { idleLoad, type ReplicaLoad, type SeqEvent } from '../../machines/core-messages.ts';
import type { MessageOf } from '../../machines/messages.ts';
import { BrokenInvariant } from '../../runtime/contain.ts';

const ID = 'replica.big@v1#0';

/** A TP-2 replica whose GPUs live elsewhere: every command it sends is recorded with its virtual time. */
function setup(opts: { onProgress?: () => void; onInterrupted?: (ids: string[]) => void } = {}) {
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
      // Llama-3-70B leaves no room for KV on two GPUs; the steps tests need some.
      blocksTotal: 1024,
    },
    onInterrupted: (seqs) => opts.onInterrupted?.(seqs.map((q) => q.id)),
    ...(opts.onProgress ? { onProgress: opts.onProgress } : {}),
  });
  return { r, sent, runtime, run: (ms: number) => void clock.run(clock.now() + ms) };
}

/** A full load report with the given fields (the rest zero). */
const load = (over: Partial<ReplicaLoad> = {}): ReplicaLoad => idleLoad({ blocksTotal: 1024, ...over });

/** A loaded replica holding sequences `a` and `b` (3 output tokens each); `progress()` delivers a core's report. */
function serving(opts: { onProgress?: () => void; onInterrupted?: (ids: string[]) => void } = {}) {
  const t = setup(opts);
  t.r.send({ type: 'replica.start' });
  for (const gpu of [0, 1]) t.r.send({ type: 'gpu.loaded', gpu, epoch: 1 });
  const calls: string[] = [];
  const listener = {
    scheduled: (s: Sequence, at: number) => calls.push(`scheduled ${s.id} ${at}`),
    preempted: (s: Sequence, at: number) => calls.push(`preempted ${s.id} ${at}`),
    tokens: (s: Sequence, n: number, at: number) => calls.push(`tokens ${s.id} ${n} ${at} (${s.generated})`),
    finished: (s: Sequence, at: number) => calls.push(`finished ${s.id} ${at}`),
    sameGap: (n: number, gap: number) => calls.push(`sameGap ${n} ${gap}`),
  };
  const seqs = ['a', 'b'].map((id, i) =>
    createSequence({
      id,
      priority: 0,
      order: i,
      promptTokens: 32,
      outputTokens: 3,
      maxTokens: 3,
      receivedAt: 0,
      listener,
    }),
  );
  for (const s of seqs) t.r.enqueue(s);
  const progress = (events: SeqEvent[], l: Partial<ReplicaLoad>, epoch = 1, start?: number): void =>
    t.runtime.send(ID, {
      type: 'seq.progress',
      replica: ID,
      epoch,
      at: 100,
      start: start ?? 100,
      events,
      load: load(l),
    });
  return { ...t, calls, seqs, progress };
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

  describe('its engine core', () => {
    it('hands each sequence to the core once, and an idle replica becomes busy', () => {
      const { r, sent } = serving();
      const submits = sent.filter((x) => x.msg.type === 'seq.submit').map((x) => x.msg as MessageOf<'seq.submit'>);
      expect(submits.map((m) => m.seqs!.map((q) => q.id))).toEqual([['a'], ['b']]);
      expect(submits[0]!.seqs![0]).toMatchObject({ promptTokens: 32, maxTokens: 3, outputTokens: 3, generated: 0 });
      expect(to(sent, 'seq.submit')).toEqual(['node', 'node']);
      expect(r.state()).toBe('ready.busy');
      // Not yet heard of by the core: the view counts them as waiting, with their prefill.
      expect(r.work.stats()).toMatchObject({ waiting: 2, prefillTokensAhead: 64 });
      expect(r.inflight()).toMatchObject({ since: 0, reported: [] });
    });

    it('applies progress to the sequences: scheduled at the step start, tokens, a decode set, finished', () => {
      const { r, calls, seqs, progress, run } = serving();
      run(50);
      progress(
        [
          { k: 's', id: 'a' },
          { k: 's', id: 'b' },
          { k: 't', id: 'a', n: 1 },
          { k: 't', id: 'b', n: 1 },
        ],
        {
          running: 2,
          received: 2,
          stepCount: 1,
          stepMembers: 2,
          stepPredictedMs: 10,
          stepBusyMs: 10,
          inflightPredictedMs: 5,
        },
        1,
        90,
      );
      run(5);
      progress([{ k: 'g', ids: ['a', 'b'] }], { running: 2, received: 2, stepCount: 2, inflightPredictedMs: 5 });
      run(5);
      progress([{ k: 'g' }, { k: 'f', id: 'a', reason: 'done' }, { k: 'f', id: 'b', reason: 'done' }], {
        received: 2,
        stepCount: 3,
      });
      expect(calls).toEqual([
        'scheduled a 40',
        'scheduled b 40',
        'tokens a 1 50 (1)',
        'tokens b 1 50 (1)',
        'sameGap 2 5',
        'sameGap 2 5',
        'finished a 60',
        'finished b 60',
      ]);
      expect(seqs.map((s) => s.generated)).toEqual([3, 3]);
      expect(r.state()).toBe('ready.idle');
      expect(r.work.hasWork()).toBe(false);
      expect(r.steps.count).toBe(3);
      expect(r.inflight()).toBeNull();
    });

    it('ignores progress of a dead epoch, and cancels a withdrawn sequence at the core', () => {
      const { r, calls, sent, progress, runtime } = serving();
      progress([{ k: 's', id: 'a' }], { running: 1, received: 2 }, 0);
      expect(calls).toEqual([]);
      runtime.send(ID, { type: 'request.withdraw', id: 'a' });
      expect(
        sent.filter((x) => x.msg.type === 'seq.cancel').map((x) => (x.msg as MessageOf<'seq.cancel'>).ids),
      ).toEqual([['a']]);
      expect(r.work.stats().waiting).toBe(1);
      runtime.send(ID, { type: 'request.withdraw', id: 'a' });
      expect(to(sent, 'seq.cancel')).toHaveLength(1);
    });

    it('fails as a unit when applying progress throws, its requests handed back once', () => {
      const thrown = new Error('ledger drift');
      const interrupted: string[][] = [];
      const { r, runtime, sent, progress } = serving({
        onProgress: () => {
          throw thrown;
        },
        onInterrupted: (ids) => interrupted.push(ids),
      });
      progress([{ k: 's', id: 'a' }], { running: 1, received: 2, stepCount: 1 });
      // Reported as a fault (the simulator's checks still see it), contained, naming the requests it held.
      expect(runtime.faults).toEqual([{ actor: ID, error: thrown, requests: ['a', 'b'], contained: true }]);
      expect(interrupted).toEqual([['a', 'b']]);
      expect(r.hasTag('failed')).toBe(true);
      expect(r.epoch).toBe(2);
      expect(sent.filter((x) => x.msg.type === 'replica.failed').map((x) => x.to)).toEqual(['placement']);
      expect(to(sent, 'gpu.release')).toEqual(['gpu.0', 'gpu.1']);
      // Nothing after it: a late report changes nothing.
      progress([{ k: 'f', id: 'a', reason: 'done' }], { received: 2, stepCount: 2 });
      expect(interrupted).toHaveLength(1);
    });

    it('errors, not contained, on a broken invariant', () => {
      const broken = new BrokenInvariant('ledger drift', ['a']);
      const { r, runtime, progress } = serving({
        onProgress: () => {
          throw broken;
        },
      });
      progress([], { running: 2, received: 2, stepCount: 1 });
      expect(runtime.faults).toEqual([{ actor: ID, error: broken }]);
      expect(r.actor.getSnapshot().status).toBe('error');
    });
  });
});
