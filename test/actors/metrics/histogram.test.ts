// The log histogram keeps its last sample's bucket: a run of equal samples costs one log. Its summary must not
// depend on the order samples arrive in (a stale bucket would count a sample where the previous one went).
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createLogHistogram } from '../../../actors/metrics/histogram.ts';

const summaryOf = (xs: readonly number[]) => {
  const h = createLogHistogram();
  for (const x of xs) h.add(x);
  // The mean's float sum may differ in the last bit with the order; the buckets may not.
  const { count, p50, p90, p99, max } = h.summary();
  return { count, p50, p90, p99, max };
};

describe('log histogram', () => {
  it('summarises the same samples the same in any order, repeats included', () => {
    const sample = fc.oneof(fc.constantFrom(0, 1e-4, 8.5, 8.5, 17, 1e7), fc.double({ min: 0, max: 1e5, noNaN: true }));
    fc.assert(
      fc.property(fc.array(sample, { minLength: 1, maxLength: 80 }), (xs) => {
        const sorted = [...xs].sort((a, b) => a - b);
        expect(summaryOf(xs)).toEqual(summaryOf(sorted));
        expect(summaryOf([...xs].reverse())).toEqual(summaryOf(sorted));
      }),
      { numRuns: 300 },
    );
  });
});
