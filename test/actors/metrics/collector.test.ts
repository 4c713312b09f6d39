// The collector counts times between tokens in runs of equal samples (a step's sequences share one); the summaries
// must be exactly those of one add per token, mean included, per model and over all models.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createCollector } from '../../../actors/metrics/collector.ts';
import { createLogHistogram, type LogHistogram } from '../../../actors/metrics/histogram.ts';

describe('collector time between tokens', () => {
  it('summarises runs of samples exactly as one add per sample, models interleaved', () => {
    const sample = fc.record({
      model: fc.constantFrom('a', 'b'),
      ms: fc.oneof(fc.constantFrom(0.1, 8.53, 8.53, 17.25), fc.double({ min: 0, max: 500, noNaN: true })),
      repeat: fc.integer({ min: 1, max: 6 }),
    });
    fc.assert(
      fc.property(fc.array(sample, { minLength: 1, maxLength: 60 }), (xs) => {
        const c = createCollector();
        const per = new Map<string, LogHistogram>();
        const all = createLogHistogram();
        for (const { model, ms, repeat } of xs)
          for (let i = 0; i < repeat; i++) {
            c.tbt(model, ms);
            if (!per.has(model)) per.set(model, createLogHistogram());
            per.get(model)!.add(ms);
            all.add(ms);
          }
        expect(c.latency().tbtMs).toEqual(all.summary());
        for (const [m, h] of per) expect(c.latency(m).tbtMs).toEqual(h.summary());
        // Read in the middle of a run, then go on: nothing is lost or counted twice.
        c.tbt('a', 1.5);
        all.add(1.5);
        expect(c.latency().tbtMs).toEqual(all.summary());
        c.tbt('a', 1.5);
        all.add(1.5);
        expect(c.latency().tbtMs).toEqual(all.summary());
      }),
      { numRuns: 200 },
    );
  });
});
