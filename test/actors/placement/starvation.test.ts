import { describe, expect, it } from 'vitest';
import { costOf, loadMsOf, rolesOf, UNLOAD_MS } from '../../../actors/placement/layout.ts';
import { poisson, record, twoModels, waitsS } from './helpers.ts';

// Four GPUs keep the test quick: the FP8 large model as a TP-4 gang, four small replicas kept busy all along.
const scenario = (reserved: boolean) =>
  twoModels({
    gpus: 4,
    large: 'llama-3-70b-fp8',
    tp: 4,
    seed: 4,
    placement: { largeWaitReservation: reserved },
    traffic: [poisson('small', 40, 2400), poisson('big', 1, 1, 5), poisson('big', 1, 1, 30)],
  });

describe('anti-starvation', () => {
  const reserved = record(scenario(true));
  const naive = record(scenario(false));
  const s = scenario(true);
  const large = rolesOf(s.models).large!;
  const boundS =
    (s.placement.drainDeadlineMs +
      UNLOAD_MS +
      loadMsOf(s, large) +
      costOf(s, large).prefillS(large.batching.tokenBudget, 0) * 1000) /
    1000;

  it('bounds the large model’s wait by drain deadline + unload + load + one step under small traffic at capacity', () => {
    const w = waitsS(reserved, 'big');
    expect(w.length).toBe(2);
    expect(Math.max(...w)).toBeLessThanOrEqual(boundS);
    expect(reserved.records.filter((r) => r.model === 'big').every((r) => r.outcome === 'done')).toBe(true);
  });

  it('bounds the small model’s wait the same way while the node is in large mode', () => {
    const smallBoundS = (s.placement.drainDeadlineMs + UNLOAD_MS + loadMsOf(s, s.models[1]!)) / 1000 + 1;
    expect(Math.max(...waitsS(reserved, 'small'))).toBeLessThanOrEqual(smallBoundS);
  });

  it('shows the naive policy (switch only when idle) starving the large model until the small traffic ends', () => {
    const w = waitsS(naive, 'big');
    expect(Math.max(...w)).toBeGreaterThan(boundS);
    // The first request waits for the end of the small traffic, not for any bound.
    const lastSmall = Math.max(...naive.records.filter((r) => r.model === 'small').map((r) => r.receivedAt));
    const first = naive.records.find((r) => r.model === 'big')!;
    expect(first.firstScheduledAt).toBeGreaterThan(lastSmall);
  });

  it('never gives a GPU to two replicas under either policy', () => {
    expect(reserved.violations).toEqual([]);
    expect(naive.violations).toEqual([]);
    expect(reserved.report.invariants.withoutOneOutcome + naive.report.invariants.withoutOneOutcome).toBe(0);
  });
});
