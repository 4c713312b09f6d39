// The fleet planner: how many nodes each pool needs to meet the targets for the traffic, against the cheapest fleet of
// `switch` nodes serving every model; "infeasible", and why, when no size within the limit does.
import type { Scenario } from '../config.ts';
import { evaluate, smallest, type CandidateResult } from '../placement/planner.ts';
import type { FleetSpec } from './config.ts';
import type { RequestRecord } from '../metrics/collector.ts';
import { simulate } from '../sim/simulate.ts';
import { nodeScenario } from './fleet.ts';

/** One pool's size as planned. */
export interface PoolPlan {
  pool: string;
  models: string[];
  placement: 'exclusive' | 'switch';
  /** Nodes needed, or null when even the limit does not meet the targets. */
  nodes: number | null;
  /** The simulated result at that size (or at the limit when infeasible). */
  result: CandidateResult;
}

/** The fleet planner's answer. */
export interface FleetPlan {
  attainment: number;
  limit: number;
  pools: PoolPlan[];
  /** Nodes in all with one pool per mode, or null when a pool is infeasible. */
  dedicatedNodes: number | null;
  /** The cheapest single pool of `switch` nodes serving every model. */
  switchFleet: PoolPlan;
  feasible: boolean;
  /** What the numbers say, one finding per line. */
  findings: string[];
}

/**
 * One node's share of the pool's traffic when the pool has `k` nodes: every stream thinned to 1/k (rates divided,
 * request counts rounded up), as an even-spreading cluster router would give each node.
 */
export function thinTraffic(s: Scenario, k: number): Scenario {
  return {
    ...s,
    name: `${s.name} x${k}`,
    traffic: s.traffic.map((t) => ({
      ...t,
      requests: Math.max(1, Math.ceil(t.requests / k)),
      arrival: {
        ...t.arrival,
        ...(t.arrival.rate !== undefined ? { rate: t.arrival.rate / k } : {}),
        ...(t.arrival.process === 'trace' ? { timeScale: (t.arrival.timeScale ?? 1) / k } : {}),
      },
    })),
  };
}

/** Sizes one pool: the smallest node count (from its configured size, doubling then bisecting) that meets targets. */
function sizePool(base: Scenario, pool: FleetSpec['pools'][number], limit: number): PoolPlan {
  const attainment = base.planner.attainment;
  const node = nodeScenario(base, pool);
  const results = new Map<number, CandidateResult>();
  const run = (k: number): CandidateResult => {
    let r = results.get(k);
    if (!r) {
      r = evaluate({ name: `${pool.name} x${k}`, describe: `${k} nodes`, scenario: thinTraffic(node, k) }, attainment);
      results.set(k, r);
    }
    return r;
  };
  const nodes = smallest(Math.max(1, pool.nodes), limit, (k) => run(k).feasible);
  return { pool: pool.name, models: pool.models, placement: pool.placement, nodes, result: run(nodes ?? limit) };
}

/** Plans the fleet's pools, and the single-pool `switch` alternative, for the scenario's traffic and targets. */
export function planFleet(base: Scenario, fleet: FleetSpec): FleetPlan {
  const limit = fleet.maxNodesPerPool;
  const pools = fleet.pools.map((p) => sizePool(base, p, limit));
  const all = base.models.map((m) => m.name);
  const switchFleet = sizePool(base, { name: 'switch', models: all, nodes: 1, placement: 'switch' }, limit);
  const dedicated = pools.every((p) => p.nodes !== null) ? pools.reduce((a, p) => a + p.nodes!, 0) : null;
  const findings: string[] = [];
  for (const p of pools) {
    if (p.nodes !== null) findings.push(`pool ${p.pool} (${p.models.join(', ')}): ${p.nodes} node(s)`);
    else {
      const miss = p.result.models.filter((m) => !m.meets).map((m) => `${m.model} at ${m.attainment * 100}%`);
      findings.push(
        `pool ${p.pool}: infeasible within ${limit} nodes: at ${limit} nodes ${miss.join(', ')} of requests meet ` +
          `their targets (needs ${base.planner.attainment * 100}%); when even an unloaded node misses, the targets ` +
          'are below what one replica can do: relax them or use a faster variant',
      );
    }
  }
  if (switchFleet.nodes !== null)
    findings.push(`one switch pool serving ${all.join(' + ')}: ${switchFleet.nodes} node(s)`);
  else findings.push(`one switch pool serving ${all.join(' + ')}: infeasible within ${limit} nodes`);
  if (dedicated !== null && switchFleet.nodes !== null) {
    const d = switchFleet.nodes - dedicated;
    findings.push(
      d > 0
        ? `dedicated pools need ${d} node(s) fewer than the switch fleet`
        : d < 0
          ? `the switch fleet needs ${-d} node(s) fewer than dedicated pools`
          : 'dedicated pools and the switch fleet need the same number of nodes',
    );
  }
  return {
    attainment: base.planner.attainment,
    limit,
    pools,
    dedicatedNodes: dedicated,
    switchFleet,
    feasible: dedicated !== null,
    findings,
  };
}

/**
 * A node's saturated throughput for one model of a pool (completed requests per simulated second): the pool's node
 * given `requests` of that model's traffic at once (arrivals far faster than any node serves), so its replicas run
 * full until the queue is gone. The rate is taken between the 10th and the 90th percentile of completion times, so the
 * ramp-up and the tail (a few long requests finishing alone) do not count; admission still refuses what would expire.
 */
export function nodeCapacity(
  base: Scenario,
  pool: FleetSpec['pools'][number],
  model: string,
  requests: number,
): number {
  const node = nodeScenario(base, pool);
  const traffic = node.traffic
    .filter((t) => t.model === model)
    .slice(0, 1)
    .map((t) => ({ ...t, requests, arrival: { process: 'poisson' as const, rate: 10_000 } }));
  if (traffic.length === 0) throw new Error(`pool ${pool.name} has no traffic for ${model}`);
  let records: readonly RequestRecord[] = [];
  simulate(
    { ...node, name: `${node.name} capacity`, traffic },
    {
      onStart: (cp) => {
        records = cp.collector.records;
      },
    },
  );
  const finished = records.filter((r) => r.outcome === 'done').map((r) => r.finishedAt);
  finished.sort((a, b) => a - b);
  if (finished.length < 10) return 0;
  const lo = Math.floor(finished.length * 0.1);
  const hi = Math.floor(finished.length * 0.9);
  const spanS = (finished[hi]! - finished[lo]!) / 1000;
  return spanS > 0 ? Math.round(((hi - lo) / spanS) * 1000) / 1000 : 0;
}
