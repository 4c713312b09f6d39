// The series histogram's exposition is prom-client's own: the same observations, fed to a prom-client Histogram and to
// a SeriesHistogram, give the same /metrics text and the same JSON, whatever the values and label sets.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { Histogram, Registry } from 'prom-client';
import { SeriesHistogram } from '../../api/series-histogram.ts';

const BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

const value = fc.oneof(
  fc.constantFrom(...BUCKETS, 0, 200),
  fc.double({ min: 0, max: 300, noNaN: true }),
  fc.integer({ min: 0, max: 20_000 }),
);

describe('SeriesHistogram', () => {
  it('exposes what prom-client exposes for the same observations', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(fc.constantFrom('llama-3-8b', 'llama-3-70b', 'unknown'), value), { maxLength: 60 }),
        async (obs) => {
          const theirs = new Registry();
          const ours = new Registry();
          const cfg = { name: 'x_seconds', help: 'a latency' };
          const ref = new Histogram({ ...cfg, labelNames: ['model'], buckets: BUCKETS, registers: [theirs] });
          const h = new SeriesHistogram({ ...cfg, label: 'model', buckets: BUCKETS, registers: [ours] });
          for (const [model, v] of obs) {
            ref.observe({ model }, v);
            h.record(h.seriesOf(model), v);
          }
          expect(await ours.metrics()).toBe(await theirs.metrics());
          expect(await ours.getMetricsAsJSON()).toEqual(await theirs.getMetricsAsJSON());
        },
      ),
      { numRuns: 200 },
    );
  });

  it('drops a value that is not finite', async () => {
    const h = new SeriesHistogram({ name: 'y', help: 'h', label: 'model', buckets: [1], registers: [] });
    const s = h.seriesOf('m');
    h.record(s, Number.NaN);
    h.record(s, Number.POSITIVE_INFINITY);
    h.record(s, 0.5);
    expect([s.count, s.sum, s.counts[0]]).toEqual([1, 0.5, 1]);
    const json = await h.get();
    expect(json.values.find((v) => v.metricName === 'y_count')?.value).toBe(1);
  });
});
