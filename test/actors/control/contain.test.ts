// Failure stays with its request: a client side that throws in the middle of a step fails that request alone (with
// `internal`), the rest of the batch finishes, and nothing is left as a fault or a leak (see also request-table.test).
import { describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../actors/control-plane.ts';
import { simulate } from '../../../actors/sim/simulate.ts';
import { poisson, smallScenario } from '../router/sim-helpers.ts';

/** One replica under steady traffic; the client of the first request to reach its third token while two others are
 * live throws from then on. */
function throwingClient() {
  let cp!: ControlPlane;
  let victim = '';
  const delivered = new Map<string, number>();
  const report = simulate(smallScenario({ replicas: 1, traffic: [poisson(40, 20)] }), {
    onStart: (c) => {
      cp = c;
      const submit = c.submit;
      c.submit = (spec, l) =>
        submit(spec, {
          ...l,
          tokens: (id, seq, n, t) => {
            if (!victim && seq >= 2 && c.live() >= 3) victim = id;
            if (id === victim) throw new Error(`the client of ${id} broke`);
            delivered.set(id, seq + n);
            l?.tokens?.(id, seq, n, t);
          },
        });
    },
  });
  return { cp, report, victim, delivered };
}

describe('a client that throws while its tokens are delivered', () => {
  it('fails its request alone with internal, and every other request of its batches finishes', () => {
    const { cp, report, victim, delivered } = throwingClient();
    const records = new Map(cp.collector.records.map((r) => [r.id, r]));
    expect(records.size).toBe(40);
    expect(records.get(victim)).toMatchObject({ outcome: 'failed', code: 'internal' });
    expect(delivered.get(victim)).toBeGreaterThanOrEqual(2);
    const others = [...records.values()].filter((r) => r.id !== victim);
    expect(others.map((r) => r.outcome).filter((o) => o !== 'done')).toEqual([]);
    // Others ran in the same steps as the victim: the failure did not reach them.
    const victimRec = records.get(victim)!;
    expect(others.some((r) => r.firstScheduledAt <= victimRec.finishedAt && r.finishedAt > victimRec.finishedAt)).toBe(
      true,
    );
    expect(report.invariants.violations).toEqual([]);
    expect(cp.runtime.faults).toEqual([]);
    expect(cp.live()).toBe(0);
    // What it held is released: the replica's ledger is empty.
    for (const r of cp.placement.replicas.values()) expect(r.work.stats().blocksUsed).toBe(0);
  });
});
