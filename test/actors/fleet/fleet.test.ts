// The simulated fleet: every request gets one outcome across a node loss, the run is byte-identical per seed, and a
// bad fleet section is refused naming its field.
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { describe, expect, it } from 'vitest';
import { normalizeFleetScenario } from '../../../actors/fleet/config.ts';
import { nodeScenario, simulateFleet } from '../../../actors/fleet/fleet.ts';
import { startFleetNode } from '../../../actors/fleet/node.ts';
import { createVirtualClock } from '../../../runtime/clock.ts';
import { createRng } from '../../../runtime/rng.ts';

const raw = parse(readFileSync('scenarios/fleet-mixed.yaml', 'utf8')) as Record<string, unknown>;
const small = (): ReturnType<typeof normalizeFleetScenario> => {
  const { scenario, fleet } = normalizeFleetScenario(raw);
  return {
    scenario: { ...scenario, traffic: scenario.traffic.map((t) => ({ ...t, requests: Math.ceil(t.requests / 30) })) },
    fleet: { ...fleet, nodeLoss: [{ at: 3, pool: 'large', node: 0 }], rescheduleS: 5 },
  };
};

describe('a simulated fleet', () => {
  it('gives every request one outcome when a node dies, resuming its live requests on the pool', () => {
    const { scenario, fleet } = small();
    const r = simulateFleet(scenario, fleet, { router: 'predicted' });
    const total = scenario.traffic.reduce((a, t) => a + t.requests, 0);
    expect(r.requests.total).toBe(total);
    const ended = Object.entries(r.requests)
      .filter(([k]) => k !== 'total')
      .reduce((a, [, n]) => a + n, 0);
    expect(ended).toBe(total);
    const [loss] = r.lostNode;
    expect(loss?.node).toBe('large-0');
    expect(loss!.live).toBeGreaterThan(0);
    expect(Object.values(loss!.outcomes).reduce((a, n) => a + n, 0)).toBe(loss!.live);
    expect(r.rescheduled).toHaveLength(1);
    expect(r.rescheduled[0]!.readyAtS).toBeGreaterThan(3 + 5);
    // The nodes' invariants held, the lost one's until its pod died.
    expect(r.invariants.violations).toEqual([]);
  }, 120_000);

  it("reports a node's invariant violations by node, and a lost node's only until its pod died", () => {
    const { scenario, fleet } = small();
    const clock = createVirtualClock();
    const n = startFleetNode(
      'large-0',
      'large',
      nodeScenario(scenario, fleet.pools[0]!),
      clock,
      createRng(1),
      () => {},
    );
    n.cp.violations.push('before');
    expect(n.violations()).toEqual(['large-0: before']);
    n.kill();
    n.cp.violations.push('after');
    expect(n.violations()).toEqual(['large-0: before']);
  });

  it('produces the same report, byte for byte, for the same seed under either router', () => {
    const { scenario, fleet } = small();
    for (const router of ['gie-like', 'predicted'] as const) {
      const a = JSON.stringify(simulateFleet(scenario, fleet, { router }));
      expect(JSON.stringify(simulateFleet(scenario, fleet, { router }))).toBe(a);
    }
  }, 240_000);

  it('refuses a fleet section naming the bad field', () => {
    const bad = (fleet: unknown): string => {
      try {
        normalizeFleetScenario({ ...raw, fleet });
        return 'accepted';
      } catch (e) {
        return (e as Error).message;
      }
    };
    const pools = (raw['fleet'] as { pools: unknown[] }).pools;
    expect(bad({ pools: [{ name: 'x', models: ['nope'], nodes: 1 }] })).toMatch(/^fleet\.pools\[0\]\.models\[0\]/);
    expect(bad({ pools, nodeLoss: [{ at: 1, pool: 'large', node: 5 }] })).toMatch(/^fleet\.nodeLoss\[0\]\.node/);
    expect(bad({ pools, router: 'random' })).toMatch(/^fleet\.router/);
    expect(bad({ pools: [pools[0]] })).toMatch(/no pool serves llama-3-8b/);
  });
});
