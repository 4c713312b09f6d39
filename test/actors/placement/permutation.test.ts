import { describe, expect, it } from 'vitest';
import { initialTransition, transition, type AnyMachineSnapshot } from 'xstate';
import { replicaMachine, type ReplicaEvent } from '../../../machines/replica.machine.ts';
import { createVirtualClock } from '../../../runtime/clock.ts';
import { createRng } from '../../../runtime/rng.ts';
import { createRuntime, type Msg } from '../../../runtime/system.ts';
import { createReplica } from '../../../actors/replica.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { createSequence, type Sequence } from '../../../actors/batcher/sequence.ts';

const GANG = [0, 1, 2, 3, 4, 5, 6, 7];
const FAILED = 3;
const input = { id: 'replica.big@v1#0', model: 'big', version: 'v1', gpus: GANG, epoch: 1, loadMs: 10, unloadMs: 10 };

/** A replica with step 1 in flight on all eight ranks. */
function stepping(): AnyMachineSnapshot {
  let [s] = initialTransition(replicaMachine, input);
  [s] = transition(replicaMachine, s, { type: 'replica.start' });
  for (const g of GANG) [s] = transition(replicaMachine, s, { type: 'gpu.loaded', gpu: g, epoch: 1 });
  [s] = transition(replicaMachine, s, { type: 'work.available' });
  return s;
}

// Event i < 8 is rank i's result for step 1; event 8 is the fault on GPU 3.
const eventOf = (i: number): ReplicaEvent =>
  i < 8 ? { type: 'step.completed', gpu: i, epoch: 1, step: 1 } : { type: 'gpu.failed', gpu: FAILED, code: 'xid_79' };
const project = (s: AnyMachineSnapshot): string => {
  const c = s.context as Record<string, unknown>;
  return JSON.stringify({
    value: s.value,
    epoch: c['epoch'],
    failedGpus: c['failedGpus'],
    stepping: c['stepping'],
    pendingRanks: c['pendingRanks'],
  });
};

describe('a TP-8 replica losing a GPU mid-step', () => {
  it('reaches the same state whatever the order of the eight ranks and the fault (all 9! orders)', () => {
    // Exhaustive over every order: explore (delivered set, actions so far); every path into a set must give the same
    // state, and the local checks below hold on every transition, hence on every one of the 362,880 orders.
    const start = stepping();
    const byMask = new Map<number, string>();
    const finals = new Set<string>();
    const seen = new Set<string>();
    let transitions = 0;
    const walk = (s: AnyMachineSnapshot, mask: number, applied: number, interrupted: number): void => {
      const key = `${mask}|${applied}|${interrupted}`;
      if (seen.has(key)) return;
      seen.add(key);
      const p = project(s);
      const prev = byMask.get(mask);
      if (prev === undefined) byMask.set(mask, p);
      else expect(p).toBe(prev);
      if (mask === 0x1ff) {
        finals.add(`${p} applied=${applied} interrupted=${interrupted}`);
        return;
      }
      for (let i = 0; i < 9; i++) {
        if (mask & (1 << i)) continue;
        const [next, actions] = transition(replicaMachine, s, eventOf(i));
        transitions++;
        const types = actions.map((a) => a.type);
        const completes = types.filter((t) => t === 'completeStep').length;
        const interrupts = types.filter((t) => t === 'interruptAll').length;
        const faultSeen = (mask & 0x100) !== 0;
        // The step is applied only when all eight ranks reported before the fault; late results are dropped.
        if (completes > 0) {
          expect(faultSeen).toBe(false);
          expect((mask | (1 << i)) & 0xff).toBe(0xff);
        }
        if (i === 8) {
          expect(interrupts).toBe(1);
          expect(types).toContain('abortStep');
          expect(applied).toBe((mask & 0xff) === 0xff ? 1 : 0);
        } else expect(interrupts).toBe(0);
        walk(next, mask | (1 << i), applied + completes, interrupted + interrupts);
      }
    };
    walk(start, 0, 0, 0);
    expect(transitions).toBeGreaterThan(500);
    // Two histories (step applied before the fault, or aborted by it), one end state: failed, epoch 2, GPU 3 lost.
    const states = new Set([...finals].map((f) => f.split(' applied')[0]));
    expect(states.size).toBe(1);
    expect([...states][0]).toContain('"value":"failed"');
    expect([...states][0]).toContain('"epoch":2');
    expect([...finals].every((f) => f.endsWith('interrupted=1'))).toBe(true);
  });

  it('gives every request the same outcome whatever the position of the fault among the ranks', () => {
    const outcomes = new Set<string>();
    for (let pos = 0; pos <= 8; pos++) {
      for (const failedReports of [false, true]) {
        const r = driveReplica(pos, failedReports);
        // Exactly one hand-back per request, with the tokens it streamed; the replica ends failed at epoch 2.
        expect(r.interrupted.sort()).toEqual(['req.a', 'req.b']);
        expect(r.state).toBe('failed');
        expect(r.epoch).toBe(2);
        outcomes.add(JSON.stringify({ interrupted: r.interrupted, state: r.state, epoch: r.epoch }));
        // Tokens: the step counts only if all eight ranks reported before the fault.
        expect(r.tokens).toBe(failedReports && pos === 8 ? 1 : 0);
      }
    }
    expect(outcomes.size).toBe(1);
  });
});

/** Drives a real replica actor: one step in flight, then the eight ranks' results with the fault at `pos`. */
function driveReplica(
  pos: number,
  failedReports: boolean,
): { interrupted: string[]; state: string; epoch: number; tokens: number } {
  const clock = createVirtualClock();
  const runtime = createRuntime({ name: 't', clock, rng: createRng(1) });
  const sent: { to: string; msg: Msg }[] = [];
  runtime.setRemote((to, msg) => sent.push({ to, msg }));
  const interrupted: string[] = [];
  let tokens = 0;
  const cost = createCostModel(modelProfile('llama-3-70b'), gpuProfile('H100-SXM'), 8);
  const r = createReplica(runtime, {
    id: 'replica.big@v1#0',
    model: 'big',
    version: 'v1',
    gpus: GANG,
    epoch: 1,
    gpuType: 'H100-SXM',
    modelProfile: 'llama-3-70b',
    cost,
    limits: {
      policy: 'chunked',
      maxRunning: 8,
      tokenBudget: 2048,
      blockTokens: 16,
      maxContext: 8192,
      watermarkBlocks: 0,
      blocksTotal: 1000,
    },
    onInterrupted: (seqs: Sequence[]) => interrupted.push(...seqs.map((s) => s.id)),
  });
  r.actor.send({ type: 'replica.start' });
  for (const g of GANG) runtime.send(r.id, { type: 'gpu.loaded', gpu: g, replica: r.id, epoch: 1 });
  const listener = {
    scheduled: () => {},
    preempted: () => {},
    tokens: (_s: Sequence, n: number) => (tokens += n),
    finished: () => {},
  };
  for (const id of ['req.a', 'req.b']) {
    r.enqueue(
      createSequence({
        id,
        priority: 0,
        order: id === 'req.a' ? 1 : 2,
        promptTokens: 16,
        outputTokens: 4,
        maxTokens: 4,
        receivedAt: 0,
        listener,
      }),
    );
  }
  const step = r.actor.getSnapshot().context.step;
  const results = GANG.filter((g) => failedReports || g !== FAILED).map((g): Msg => ({
    type: 'step.completed',
    gpu: g,
    replica: r.id,
    epoch: 1,
    step,
  }));
  const order: Msg[] = [...results];
  order.splice(Math.min(pos, order.length), 0, { type: 'gpu.failed', gpu: FAILED, code: 'xid_79' });
  for (const m of order) runtime.send(r.id, m);
  const s = r.actor.getSnapshot();
  return { interrupted, state: String(s.value), epoch: s.context.epoch, tokens };
}
