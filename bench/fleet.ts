// bench:fleet — a fleet of 4 nodes (2 large, 2 small) × 8 GPUs behind the cluster router, mixed traffic, one large
// node lost mid-run; both router policies (GIE-like scraped gauges vs switchyard's predicted completion) on the same
// seed; and the fleet planner's pool sizes for the mixed-infeasible traffic. The speed figure is taken after a
// shorter warm-up run of the same fleet (printed, with its own rate). Ends with one JSON line.
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { normalizeFleetScenario } from '../actors/fleet/config.ts';
import { simulateFleet, type FleetReport } from '../actors/fleet/fleet.ts';
import { nodeCapacity, planFleet } from '../actors/fleet/plan.ts';
import { FLEET_ROUTER_POLICIES } from '../actors/fleet/router.ts';
import { printFigures, quick } from './lib/data.ts';

const FLEET_FILE = 'scenarios/fleet-mixed.yaml';
/** The share of the fleet's capacity the bench offers. */
const LOAD = 0.8;
// Simulated seconds of traffic: the quick (CI) run keeps every part over a shorter window.
const DURATION_S = quick ? 5 : 120;
/** Requests per model in the burst that measures one node's saturated throughput. */
const CAPACITY_REQUESTS = quick ? 1500 : 3000;

function load(file: string, fleetSection?: unknown) {
  const raw = parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  return normalizeFleetScenario(fleetSection ? { ...raw, fleet: fleetSection } : raw);
}

const { scenario, fleet } = load(FLEET_FILE);
// The fleet's capacity per model: a node of the first pool serving it, saturated, times the nodes serving it.
const capacity: Record<string, { perNode: number; nodes: number; fleetRps: number; offeredRps: number }> = {};
for (const m of scenario.models) {
  const pools = fleet.pools.filter((p) => p.models.includes(m.name));
  const perNode = nodeCapacity(scenario, pools[0]!, m.name, CAPACITY_REQUESTS);
  const nodes = pools.reduce((a, p) => a + p.nodes, 0);
  const fleetRps = perNode * nodes;
  capacity[m.name] = { perNode, nodes, fleetRps, offeredRps: Math.round(LOAD * fleetRps * 1000) / 1000 };
}
const scaled = {
  ...scenario,
  traffic: scenario.traffic.map((t) => {
    const rate = capacity[t.model]!.offeredRps;
    return { ...t, requests: Math.max(1, Math.round(rate * DURATION_S)), arrival: { ...t.arrival, rate } };
  }),
};
// The node loss moves to mid-run.
const scaledFleet = { ...fleet, nodeLoss: fleet.nodeLoss.map((l) => ({ ...l, at: DURATION_S / 2 })) };
console.log(
  `bench:fleet — ${FLEET_FILE}: ${fleet.pools.map((p) => `${p.nodes} × ${p.name}`).join(', ')}, ` +
    `${scaled.traffic.reduce((a, t) => a + t.requests, 0)} requests over ${DURATION_S} s at ${LOAD * 100}% of ` +
    `capacity, node loss ${JSON.stringify(scaledFleet.nodeLoss)}`,
);
for (const [model, c] of Object.entries(capacity))
  console.log(
    `  ${model}: one node saturated completes ${c.perNode} req/s; ${c.nodes} nodes → ${c.fleetRps.toFixed(1)} req/s; ` +
      `offered ${c.offeredRps} req/s`,
  );

// Warm the JIT first, as bench:sim does: the same fleet and traffic over a shorter window, each policy once (V8 is
// still compiling through the first several thousand requests). Timed, but not in the figure; printed beside it.
const WARM_S = quick ? 2 : 10;
const warmScale = WARM_S / DURATION_S;
const warm = {
  scenario: {
    ...scaled,
    traffic: scaled.traffic.map((t) => ({ ...t, requests: Math.max(1, Math.round(t.requests * warmScale)) })),
  },
  fleet: { ...scaledFleet, nodeLoss: scaledFleet.nodeLoss.map((l) => ({ ...l, at: WARM_S / 2 })) },
};
const warmT0 = performance.now();
let warmRequests = 0;
for (const router of FLEET_ROUTER_POLICIES)
  warmRequests += simulateFleet(warm.scenario, warm.fleet, { router }).sim.requests;
const warmWallS = (performance.now() - warmT0) / 1000;
console.log(
  `warm-up (not in the figure): ${warmRequests} requests over ${WARM_S} s per policy in ${warmWallS.toFixed(1)} s wall ` +
    `(${Math.round(warmRequests / warmWallS)} sim req / wall s)`,
);

const runs: Record<string, { report: FleetReport; wallS: number }> = {};
for (const router of FLEET_ROUTER_POLICIES) {
  const t0 = performance.now();
  const report = simulateFleet(scaled, scaledFleet, { router });
  runs[router] = { report, wallS: (performance.now() - t0) / 1000 };
}
console.log('\nrouter      model          done   other   p50 TTFT   p99 TTFT   p99 TPOT   sim req / wall s');
for (const [router, { report, wallS }] of Object.entries(runs)) {
  for (const [model, m] of Object.entries(report.models)) {
    const other = (m.requests.total ?? 0) - (m.requests['done'] ?? 0);
    console.log(
      `${router.padEnd(11)} ${model.padEnd(13)} ${String(m.requests['done'] ?? 0).padStart(5)} ${String(other).padStart(7)} ` +
        `${m.ttftMs.p50.toFixed(0).padStart(8)} ms ${m.ttftMs.p99.toFixed(0).padStart(7)} ms ` +
        `${m.tpotMs.p99.toFixed(1).padStart(7)} ms ${(report.sim.requests / wallS).toFixed(0).padStart(10)}`,
    );
  }
}
console.log('\nlost node: requests live on it when its pod died, by final outcome');
for (const [router, { report }] of Object.entries(runs))
  for (const l of report.lostNode)
    console.log(
      `${router.padEnd(11)} ${l.node} at ${l.at.toFixed(1)} s: ${l.live} live, ${l.resumed} resumed elsewhere, ` +
        `outcomes ${JSON.stringify(l.outcomes)}; replacement ready at ${JSON.stringify(report.rescheduled)}`,
    );

// The planner on the mixed-infeasible traffic: one node cannot meet both models' targets; how many does a fleet need?
const infeasible = load('scenarios/mixed-infeasible.yaml', {
  maxNodesPerPool: 8,
  pools: [
    { name: 'large', models: ['llama-3-70b'], nodes: 1 },
    { name: 'small', models: ['llama-3-8b'], nodes: 1 },
  ],
});
const planScenario = quick
  ? {
      ...infeasible.scenario,
      traffic: infeasible.scenario.traffic.map((t) => ({ ...t, requests: Math.max(20, Math.round(t.requests / 4)) })),
    }
  : infeasible.scenario;
const t0 = performance.now();
const plan = planFleet(planScenario, infeasible.fleet);
console.log(`\nfleet plan for mixed-infeasible traffic (${((performance.now() - t0) / 1000).toFixed(1)} s):`);
for (const f of plan.findings) console.log(`  ${f}`);

const p99 = (router: string): Record<string, number> =>
  Object.fromEntries(Object.entries(runs[router]!.report.models).map(([m, r]) => [m, r.ttftMs.p99]));
const simulated = Object.values(runs).reduce((a, r) => a + r.report.sim.requests, 0);
const wall = Object.values(runs).reduce((a, r) => a + r.wallS, 0);
printFigures({
  p99TtftMs: { gieLike: p99('gie-like'), predicted: p99('predicted') },
  lostNodeOutcomes: Object.fromEntries(
    Object.entries(runs).map(([router, { report }]) => [router, report.lostNode.map((l) => l.outcomes)]),
  ),
  plannedNodes: {
    ...Object.fromEntries(plan.pools.map((p) => [p.pool, p.nodes])),
    switchFleet: plan.switchFleet.nodes,
  },
  offeredRps: Object.fromEntries(Object.entries(capacity).map(([m, c]) => [m, c.offeredRps])),
  fleetSimRequestsPerWallS: Math.round(simulated / wall),
  warmupSimRequestsPerWallS: Math.round(warmRequests / warmWallS),
  invariantViolations: Object.fromEntries(
    Object.entries(runs).map(([router, { report }]) => [router, report.invariants.violations.length]),
  ),
  quick,
});
