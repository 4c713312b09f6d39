// ChurnMap is rebuilt every so many deletions (see runtime/churn-map.ts); to its users it must be a Map: same
// entries, same answers, same insertion order, through any number of rebuilds.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { ChurnMap } from '../../runtime/churn-map.ts';

type Op = { kind: 'set'; k: number; v: number } | { kind: 'delete'; k: number } | { kind: 'clear' };

describe('ChurnMap', () => {
  it('answers as a Map does through rebuilds: entries, lookups, size and insertion order (property)', () => {
    const op = fc.oneof(
      {
        weight: 200,
        arbitrary: fc.record({ kind: fc.constant('set' as const), k: fc.noBias(fc.nat(60)), v: fc.integer() }),
      },
      { weight: 200, arbitrary: fc.record({ kind: fc.constant('delete' as const), k: fc.noBias(fc.nat(60)) }) },
      { weight: 1, arbitrary: fc.record({ kind: fc.constant('clear' as const) }) },
    );
    fc.assert(
      fc.property(fc.array(op, { minLength: 200, maxLength: 1500 }), (ops: Op[]) => {
        const m = new ChurnMap<number, number>();
        const ref = new Map<number, number>();
        for (const o of ops) {
          if (o.kind === 'set') {
            m.set(o.k, o.v);
            ref.set(o.k, o.v);
          } else if (o.kind === 'delete') {
            expect(m.delete(o.k)).toBe(ref.delete(o.k));
          } else {
            m.clear();
            ref.clear();
          }
          expect(m.size).toBe(ref.size);
        }
        expect([...m]).toEqual([...ref]);
        expect([...m.keys()]).toEqual([...ref.keys()]);
        expect([...m.values()]).toEqual([...ref.values()]);
        expect([...m.entries()]).toEqual([...ref.entries()]);
        for (let k = 0; k <= 60; k++) {
          expect(m.has(k)).toBe(ref.has(k));
          expect(m.get(k)).toBe(ref.get(k));
        }
      }),
      { numRuns: 100, seed: 11 },
    );
  });

  it('keeps every live entry across many rebuilds of a large map', () => {
    const m = new ChurnMap<string, number>();
    for (let i = 0; i < 5000; i++) m.set(`r${i}`, i);
    // Churn: one in, one out, 20,000 times (rebuilt whenever the deletions reach the size).
    for (let i = 5000; i < 25_000; i++) {
      m.set(`r${i}`, i);
      expect(m.delete(`r${i - 5000}`)).toBe(true);
    }
    expect(m.size).toBe(5000);
    expect([...m.values()]).toEqual(Array.from({ length: 5000 }, (_, j) => 20_000 + j));
  });
});
