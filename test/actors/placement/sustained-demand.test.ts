// Under `switch`, requests refused for want of a replica are demand only once they keep coming for
// `sustainedDemandMs`: a lone refusal, or a few scattered ones, never start a reservation or a drain.
import { describe, expect, it } from 'vitest';
import { poisson, record, twoModels } from './helpers.ts';

/** Small-model traffic all along; `bigRequests` large-model requests from 5 s at `bigRate`/s, all refused at once
 * (a queue budget far below the large model's load time), so they are demand only as refusals. */
const run = (sustainedDemandMs: number, bigRequests: number, bigRate: number) =>
  record(
    twoModels({
      gpus: 4,
      large: 'llama-3-70b-fp8',
      tp: 4,
      seed: 3,
      placement: { sustainedDemandMs, minResidencyMs: 0, hysteresisMs: 0 },
      largeClass: { maxQueueMs: 50 },
      traffic: [poisson('small', 10, 150), poisson('big', bigRate, bigRequests, 5)],
    }),
  );

const raised = (r: ReturnType<typeof run>): number =>
  r.report.placement.filter((e) => e.kind === 'reservation.raised').length;

describe('sustained demand under switch', () => {
  it('does not reserve or drain for one refused request', () => {
    const r = run(2_000, 1, 1);
    expect(r.records.filter((x) => x.model === 'big').every((x) => x.outcome === 'rejected')).toBe(true);
    expect(raised(r)).toBe(0);
    expect(r.report.placement.some((e) => e.kind === 'drain.started')).toBe(false);
    expect(r.violations).toEqual([]);
  });

  it('reserves once refusals keep coming for the sustained time', () => {
    const r = run(2_000, 12, 4);
    expect(raised(r)).toBeGreaterThan(0);
  });

  it('reserves for one refused request without the sustained rule (what the rule removes)', () => {
    expect(raised(run(0, 1, 1))).toBeGreaterThan(0);
  });
});
