// Actor groups: many short-lived actors (the requests) supervised through one parent and one shared actor system.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { assign, createActor, emit, setup, type InspectionEvent } from 'xstate';
import type { OutEvent } from '../../machines/messages.ts';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime } from '../../runtime/system.ts';

// A small member machine: `go` moves on, `out` emits a message, `boom` throws in an action, `end` finishes.
const member = setup({
  types: {
    context: {} as { n: number },
    events: {} as { type: 'go' } | { type: 'out' } | { type: 'boom' } | { type: 'end' },
    emitted: {} as OutEvent,
  },
  actions: {
    boom: () => {
      throw new Error('broken invariant');
    },
  },
}).createMachine({
  id: 'member',
  context: { n: 0 },
  initial: 'a',
  states: {
    a: { on: { go: { target: 'b', actions: assign({ n: ({ context }) => context.n + 1 }) } } },
    b: {
      on: {
        out: { actions: emit({ type: 'out', to: 'sink', msg: { type: 'request.withdraw', id: 'r1' } }) },
        boom: { actions: 'boom' },
        end: 'done',
      },
    },
    done: { type: 'final' },
  },
});

const setupGroup = () => {
  const clock = createVirtualClock();
  const rt = createRuntime({ name: 't', clock, rng: createRng(1) });
  const group = rt.group('members');
  const start = (id: string) => {
    const actor = createActor(member, { id, parent: group.parent });
    group.add(id, actor);
    actor.start();
    return actor;
  };
  return { rt, group, start };
};

const states = (seen: InspectionEvent[]): string[] =>
  seen
    .filter((e) => e.type === '@xstate.snapshot' && (e.actorRef as unknown as { id: string }).id !== 'members')
    .map(
      (e) =>
        `${(e.actorRef as unknown as { id: string }).id}:${String((e as { snapshot: { value?: unknown } }).snapshot.value)}`,
    );

describe('actor groups', () => {
  it('share one actor system and forget a member once it is done', () => {
    const { group, start } = setupGroup();
    const a = start('m1');
    const b = start('m2');
    expect(a.system).toBe(b.system);
    expect(a.system).toBe(group.parent.system);
    expect(group.size).toBe(2);
    a.send({ type: 'go' });
    a.send({ type: 'end' });
    expect(a.getSnapshot().status).toBe('done');
    expect(group.size).toBe(1);
  });

  it("routes a member's out events and reports its error as a fault of that member", () => {
    const { rt, group, start } = setupGroup();
    const got: string[] = [];
    rt.register('sink', (m) => got.push(m.type));
    const a = start('m1');
    a.send({ type: 'go' });
    a.send({ type: 'out' });
    expect(got).toEqual(['request.withdraw']);
    a.send({ type: 'boom' });
    expect(a.getSnapshot().status).toBe('error');
    expect(rt.faults.map((f) => [f.actor, (f.error as Error).message])).toEqual([['m1', 'broken invariant']]);
    expect(group.size).toBe(0);
  });

  it('replays live members to an inspector set later, then reports their transitions and new members', () => {
    const { rt, start } = setupGroup();
    const a = start('m1');
    const b = start('m2');
    b.send({ type: 'go' });
    b.send({ type: 'end' });
    const seen: InspectionEvent[] = [];
    rt.setInspector((e) => seen.push(e));
    expect(states(seen)).toEqual(['m1:a']);
    a.send({ type: 'go' });
    start('m3');
    expect(states(seen)).toEqual(['m1:a', 'm1:b', 'm3:a']);
    rt.setInspector(null);
    seen.length = 0;
    a.send({ type: 'end' });
    expect(seen).toEqual([]);
  });
});

describe("XState's system map of started actors", () => {
  // runtime/system.ts's registerNothing relies on it: a group's system keeps nothing when it starts a member, which is
  // only harmless while XState never reads that map. An XState upgrade that starts reading it fails here.
  it('is write-only in the installed XState (set when an actor starts, deleted when it stops)', () => {
    const dist = dirname(fileURLToPath(import.meta.resolve('xstate')));
    const files = readdirSync(dist)
      .filter((f) => /\.(cjs|esm)\.js$/.test(f))
      .map((f) => readFileSync(join(dist, f), 'utf8'))
      .filter((src) => src.includes('function createSystem('));
    expect(files.length).toBeGreaterThan(0);
    for (const src of files) {
      const from = src.indexOf('function createSystem(');
      const body = src.slice(from, src.indexOf('\n}\n', from));
      const uses = body.match(/\bchildren\b[^\n]*/g) ?? [];
      expect(uses.length).toBe(3);
      expect(uses[0]).toMatch(/^children = new Map\(\);$/);
      expect(uses[1]).toMatch(/^children\.set\(sessionId, actorRef\);$/);
      expect(uses[2]).toMatch(/^children\.delete\(actorRef\.sessionId\);$/);
    }
  });
});
