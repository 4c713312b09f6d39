// Hot contexts stay small. XState's assign builds each new context with `Object.assign({}, context, update)`; V8 gives
// an object built that way slow (dictionary) properties once it has 20 of them, and every later assign and read of
// it then costs about twenty times more (measured: ~15 µs against ~0.7 µs per assign). The request machine runs
// several assigns per request and the replica and GPU machines one per event, so their contexts stay well under 20.
import { createActor, type AnyStateMachine } from 'xstate';
import { describe, expect, it } from 'vitest';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import { replicaMachine } from '../../machines/replica.machine.ts';
import { requestMachine } from '../../machines/request.machine.ts';

/** V8 keeps fast properties below this count for objects built by Object.assign onto `{}`. */
const DICTIONARY_AT = 20;

function contextKeys(machine: AnyStateMachine, input: unknown): number {
  const actor = createActor(machine, { input });
  return Object.keys(actor.getSnapshot().context as object).length;
}

describe('machine contexts stay below the size at which V8 makes them dictionaries', () => {
  it('request', () => {
    const n = contextKeys(requestMachine, {
      id: 'r1',
      model: 'm',
      priority: 'standard',
      receivedAt: 0,
      queueBudgetMs: 1000,
    });
    expect(n).toBeLessThanOrEqual(17);
    expect(n).toBeLessThan(DICTIONARY_AT);
  });

  it('replica', () => {
    const n = contextKeys(replicaMachine, {
      id: 'rep',
      model: 'm',
      version: 'v1',
      gpus: [0],
      epoch: 1,
      loadMs: 1,
      unloadMs: 1,
    });
    expect(n).toBeLessThan(DICTIONARY_AT);
  });

  it('gpu', () => {
    expect(contextKeys(gpuMachine, { index: 0 })).toBeLessThan(DICTIONARY_AT);
  });

  it('the request context keeps what never changes in one shared object', () => {
    const actor = createActor(requestMachine, {
      input: { id: 'r1', model: 'm', priority: 'standard', receivedAt: 5, queueBudgetMs: 100, maxResumes: 2 },
    });
    actor.start();
    const before = actor.getSnapshot().context.limits;
    actor.send({ type: 'request.admitted', replica: 'x', t: 6 });
    actor.send({ type: 'request.scheduled', replica: 'x', t: 7 });
    expect(actor.getSnapshot().context.limits).toBe(before);
    expect(before).toEqual({ receivedAt: 5, queueBudgetMs: 100, resumeBudgetMs: 100, maxResumes: 2 });
  });
});
