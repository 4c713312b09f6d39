import { describe, expect, it } from 'vitest';
import { createVirtualClock, createWallClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import fc from 'fast-check';
import { createDeadlineWheel } from '../../runtime/deadlines.ts';
import { createRuntime } from '../../runtime/system.ts';

describe('virtual clock', () => {
  it('runs callbacks in time order and in scheduling order at equal times', () => {
    const c = createVirtualClock();
    const seen: string[] = [];
    c.setTimeout(() => seen.push('b@10'), 10);
    c.setTimeout(() => seen.push('a@5'), 5);
    c.setTimeout(() => seen.push('c@10'), 10);
    c.at(0, () => seen.push('now'));
    c.run();
    expect(seen).toEqual(['now', 'a@5', 'b@10', 'c@10']);
    expect(c.now()).toBe(10);
  });

  it('skips cleared timers and stops at the requested time', () => {
    const c = createVirtualClock();
    const seen: number[] = [];
    const id = c.setTimeout(() => seen.push(1), 1);
    c.setTimeout(() => seen.push(2), 2);
    c.setTimeout(() => seen.push(9), 9);
    c.clearTimeout(id);
    c.run(5);
    expect(seen).toEqual([2]);
    expect(c.now()).toBe(5);
    expect(c.pending()).toBe(1);
  });

  it('an id names one timer only: clearing a fired or cleared timer never touches the timer reusing its slot', () => {
    const c = createVirtualClock();
    const seen: string[] = [];
    const fired = c.setTimeout(() => seen.push('fired'), 1);
    c.run(2);
    // The fired timer's slot is free: the next timer takes it, and the old id must not cancel it.
    const reuser = c.setTimeout(() => seen.push('reuser'), 1);
    c.clearTimeout(fired);
    expect(c.pending()).toBe(1);
    const cleared = c.setTimeout(() => seen.push('cleared'), 1);
    c.clearTimeout(cleared);
    const next = c.setTimeout(() => seen.push('next'), 1);
    c.clearTimeout(cleared);
    c.clearTimeout(cleared + 0.5);
    c.clearTimeout(-1);
    expect(c.pending()).toBe(2);
    expect(new Set([fired, reuser, cleared, next]).size).toBe(4);
    c.run();
    expect(seen).toEqual(['fired', 'reuser', 'next']);
    expect(c.pending()).toBe(0);
    // Thousands of timers pending at once, cleared in a scattered order: the rest still fire, each once.
    const ids = Array.from({ length: 5000 }, (_, i) => c.setTimeout(() => seen.push(`t${i}`), 1 + (i % 7)));
    for (let i = 0; i < ids.length; i += 3) c.clearTimeout(ids[i]!);
    c.run();
    const late = seen.filter((x) => x.startsWith('t'));
    expect(late.length).toBe(5000 - Math.ceil(5000 / 3));
    expect(new Set(late).size).toBe(late.length);
    expect(late.every((x) => Number(x.slice(1)) % 3 !== 0)).toBe(true);
  });

  it('never schedules into the past', () => {
    const c = createVirtualClock(100);
    let at = -1;
    c.at(50, () => (at = c.now()));
    c.run();
    expect(at).toBe(100);
  });
});

describe('seeded rng', () => {
  it('gives the same sequence for the same seed and different ones for different seeds', () => {
    const a = createRng(7);
    const b = createRng(7);
    const c = createRng(8);
    const xs = Array.from({ length: 5 }, () => a.next());
    expect(Array.from({ length: 5 }, () => b.next())).toEqual(xs);
    expect(Array.from({ length: 5 }, () => c.next())).not.toEqual(xs);
  });

  it('draws exponential and gamma samples with the requested mean', () => {
    const r = createRng(1);
    const n = 20000;
    let e = 0;
    let g = 0;
    for (let i = 0; i < n; i++) {
      e += r.exponential(3);
      g += r.gamma(5, 2);
    }
    expect(e / n).toBeGreaterThan(2.85);
    expect(e / n).toBeLessThan(3.15);
    expect(g / n).toBeGreaterThan(4.6);
    expect(g / n).toBeLessThan(5.4);
  });

  it('forks independent, reproducible streams by label', () => {
    expect(createRng(1).fork('x').next()).toBe(createRng(1).fork('x').next());
    expect(createRng(1).fork('x').next()).not.toBe(createRng(1).fork('y').next());
  });
});

describe('deadline wheel', () => {
  it('fires the others due and later ones when one callback throws, then passes its error on to the clock', () => {
    const c = createVirtualClock();
    const w = createDeadlineWheel(c);
    const fired: string[] = [];
    const boom = new Error('one deadline broke');
    w.arm(10, () => fired.push('a@10'));
    w.arm(10, () => {
      throw boom;
    });
    w.arm(10, () => fired.push('c@10'));
    w.arm(20, () => fired.push('d@20'));
    expect(() => c.run()).toThrow(boom);
    expect(fired).toEqual(['a@10', 'c@10']);
    // The wheel is armed again for what is left: the later deadline still fires.
    c.run();
    expect(fired).toEqual(['a@10', 'c@10', 'd@20']);
    expect(w.armed).toBe(0);
  });

  it('fires every deadline at its time with one clock timer at a time', () => {
    const c = createVirtualClock();
    const w = createDeadlineWheel(c);
    const fired: [number, number][] = [];
    for (const at of [30, 10, 20, 10]) w.arm(at, () => fired.push([at, c.now()]));
    expect(c.pending()).toBe(1);
    c.run();
    expect(fired).toEqual([
      [10, 10],
      [10, 10],
      [20, 20],
      [30, 30],
    ]);
    expect(w.size).toBe(0);
  });

  it('never fires a disarmed deadline, nor wakes the clock for one', () => {
    const c = createVirtualClock();
    const w = createDeadlineWheel(c);
    const fired: number[] = [];
    const off10 = w.arm(10, () => fired.push(10));
    const off20 = w.arm(20, () => fired.push(20));
    w.arm(30, () => fired.push(30));
    off20();
    off10();
    off10();
    // The clock's one timer moved to the earliest live deadline: the run wakes once, at 30.
    expect(c.pending()).toBe(1);
    expect(c.run()).toBe(1);
    expect(fired).toEqual([30]);
    expect(c.now()).toBe(30);
    const off = w.arm(40, () => fired.push(40));
    off();
    expect(c.pending()).toBe(0);
    expect(c.run()).toBe(0);
    expect(fired).toEqual([30]);
  });
});

describe('deadline wheel, bounded', () => {
  it('keeps at most as many disarmed entries as armed ones (plus a constant), firing the rest in order', () => {
    // Budgets of minutes disarmed milliseconds later: before compaction the heap grew with rate x budget.
    const c = createVirtualClock();
    const w = createDeadlineWheel(c);
    const fired: number[] = [];
    for (let i = 0; i < 100_000; i++) {
      const off = w.arm(600_000 + i, () => fired.push(i));
      if (i % 10 !== 0) off();
      if (i % 1000 === 999) expect(w.size).toBeLessThanOrEqual(w.armed + Math.max(w.armed, 1024));
    }
    expect(w.armed).toBe(10_000);
    c.run();
    expect(fired).toEqual(Array.from({ length: 10_000 }, (_, k) => 10 * k));
    expect(w.size).toBe(0);
    expect(w.armed).toBe(0);
  });

  it('fires exactly the deadlines never disarmed, each once, by time then arming order (property)', () => {
    type Op = { kind: 'arm'; at: number } | { kind: 'off'; pick: number } | { kind: 'run'; by: number };
    const op = fc.oneof(
      { weight: 4, arbitrary: fc.record({ kind: fc.constant('arm' as const), at: fc.integer({ min: 0, max: 200 }) }) },
      { weight: 4, arbitrary: fc.record({ kind: fc.constant('off' as const), pick: fc.nat() }) },
      { weight: 1, arbitrary: fc.record({ kind: fc.constant('run' as const), by: fc.integer({ min: 0, max: 10 }) }) },
    );
    fc.assert(
      fc.property(fc.array(op, { minLength: 500, maxLength: 2000 }), (ops: Op[]) => {
        const c = createVirtualClock();
        // Compacted from 4 disarmed entries on, so that the runs rebuild the heap often.
        const w = createDeadlineWheel(c, 4);
        const fired: number[] = [];
        const entries: { at: number; n: number; off: () => void; live: boolean; fired: boolean }[] = [];
        for (const o of ops) {
          if (o.kind === 'arm') {
            const at = c.now() + o.at;
            const n = entries.length;
            const e = {
              at,
              n,
              live: true,
              fired: false,
              off: w.arm(at, () => {
                if (!e.live || e.fired || c.now() !== at) throw new Error(`deadline ${n} fired wrongly`);
                e.fired = true;
                fired.push(n);
              }),
            };
            entries.push(e);
          } else if (o.kind === 'off' && entries.length > 0) {
            // Mostly recent ones (those still armed), as requests are scheduled soon after they arm.
            const e = entries[Math.max(0, entries.length - 1 - (o.pick % 8))]!;
            if (!e.fired) e.live = false;
            e.off();
          } else if (o.kind === 'run') {
            c.run(c.now() + o.by);
          }
          const armed = entries.filter((e) => e.live && !e.fired).length;
          expect(w.armed).toBe(armed);
          expect(w.size).toBeLessThanOrEqual(armed + Math.max(armed, 4));
        }
        c.run();
        const expected = entries
          .filter((e) => e.live)
          .sort((a, b) => a.at - b.at || a.n - b.n)
          .map((e) => e.n);
        expect(fired).toEqual(expected);
        expect(w.size).toBe(0);
      }),
      { numRuns: 60, seed: 7, endOnFailure: true },
    );
  });
});

describe('runtime', () => {
  it('delivers to local entities, forwards the rest to the remote link, and counts what it cannot route', () => {
    const clock = createVirtualClock();
    const rt = createRuntime({ name: 't', clock, rng: createRng(1) });
    const local: string[] = [];
    rt.register('a', (m) => local.push(m.type));
    rt.send('a', { type: 'gpu.ready', gpu: 0 });
    rt.send('b', { type: 'request.withdraw', id: 'req.1' });
    expect(local).toEqual(['gpu.ready']);
    expect(rt.dropped.get('request.withdraw')).toBe(1);
    const remote: string[] = [];
    rt.setRemote((to, m) => remote.push(`${to}:${m.type}`));
    rt.send('b', { type: 'gpu.fence', gpu: 1, code: 'xid_79' });
    expect(remote).toEqual(['b:gpu.fence']);
  });
});

describe('wall clock', () => {
  it("hands a timer's error to onError and runs the other timers on", async () => {
    const errors: unknown[] = [];
    const c = createWallClock((e) => errors.push(e));
    const boom = new Error('one timer broke');
    const ran: string[] = [];
    await new Promise<void>((resolve) => {
      c.setTimeout(() => {
        throw boom;
      }, 0);
      c.setTimeout(() => ran.push('immediate'), 0);
      c.setTimeout(() => {
        throw boom;
      }, 1);
      c.setTimeout(() => {
        ran.push('later');
        resolve();
      }, 5);
    });
    expect(ran).toEqual(['immediate', 'later']);
    expect(errors).toEqual([boom, boom]);
  });
});
