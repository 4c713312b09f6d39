// The replica's engine bookkeeping: a sequence opens on the engine once per residency with every token it holds;
// a recomputed one (preempted, or resumed on another replica) also says how many of them it generated, so the
// engine replays their text instead of losing or repeating what it held back.
import { describe, expect, it } from 'vitest';
import { createSequence, type Sequence } from '../../actors/batcher/sequence.ts';
import type { StepPlan } from '../../actors/batcher/continuous.ts';
import { createEngineSteps } from '../../actors/replica-engine.ts';

const listener = {
  scheduled: () => undefined,
  preempted: () => undefined,
  tokens: () => undefined,
  finished: () => undefined,
};

function seq(out: number[]): Sequence {
  const s = createSequence({
    id: 's',
    priority: 0,
    order: 0,
    promptTokens: 3,
    outputTokens: 10,
    maxTokens: 10,
    receivedAt: 0,
    generated: out.length,
    listener,
    tokens: { prompt: [1, 2, 3], out: [...out], lastText: '', finish: null, sampling: { stop: ['xy'] } },
  });
  s.prefillGoal = 3 + out.length;
  return s;
}

const planOf = (s: Sequence, chunk: number): StepPlan => ({ entries: [{ seq: s, chunk }] }) as unknown as StepPlan;

describe('engine steps of a replica', () => {
  it('opens a fresh sequence with its prompt and no generated count', () => {
    const steps = createEngineSteps('r', { maxRunning: 4, maxContext: 256 });
    const s = seq([]);
    const w = steps.wire(planOf(s, 3), [s]);
    expect(w.open).toEqual([{ seq: 's', tokens: [1, 2, 3], left: 10, stop: ['xy'] }]);
  });

  it('opens a recomputed sequence with prompt plus output, and how many of them it generated', () => {
    const steps = createEngineSteps('r', { maxRunning: 4, maxContext: 256 });
    const s = seq([70, 71]);
    const w = steps.wire(planOf(s, 5), [s]);
    expect(w.open).toEqual([{ seq: 's', tokens: [1, 2, 3, 70, 71], left: 8, stop: ['xy'], generated: 2 }]);
    expect(w.items).toEqual([{ seq: 's', from: 0, n: 5, sample: true }]);
  });
});
