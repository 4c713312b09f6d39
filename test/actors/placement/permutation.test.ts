// A TP-8 replica losing GPUs while its engine core reports: whatever the order of the faults, the core's late work
// events and a crash, the gang fails once; and a real replica actor gives every request exactly one outcome wherever
// the fault falls among its core's progress reports.
import { describe, expect, it } from 'vitest';
import { initialTransition, transition, type AnyMachineSnapshot } from 'xstate';
import { replicaMachine, type ReplicaEvent } from '../../../machines/replica.machine.ts';
import { idleLoad, type ReplicaLoad, type SeqEvent } from '../../../machines/core-messages.ts';
import { createVirtualClock } from '../../../runtime/clock.ts';
import { createRng } from '../../../runtime/rng.ts';
import { createRuntime, type Msg } from '../../../runtime/system.ts';
import { createReplica } from '../../../actors/replica.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { createSequence, type Sequence } from '../../../actors/batcher/sequence.ts';

const ID = 'replica.big@v1#0';
const GANG = [0, 1, 2, 3, 4, 5, 6, 7];
const FAILED = 3;
const input = { id: ID, model: 'big', version: 'v1', gpus: GANG, epoch: 1, loadMs: 10, unloadMs: 10 };

/** A loaded TP-8 replica whose core holds work. */
function busy(): AnyMachineSnapshot {
  let [s] = initialTransition(replicaMachine, input);
  [s] = transition(replicaMachine, s, { type: 'replica.start' });
  for (const g of GANG) [s] = transition(replicaMachine, s, { type: 'gpu.loaded', gpu: g, epoch: 1 });
  [s] = transition(replicaMachine, s, { type: 'work.available' });
  return s;
}

// Events 0-7: a fault on each rank; 8, 9: the core's work events; 10: the control plane's handling of progress threw.
const EVENTS: ReplicaEvent[] = [
  ...GANG.map((gpu): ReplicaEvent => ({ type: 'gpu.failed', gpu, code: 'xid_79' })),
  { type: 'work.saturated' },
  { type: 'work.idle' },
  { type: 'step.crashed', error: new Error('applying progress threw') },
];
const ALL = (1 << EVENTS.length) - 1;
/** Events that fail a serving replica: any rank's fault, or the crash. */
const FAILING = ALL & ~((1 << 8) | (1 << 9));

const project = (s: AnyMachineSnapshot): string => {
  const c = s.context as { epoch: number; busy: boolean; failedGpus: readonly number[]; released: number };
  return JSON.stringify({
    value: s.value,
    epoch: c.epoch,
    busy: c.busy,
    failedGpus: [...c.failedGpus].sort(),
    released: c.released,
  });
};
const tellsFailed = (a: { type: string; params?: unknown }): boolean =>
  a.type === 'xstate.emit' && (a.params as { event: { msg: { type: string } } }).event.msg.type === 'replica.failed';

describe('a TP-8 replica losing GPUs while its core reports work', () => {
  it('fails its gang once, at the first fault or crash, whatever the order of eight faults, two work events and a crash (all 11! orders)', () => {
    // Exhaustive over every order: explore (delivered set, state, failures told so far); the local checks below hold
    // on every transition, hence on every one of the 39,916,800 orders.
    const byMask = new Map<number, string>();
    const finals = new Set<string>();
    const seen = new Set<string>();
    let transitions = 0;
    const walk = (s: AnyMachineSnapshot, mask: number, told: number, interrupted: number): void => {
      const p = project(s);
      const key = `${mask}|${p}|${told}|${interrupted}`;
      if (seen.has(key)) return;
      seen.add(key);
      // Once the gang failed, the state depends only on which events came, not on their order.
      if (mask & FAILING) {
        const prev = byMask.get(mask);
        if (prev === undefined) byMask.set(mask, p);
        else expect(p).toBe(prev);
      }
      if (mask === ALL) {
        finals.add(`${p} told=${told} interrupted=${interrupted}`);
        return;
      }
      for (let i = 0; i < EVENTS.length; i++) {
        if (mask & (1 << i)) continue;
        const e = EVENTS[i]!;
        const [next, actions] = transition(replicaMachine, s, e);
        transitions++;
        const types = actions.map((a) => a.type);
        const tells = actions.filter(tellsFailed).length;
        const interrupts = types.filter((t) => t === 'interruptAll').length;
        const first = (mask & FAILING) === 0 && ((1 << i) & FAILING) !== 0;
        // The first fault or crash fails the whole gang: its work handed back once, the epoch raised, placement told.
        expect(tells).toBe(first ? 1 : 0);
        expect(interrupts).toBe(first ? 1 : 0);
        if (first) {
          expect(next.hasTag('failed')).toBe(true);
          expect((next.context as { epoch: number }).epoch).toBe(2);
        }
        // After it, the core's work events (from a dead epoch) change nothing, and a crash is only reported.
        if (!first && (mask & FAILING) !== 0 && e.type.startsWith('work.')) {
          expect(project(next)).toBe(project(s));
          expect(types).toEqual([]);
        }
        if (!first && (mask & FAILING) !== 0 && e.type === 'step.crashed') expect(types).toEqual(['crash']);
        walk(next, mask | (1 << i), told + tells, interrupted + interrupts);
      }
    };
    walk(busy(), 0, 0, 0);
    expect(transitions).toBeGreaterThan(5_000);
    // One end: every GPU failed and accounted for, the replica stopped at epoch 2, told and interrupted once.
    expect([...finals]).toEqual([
      `${JSON.stringify({ value: 'stopped', epoch: 2, busy: false, failedGpus: GANG, released: 0 })} told=1 interrupted=1`,
    ]);
  });
});

/** A load report with the given fields (the rest zero). */
const load = (over: Partial<ReplicaLoad> = {}): ReplicaLoad => idleLoad({ blocksTotal: 1000, ...over });

// The core's three reports for requests a and b (epoch 1): both scheduled; a token each and a finished; b finished.
const REPORTS: [SeqEvent[], Partial<ReplicaLoad>][] = [
  [
    [
      { k: 's', id: 'req.a' },
      { k: 's', id: 'req.b' },
    ],
    { running: 2, received: 2, stepCount: 1 },
  ],
  [
    [
      { k: 't', id: 'req.a', n: 1 },
      { k: 't', id: 'req.b', n: 1 },
      { k: 'f', id: 'req.a', reason: 'done' },
    ],
    { running: 1, received: 2, stepCount: 2 },
  ],
  [
    [
      { k: 't', id: 'req.b', n: 1 },
      { k: 'f', id: 'req.b', reason: 'done' },
    ],
    { received: 2, stepCount: 3 },
  ],
];

/** Drives a real replica actor holding two requests: its core's three reports, with the fault on GPU 3 at `pos`. */
function driveReplica(pos: number): {
  finished: string[];
  interrupted: string[];
  tokens: number;
  state: string;
  epoch: number;
} {
  const clock = createVirtualClock();
  const runtime = createRuntime({ name: 't', clock, rng: createRng(1) });
  runtime.setRemote(() => {});
  const finished: string[] = [];
  const interrupted: string[] = [];
  let tokens = 0;
  const r = createReplica(runtime, {
    id: ID,
    model: 'big',
    version: 'v1',
    gpus: GANG,
    epoch: 1,
    gpuType: 'H100-SXM',
    modelProfile: 'llama-3-70b',
    cost: createCostModel(modelProfile('llama-3-70b'), gpuProfile('H100-SXM'), 8),
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
  for (const g of GANG) runtime.send(ID, { type: 'gpu.loaded', gpu: g, replica: ID, epoch: 1 });
  const listener = {
    scheduled: () => {},
    preempted: () => {},
    tokens: (_s: Sequence, n: number) => (tokens += n),
    finished: (s: Sequence) => finished.push(s.id),
  };
  for (const id of ['req.a', 'req.b'])
    r.enqueue(
      createSequence({
        id,
        priority: 0,
        order: id === 'req.a' ? 1 : 2,
        promptTokens: 16,
        outputTokens: 2,
        maxTokens: 4,
        receivedAt: 0,
        listener,
      }),
    );
  const order: Msg[] = REPORTS.map(([events, l], i) => ({
    type: 'seq.progress',
    replica: ID,
    epoch: 1,
    at: 10 * (i + 1),
    start: 10 * i,
    events,
    load: load(l),
  }));
  order.splice(pos, 0, { type: 'gpu.failed', gpu: FAILED, code: 'xid_79' });
  for (const m of order) runtime.send(ID, m);
  const s = r.actor.getSnapshot();
  return { finished, interrupted, tokens, state: String(s.value), epoch: s.context.epoch };
}

describe('a real TP-8 replica losing a GPU among its core’s progress reports', () => {
  it('gives every request exactly one outcome wherever the fault falls, and applies no report after it', () => {
    for (let pos = 0; pos <= REPORTS.length; pos++) {
      const r = driveReplica(pos);
      // Finished by the reports before the fault; every other one handed back by the failure, once.
      const before = REPORTS.slice(0, pos).flatMap(([events]) => events);
      const done = before.filter((e) => e.k === 'f').map((e) => (e as { id: string }).id);
      expect(r.finished).toEqual(done);
      expect(r.interrupted.sort()).toEqual(['req.a', 'req.b'].filter((id) => !done.includes(id)));
      expect(r.tokens).toBe(before.filter((e) => e.k === 't').length);
      expect(r.state).toBe('failed');
      expect(r.epoch).toBe(2);
    }
  });
});
