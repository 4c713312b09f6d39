import { describe, expect, it } from 'vitest';
import { createHealth, DEFAULT_EJECTION, type EjectionConfig } from '../../../actors/router/health.ts';

function tracker(over: Partial<EjectionConfig> = {}, replicas = 4) {
  let now = 0;
  const h = createHealth(
    { now: () => now, modelOf: (id) => (id.startsWith('m') ? 'm' : undefined), replicasOf: () => replicas },
    { ...DEFAULT_EJECTION, minSteps: 5, baseEjectionMs: 1000, maxEjectionMs: 8000, ...over },
  );
  return { h, at: (t: number) => void (now = t) };
}

describe('health (outlier ejection)', () => {
  it('ejects a replica whose steps run slower than predicted by more than the factor', () => {
    const { h } = tracker();
    for (let i = 0; i < 30; i++) h.step('m#0', 10, 30);
    expect(h.ejected('m#0')).toMatch(/steps take .*x their predicted time \(limit 2x\)/);
    expect(h.events[0]).toMatchObject({ kind: 'ejected', replica: 'm#0', untilMs: 1000 });
  });

  it('keeps a replica whose steps run as predicted, or only a little slower', () => {
    const { h } = tracker();
    for (let i = 0; i < 200; i++) h.step('m#0', 10, 10 * (1 + (i % 3) * 0.3));
    expect(h.ejected('m#0')).toBeNull();
    expect(h.events).toEqual([]);
  });

  it('judges no replica before it has run minSteps steps', () => {
    const { h } = tracker({ minSteps: 50 });
    for (let i = 0; i < 49; i++) h.step('m#0', 10, 100);
    expect(h.ejected('m#0')).toBeNull();
    h.step('m#0', 10, 100);
    expect(h.ejected('m#0')).not.toBeNull();
  });

  it('tries an ejected replica again after its back-off, and doubles the back-off when it is still slow', () => {
    const { h, at } = tracker();
    for (let i = 0; i < 30; i++) h.step('m#0', 10, 50);
    expect(h.ejected('m#0')).not.toBeNull();
    at(999);
    expect(h.ejected('m#0')).not.toBeNull();
    at(1000);
    expect(h.ejected('m#0')).toBeNull();
    expect(h.events.map((e) => e.kind)).toEqual(['ejected', 'returned']);
    // Judged afresh: a few slow steps are not enough, minSteps of them are.
    for (let i = 0; i < 4; i++) h.step('m#0', 10, 50);
    expect(h.ejected('m#0')).toBeNull();
    for (let i = 0; i < 30; i++) h.step('m#0', 10, 50);
    expect(h.events.at(-1)).toMatchObject({ kind: 'ejected', untilMs: 1000 + 2000 });
    at(3000);
    expect(h.ejected('m#0')).toBeNull();
    for (let i = 0; i < 30; i++) h.step('m#0', 10, 50);
    expect(h.events.at(-1)).toMatchObject({ kind: 'ejected', untilMs: 3000 + 4000 });
  });

  it('caps the back-off at maxEjectionMs', () => {
    const { h, at } = tracker();
    let t = 0;
    for (let round = 0; round < 6; round++) {
      for (let i = 0; i < 30; i++) h.step('m#0', 10, 50);
      const until = h.events.filter((e) => e.kind === 'ejected').at(-1)!.untilMs!;
      expect(until - t).toBeLessThanOrEqual(8000);
      t = until;
      at(t);
      h.ejected('m#0');
    }
  });

  it('ejects a replica that failed, and tries it again after the back-off', () => {
    const { h, at } = tracker();
    h.failed('m#1', 'gpu fault');
    expect(h.ejected('m#1')).toBe('failed (gpu fault)');
    at(1000);
    expect(h.ejected('m#1')).toBeNull();
  });

  it('needs the configured number of failures in a row; a good step resets the count', () => {
    const { h } = tracker({ failures: 2 });
    h.failed('m#1', 'x');
    h.step('m#1', 10, 10);
    h.failed('m#1', 'x');
    expect(h.ejected('m#1')).toBeNull();
    h.failed('m#1', 'x');
    expect(h.ejected('m#1')).not.toBeNull();
  });

  it('ejects no replica when all of the model run slow alike (a contended node), but still an outlier among them', () => {
    const { h } = tracker({}, 4);
    // Every replica at 2.5-3x its prediction: none is slower than its peers by the factor.
    for (let i = 0; i < 40; i++) for (const [k, id] of ['m#0', 'm#1', 'm#2'].entries()) h.step(id, 10, 25 + 2 * k);
    expect(['m#0', 'm#1', 'm#2'].map((id) => h.ejected(id))).toEqual([null, null, null]);
    expect(h.events).toEqual([]);
    // One of them falls to 7x: more than 2x its best peer's 2.5x.
    for (let i = 0; i < 60; i++) {
      h.step('m#0', 10, 25);
      h.step('m#3', 10, 70);
    }
    expect(h.ejected('m#3')).toMatch(/steps take .*x their predicted time \(limit \d\.\d+x: 2x its peers' 2\.\d+x\)/);
    expect(h.ejected('m#0')).toBeNull();
  });

  it('peek tells an ejection without ending a back-off that has run out (ejected does)', () => {
    const { h, at } = tracker();
    h.failed('m#0', 'gpu fault');
    expect(h.peek('m#0')).toBe('failed (gpu fault)');
    at(1000);
    expect(h.peek('m#0')).toBeNull();
    expect(h.events.map((e) => e.kind)).toEqual(['ejected']);
    expect(h.ejected('m#0')).toBeNull();
    expect(h.events.map((e) => e.kind)).toEqual(['ejected', 'returned']);
  });

  it('waits for a peer that has stepped to be judged before judging the first replica (replicas start unevenly)', () => {
    const { h } = tracker({}, 2);
    // Both take work, but m#0 far more at first; both run 2.5x slow, as on a contended node.
    h.step('m#1', 10, 25);
    for (let i = 0; i < 30; i++) h.step('m#0', 10, 25);
    for (let i = 0; i < 30; i++) {
      h.step('m#0', 10, 25);
      h.step('m#1', 10, 25);
    }
    expect([h.ejected('m#0'), h.ejected('m#1')]).toEqual([null, null]);
    expect(h.events).toEqual([]);
  });

  it('judges against the absolute factor when no peer in routing has been judged', () => {
    const { h } = tracker({}, 4);
    for (let i = 0; i < 30; i++) h.step('m#0', 10, 50);
    // m#0 is out: m#1 has no judged peer in routing, so its own 5x is slow.
    for (let i = 0; i < 30; i++) h.step('m#1', 10, 50);
    expect(h.ejected('m#0')).not.toBeNull();
    expect(h.ejected('m#1')).toMatch(/\(limit 2x\)/);
  });

  it('never ejects more than maxEjectedFraction of a model’s replicas', () => {
    const { h } = tracker({ maxEjectedFraction: 0.5 }, 4);
    for (const id of ['m#0', 'm#1', 'm#2']) for (let i = 0; i < 30; i++) h.step(id, 10, 50);
    expect(['m#0', 'm#1', 'm#2'].filter((id) => h.ejected(id) !== null)).toEqual(['m#0', 'm#1']);
    expect(h.events.find((e) => e.kind === 'kept')).toMatchObject({
      replica: 'm#2',
      reason: expect.stringMatching(/at most 50 %/),
    });
  });

  it('never ejects the only replica of a model', () => {
    const { h } = tracker({}, 1);
    h.failed('m#0', 'gpu fault');
    expect(h.ejected('m#0')).toBeNull();
  });

  it('follows the replica events placement publishes: a failure ejects, a re-creation under the same id forgets it', () => {
    const { h, at } = tracker({ maxEjectedFraction: 1 });
    at(100);
    h.observe({ kind: 'replica.failed', replica: 'm#1', reason: 'gpu 1 failed' });
    expect(h.ejected('m#1')).toBe('failed (gpu 1 failed)');
    h.observe({ kind: 'replica.ready', replica: 'm#1' });
    expect(h.ejected('m#1')).not.toBeNull();
    h.observe({ kind: 'replica.created', replica: 'm#1' });
    expect(h.ejected('m#1')).toBeNull();
    expect(h.ratio('m#1')).toBe(1);
  });
});
