// The request table: request actors started from the machine's initial snapshot, in one group, and still expiring
// at their queue deadline.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createActor, type AnyActorRef, type AnyEventObject } from 'xstate';
import { createRequestActor, createRequestTable, type RequestTable } from '../../../actors/control/request-table.ts';
import type { Live } from '../../../actors/control/types.ts';
import { createCollector } from '../../../actors/metrics/collector.ts';
import type { DecisionTrace } from '../../../actors/router/router.ts';
import { REQUEST_ADMITTED_STATE, REQUEST_INITIAL_STATE, requestMachine } from '../../../machines/request.machine.ts';
import { createVirtualClock } from '../../../runtime/clock.ts';
import { createDeadlineWheel } from '../../../runtime/deadlines.ts';
import { createRng } from '../../../runtime/rng.ts';
import { createRuntime } from '../../../runtime/system.ts';
import { requestSpec } from '../../model-check/alphabets.ts';
import { BrokenInvariant, contained } from '../../../runtime/contain.ts';

const rec = (id: string, t = 0): Omit<Live, 'actor' | 'streams'> => ({
  id,
  spec: { model: 'm', priority: 'standard', promptTokens: 100, maxTokens: 64, outputTokens: 16 },
  model: 'm',
  version: 'v1',
  rank: 0,
  budgetMs: 100,
  estOutputTokens: 64,
  receivedAt: t,
  firstScheduledAt: -1,
  streamed: 0,
  seq: null,
  listener: undefined,
  traces: [],
  heldSince: -1,
});

/** What a snapshot is, for comparing two actors of the same machine. */
const view = (a: AnyActorRef) => {
  const s = a.getSnapshot();
  return { value: s.value, status: s.status, context: s.context, tags: [...s.tags].sort(), output: s.output };
};

/** Sends both actors the same events, each one of those the model checker would send `own` in its state now (picked
 * by `picks`), and checks after each that they look the same. */
function replayBoth(spec: ReturnType<typeof requestSpec>, picks: number[], mine: AnyActorRef, own: AnyActorRef): void {
  for (const pick of picks) {
    if (own.getSnapshot().status !== 'active') break;
    const events = spec.events(own.getSnapshot()) as AnyEventObject[];
    const e = events[pick % events.length]!;
    mine.send(e as never);
    own.send(e as never);
    expect(view(mine)).toEqual(view(own));
  }
}

describe('request actors started from the initial snapshot', () => {
  it('the initial state runs nothing on entry and has no eventless transition', () => {
    const initial = requestMachine.root.states[REQUEST_INITIAL_STATE]!;
    expect(requestMachine.root.initial.target.map((n) => n.key)).toEqual([REQUEST_INITIAL_STATE]);
    expect(initial.entry).toEqual([]);
    expect(initial.always ?? []).toEqual([]);
  });

  it('admission leads from the initial state to a state whose one entry action arms the deadline', () => {
    const initial = requestMachine.root.states[REQUEST_INITIAL_STATE]!;
    const admitted = requestMachine.root.states[REQUEST_ADMITTED_STATE]!;
    const [t, ...others] = initial.transitions.get('request.admitted')!;
    expect(others).toEqual([]);
    expect(t!.guard).toBeUndefined();
    expect(t!.target).toEqual([admitted]);
    expect(admitted.entry.map((a) => (typeof a === 'string' ? a : (a as { type?: string }).type))).toEqual([
      'armDeadline',
    ]);
    expect(admitted.always ?? []).toEqual([]);
  });

  it('started admitted, live every event sequence as actors the machine starts and admits do', () => {
    const spec = requestSpec();
    const input = spec.input as { queueBudgetMs: number; resumeBudgetMs: number; maxResumes: number };
    const rt = createRuntime({ name: 't', clock: createVirtualClock(), rng: createRng(1) });
    const group = rt.group('requests');
    let n = 0;
    fc.assert(
      fc.property(fc.string(), fc.nat(1000), fc.array(fc.nat(), { maxLength: 8 }), (replica, t, picks) => {
        const id = `req.${++n}`;
        const r = { ...rec(id), budgetMs: input.queueBudgetMs };
        const resume = { budgetMs: input.resumeBudgetMs, maxResumes: input.maxResumes };
        const mine = createRequestActor(requestMachine, group.parent, r, resume, { replica, t });
        const own = createActor(requestMachine, {
          input: { ...input, id, model: 'm', priority: 'standard', receivedAt: 0 },
        });
        group.add(id, mine);
        mine.start();
        own.start();
        own.send({ type: 'request.admitted', replica, t });
        expect(view(mine)).toEqual(view(own));
        replayBoth(spec, picks, mine, own);
      }),
      { numRuns: 300 },
    );
  });

  it('live every event sequence as actors the machine starts itself do', () => {
    const spec = requestSpec();
    const input = spec.input as { queueBudgetMs: number; resumeBudgetMs: number; maxResumes: number };
    const rt = createRuntime({ name: 't', clock: createVirtualClock(), rng: createRng(1) });
    const group = rt.group('requests');
    fc.assert(
      // Each step picks one of the events the model checker would send in the current state (deadlines current or
      // stale included).
      fc.property(fc.array(fc.nat(), { maxLength: 8 }), (picks) => {
        const r = { ...rec('req.1'), budgetMs: input.queueBudgetMs };
        const resume = { budgetMs: input.resumeBudgetMs, maxResumes: input.maxResumes };
        const mine = createRequestActor(requestMachine, group.parent, r, resume);
        const own = createActor(requestMachine, {
          input: { ...input, id: 'req.1', model: 'm', priority: 'standard', receivedAt: 0 },
        });
        group.add('req.1', mine);
        mine.start();
        own.start();
        expect(view(mine)).toEqual(view(own));
        replayBoth(spec, picks, mine, own);
      }),
      { numRuns: 500 },
    );
  });
});

function table(log?: (line: string) => void): {
  t: RequestTable;
  wheel: ReturnType<typeof createDeadlineWheel>;
  clock: ReturnType<typeof createVirtualClock>;
  runtime: ReturnType<typeof createRuntime>;
} {
  const clock = createVirtualClock();
  const runtime = createRuntime({ name: 't', clock, rng: createRng(1) });
  const wheel = createDeadlineWheel(clock);
  const t = createRequestTable({
    runtime,
    collector: createCollector(),
    deadlines: wheel,
    keepTraces: false,
    oracle: () => false,
    expiryTrace: () => ({}) as DecisionTrace,
    scheduled: () => {},
    ...(log ? { log } : {}),
  });
  return { t, wheel, clock, runtime };
}

describe('request deadlines', () => {
  it('a request still queued at its deadline expires then', () => {
    const { t, wheel, clock } = table();
    const a = t.start(rec('a'), { budgetMs: 50, maxResumes: 1 });
    a.actor.send({ type: 'request.admitted', replica: 'r', t: 0 });
    clock.run();
    expect(clock.now()).toBe(100);
    expect(a.actor.getSnapshot().value).toBe('expired');
    expect(wheel.size).toBe(0);
  });

  it('a request started admitted has its deadline armed and expires at it, as one admitted by event does', () => {
    const { t, wheel, clock } = table();
    const a = t.start(rec('a'), { budgetMs: 50, maxResumes: 1 }, { replica: 'r', t: 0 });
    expect(a.actor.getSnapshot().value).toBe('queued');
    expect(wheel.size).toBe(1);
    clock.run();
    expect(clock.now()).toBe(100);
    expect(a.actor.getSnapshot().value).toBe('expired');
    expect(t.has('a')).toBe(false);
  });
});

describe('failing a request whose handling threw', () => {
  it('ends it with internal, tells its client once, and withdraws it from the replica that holds it', () => {
    const { t, runtime } = table();
    const ends: string[] = [];
    const withdrawn: string[] = [];
    const listener = {
      terminal: (id: string, o: { outcome: string; code: string | null }) => ends.push(`${id} ${o.outcome} ${o.code}`),
    };
    // The request's replica, as the runtime knows it.
    runtime.register('replica.m@v1#0', (msg) => {
      if (msg.type === 'request.withdraw') withdrawn.push(msg.id);
    });
    t.start({ ...rec('req.1'), listener }, { budgetMs: 1000, maxResumes: 1 }, { replica: 'replica.m@v1#0', t: 0 });
    expect(t.fail('req.1', 'handling it threw')).toBe(true);
    expect(t.has('req.1')).toBe(false);
    expect(ends).toEqual(['req.1 failed internal']);
    expect(withdrawn).toEqual(['req.1']);
    // Not live any more: nothing to fail, nothing said twice.
    expect(t.fail('req.1', 'again')).toBe(false);
    expect(ends).toHaveLength(1);
  });

  it('ends the process, naming the request, when failing it throws too', () => {
    const { t, runtime } = table();
    // The hold it waits in is broken as well: withdrawing it throws.
    runtime.register('router', () => {
      throw new Error('the hold is broken as well');
    });
    t.start(rec('req.7'), { budgetMs: 1000, maxResumes: 1 }, { replica: 'router', t: 0 });
    let thrown: unknown;
    try {
      t.fail('req.7', 'handling it threw');
    } catch (e) {
      thrown = e;
    }
    expect(thrown).toBeInstanceOf(BrokenInvariant);
    expect((thrown as BrokenInvariant).requests).toEqual(['req.7']);
    expect(() => contained(thrown)).toThrow(/req\.7/);
    expect(contained(new Error('one request only'))).toMatch(/one request only/);
  });
});

describe('a client that throws when told its request expired', () => {
  it('leaves the request ended and released, logged, with no fault', () => {
    const lines: string[] = [];
    const { t, clock, runtime } = table((line) => lines.push(line));
    const ends: string[] = [];
    const broken = {
      terminal: () => {
        throw new Error('the client of a broke');
      },
    };
    t.start({ ...rec('a'), listener: broken }, { budgetMs: 50, maxResumes: 1 }, { replica: 'r', t: 0 });
    t.start(
      { ...rec('b'), listener: { terminal: (id) => void ends.push(id) } },
      { budgetMs: 50, maxResumes: 1 },
      { replica: 'r', t: 0 },
    );
    clock.run();
    expect(runtime.faults).toEqual([]);
    expect(t.size).toBe(0);
    expect(ends).toEqual(['b']);
    expect(lines).toEqual([
      expect.stringMatching(/^request a: delivering its end failed: Error: the client of a broke/),
    ]);
  });
});
