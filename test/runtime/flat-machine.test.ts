// A flat machine compiled to actor logic behaves as XState's interpreter of the same machine: every snapshot, every
// action run (with the context and event it saw) and every emitted event, on the same event sequences.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  assign,
  createActor,
  emit,
  raise,
  setup,
  type AnyActorRef,
  type AnyEventObject,
  type AnyStateMachine,
  type InspectionEvent,
} from 'xstate';
import { requestMachine, type RequestContext, type RequestEvent } from '../../machines/request.machine.ts';
import { compileFlatMachine } from '../../runtime/flat-machine.ts';
import { requestSpec } from '../model-check/alphabets.ts';

/** What a snapshot is, for comparing the two. */
const view = (a: AnyActorRef) => {
  const s = a.getSnapshot();
  const tags = ['waiting', 'cancellable', 'running', 'streaming', 'terminal', 'on', 'x'].filter((t) => s.hasTag(t));
  return { value: s.value, status: s.status, context: s.context, tags, output: s.output, matches: s.matches(s.value) };
};

/** An actor of `logic` whose actions, emitted events and inspected actions are logged in order. */
function watched(logic: Parameters<typeof createActor>[0], input: unknown, log: unknown[]): AnyActorRef {
  const inspect = (ev: InspectionEvent): void => {
    if (ev.type === '@xstate.action') log.push(['inspected', ev.action.type, ev.action.params]);
  };
  const actor = createActor(logic as AnyStateMachine, { input, inspect });
  actor.on('*', (e) => log.push(['emitted', e]));
  return actor;
}

/** Runs the machine interpreted and compiled on the same events; each is `pick`ed from what `events` offers in the
 * interpreted actor's state, with its time replaced by `t`. */
function differential(
  machine: (log: unknown[]) => AnyStateMachine,
  input: unknown,
  events: (snapshot: ReturnType<AnyActorRef['getSnapshot']>) => AnyEventObject[],
  steps: { pick: number; t: number }[],
): void {
  const ownLog: unknown[] = [];
  const flatLog: unknown[] = [];
  const own = watched(machine(ownLog), input, ownLog);
  const flat = watched(compileFlatMachine(machine(flatLog)), input, flatLog);
  own.start();
  flat.start();
  expect(view(flat)).toEqual(view(own));
  expect(flatLog).toEqual(ownLog);
  for (const { pick, t } of steps) {
    if (own.getSnapshot().status !== 'active') break;
    const offered = events(own.getSnapshot());
    const e = { ...offered[pick % offered.length]! };
    if ('t' in e) e['t'] = t;
    own.send(e);
    flat.send(e);
    expect(view(flat)).toEqual(view(own));
    expect(flatLog).toEqual(ownLog);
  }
  expect(flat.getSnapshot().status).toBe(own.getSnapshot().status);
}

/** The request machine with actions that log what they saw. */
const loggedRequest = (log: unknown[]): AnyStateMachine =>
  requestMachine.provide({
    actions: {
      reportOutcome: ({ context, event }) => log.push(['reportOutcome', context, event]),
      armDeadline: ({ context, event }) => log.push(['armDeadline', context.deadlineAt, event]),
    },
  });

/** A machine that uses what the request machine does not: exit actions, root entry, targetless and self
 * transitions, inline guards, static emits, action params, a final state with an exit action. */
const kitchenSink = (log: unknown[]) =>
  setup({
    types: {
      context: {} as { n: number; seen: string[] },
      input: {} as { n: number },
      events: {} as
        | { type: 'go'; t: number }
        | { type: 'bump'; t: number }
        | { type: 'self'; t: number }
        | { type: 'end'; t: number },
    },
    actions: {
      note: ({ context, event }, params: { what: string } | undefined) =>
        log.push(['note', params?.what, context.n, event.type]),
    },
    guards: {
      even: ({ context }) => context.n % 2 === 0,
    },
  }).createMachine({
    id: 'sink',
    context: ({ input }) => ({ n: input.n, seen: [] }),
    entry: [{ type: 'note', params: { what: 'root entry' } }],
    initial: 'a',
    states: {
      a: {
        tags: ['on'],
        entry: [{ type: 'note', params: { what: 'a entry' } }],
        exit: [{ type: 'note', params: { what: 'a exit' } }, assign({ seen: ({ context }) => [...context.seen, 'a'] })],
        on: {
          go: [
            { guard: 'even', target: 'b', actions: assign({ n: ({ context, event }) => context.n + event.t }) },
            { guard: ({ event }) => event.t > 5, target: 'c', actions: emit({ type: 'went.c' }) },
          ],
          bump: {
            actions: [
              assign({ n: ({ context }) => context.n + 1 }),
              emit(({ context }) => ({ type: 'bumped', n: context.n })),
            ],
          },
        },
      },
      b: {
        tags: ['on', 'x'],
        entry: 'note',
        on: { go: { target: 'a' }, bump: { target: 'b', actions: assign({ n: ({ context }) => context.n * 2 }) } },
      },
      c: { on: { go: 'a' } },
      d: { type: 'final', entry: 'note', exit: [{ type: 'note', params: { what: 'd exit' } }] },
    },
    on: {
      self: { target: '.a', actions: assign({ n: ({ event }) => event.t }) },
      end: { guard: ({ context }) => context.n > 3, target: '.d' },
    },
    output: ({ context }) => ({ n: context.n, seen: context.seen.length }),
  });

const sinkEvents = (): AnyEventObject[] => [
  { type: 'go', t: 0 },
  { type: 'bump', t: 0 },
  { type: 'self', t: 0 },
  { type: 'end', t: 0 },
  { type: 'unknown.event' },
];

const steps = fc.array(fc.record({ pick: fc.nat(), t: fc.integer({ min: 0, max: 12 }) }), { maxLength: 12 });

describe('a flat machine compiled to actor logic', () => {
  it('lives the request machine as XState interprets it, on every event sequence', () => {
    const spec = requestSpec();
    fc.assert(
      fc.property(steps, (s) =>
        differential(loggedRequest, spec.input, (snap) => spec.events(snap) as AnyEventObject[], s),
      ),
      { numRuns: 500 },
    );
  });

  it('lives a machine with entry, exit, targetless and self transitions, guards, emits and params as XState does', () => {
    fc.assert(
      fc.property(fc.nat(6), steps, (n, s) => differential(kitchenSink, { n }, sinkEvents, s)),
      { numRuns: 500 },
    );
  });

  it('restores a persisted snapshot to the same state and context', () => {
    const machine = loggedRequest([]);
    const own = createActor(machine, { input: requestSpec().input });
    own.start();
    own.send({ type: 'request.admitted', replica: 'r', t: 3 });
    const persisted = own.getPersistedSnapshot();
    const flat = createActor(compileFlatMachine<RequestContext, RequestEvent>(machine), { snapshot: persisted });
    flat.start();
    expect(view(flat)).toEqual(view(own));
    own.send({ type: 'request.scheduled', replica: 'r', t: 4 });
    flat.send({ type: 'request.scheduled', replica: 'r', t: 4 });
    expect(view(flat)).toEqual(view(own));
  });

  it('refuses a machine with what it does not support', () => {
    const nested = setup({}).createMachine({
      id: 'n',
      initial: 'a',
      states: { a: { initial: 'b', states: { b: {} } } },
    });
    const always = setup({}).createMachine({ id: 'w', initial: 'a', states: { a: { always: 'b' }, b: {} } });
    const delayed = setup({}).createMachine({ id: 'd', initial: 'a', states: { a: { after: { 10: 'b' } }, b: {} } });
    const raising = setup({}).createMachine({
      id: 'r',
      initial: 'a',
      states: { a: { on: { go: { actions: raise({ type: 'x' }) } } } },
    });
    const wildcard = setup({}).createMachine({ id: 'c', initial: 'a', states: { a: { on: { '*': 'b' } }, b: {} } });
    const parallel = setup({}).createMachine({ id: 'p', type: 'parallel', states: { a: {}, b: {} } });
    expect(() => compileFlatMachine(nested)).toThrow(/state a is compound/);
    expect(() => compileFlatMachine(always)).toThrow(/eventless/);
    expect(() => compileFlatMachine(delayed)).toThrow(/delayed/);
    expect(() => compileFlatMachine(raising)).toThrow(/built-in action xstate.raise/);
    expect(() => compileFlatMachine(wildcard)).toThrow(/wildcard/);
    expect(() => compileFlatMachine(parallel)).toThrow(/no child states|parallel/);
  });
});
