// `simulate --fleet` and `plan --fleet`: a scenario with a `fleet:` section (pools of 8-GPU nodes behind a cluster
// router) simulated as a fleet, or sized by the fleet planner. Tables by default, one JSON line with --json.
import { ConfigError } from '../actors/config.ts';
import { loadFleetScenario, type FleetSpec } from '../actors/fleet/config.ts';
import { simulateFleet, type FleetReport } from '../actors/fleet/fleet.ts';
import { planFleet } from '../actors/fleet/plan.ts';
import type { FleetRouterPolicy } from '../actors/fleet/router.ts';
import type { Scenario } from '../actors/config.ts';

/** Loads a fleet scenario, or writes why it is invalid to stderr and returns null. */
function fleetOrReport(file: string): { scenario: Scenario; fleet: FleetSpec } | null {
  try {
    return loadFleetScenario(file);
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`switchyard: invalid fleet scenario ${file}: ${e.message}\n`);
      return null;
    }
    throw e;
  }
}

/** `simulate --fleet`: exit 0, or 2 on a bad file. */
export function runFleetSimulate(
  file: string,
  o: { seed?: number; router?: FleetRouterPolicy; json: boolean; wall: boolean; stepByStep?: boolean },
): number {
  const loaded = fleetOrReport(file);
  if (!loaded) return 2;
  const t0 = performance.now();
  const report = simulateFleet(loaded.scenario, loaded.fleet, {
    ...(o.seed !== undefined ? { seed: o.seed } : {}),
    ...(o.router ? { router: o.router } : {}),
    wall: o.wall,
    stepByStep: o.stepByStep === true,
  });
  const wall = (performance.now() - t0) / 1000;
  process.stderr.write(
    `simulated a fleet: ${report.sim.requests} requests, ${report.sim.simulatedSeconds} s in ${wall.toFixed(2)} s wall\n`,
  );
  process.stdout.write(o.json ? `${JSON.stringify(report)}\n` : formatFleetReport(report));
  return 0;
}

/** A fleet report as a table: pools, each model's outcomes and latency, the lost nodes and their replacements. */
export function formatFleetReport(r: FleetReport): string {
  const lines = [`fleet ${r.scenario}  seed ${r.seed}  router ${r.router}  simulated ${r.sim.simulatedSeconds} s`];
  for (const [name, p] of Object.entries(r.pools)) lines.push(`pool ${name}: ${p.nodes} node(s) serving ${p.models}`);
  lines.push(
    `requests ${Object.entries(r.requests)
      .map(([k, v]) => `${k}=${v}`)
      .join('  ')}`,
    '',
  );
  lines.push('model            done  other  p50 TTFT ms  p99 TTFT ms  p99 TPOT ms');
  for (const [model, m] of Object.entries(r.models)) {
    const done = m.requests['done'] ?? 0;
    const other = (m.requests['total'] ?? 0) - done;
    lines.push(
      `${model.padEnd(14)} ${String(done).padStart(6)} ${String(other).padStart(6)} ` +
        `${m.ttftMs.p50.toFixed(0).padStart(12)} ${m.ttftMs.p99.toFixed(0).padStart(12)} ${m.tpotMs.p99.toFixed(1).padStart(12)}`,
    );
  }
  for (const l of r.lostNode)
    lines.push(
      '',
      `node ${l.node} lost at ${l.at.toFixed(1)} s: ${l.live} requests live, ${l.resumed} resumed on another node; ` +
        `final outcomes ${JSON.stringify(l.outcomes)}`,
    );
  for (const n of r.rescheduled)
    lines.push(`replacement ${n.node}: ${n.readyAtS === null ? 'not ready by the end' : `ready at ${n.readyAtS} s`}`);
  const v = r.invariants.violations;
  lines.push('', `invariant violations: ${v.length}`, ...v.slice(0, 20).map((x) => `  ${x}`));
  return `${lines.join('\n')}\n`;
}

/** `plan --fleet`: exit 0 when every pool is sized within the limit, 3 when one is infeasible, 2 on a bad file. */
export function runFleetPlan(file: string, o: { seed?: number; json: boolean }): number {
  const loaded = fleetOrReport(file);
  if (!loaded) return 2;
  const scenario = o.seed !== undefined ? { ...loaded.scenario, seed: o.seed } : loaded.scenario;
  const plan = planFleet(scenario, loaded.fleet);
  if (o.json) {
    const slim = (p: (typeof plan.pools)[number]) => ({
      pool: p.pool,
      models: p.models,
      placement: p.placement,
      nodes: p.nodes,
      attainment: Object.fromEntries(p.result.models.map((m) => [m.model, m.attainment])),
    });
    process.stdout.write(
      `${JSON.stringify({
        attainment: plan.attainment,
        limit: plan.limit,
        feasible: plan.feasible,
        dedicatedNodes: plan.dedicatedNodes,
        pools: plan.pools.map(slim),
        switchFleet: slim(plan.switchFleet),
        findings: plan.findings,
      })}\n`,
    );
  } else {
    process.stdout.write(
      `fleet plan for ${scenario.name}: each model must meet its targets for ${plan.attainment * 100}% of requests ` +
        `(at most ${plan.limit} nodes per pool)\n${plan.findings.map((f) => `  ${f}`).join('\n')}\n` +
        `${plan.feasible ? `feasible: ${plan.dedicatedNodes} node(s) in dedicated pools` : 'infeasible'}\n`,
    );
  }
  return plan.feasible ? 0 : 3;
}
