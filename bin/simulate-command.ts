// `switchyard simulate`: runs a scenario and prints a table, or one JSON report with --json.
import { simulate, type SimReport } from '../actors/sim/simulate.ts';
import { flag, parseOrUsage } from './args.ts';
import { scenarioOrReport } from './scenario-file.ts';
import { runFleetSimulate } from './fleet-command.ts';
import { formatTraces } from '../actors/router/explain.ts';
import { startRecording, writeRecording, type Recorder } from '../inspector/record.ts';
import type { ControlPlane } from '../actors/control-plane.ts';

const USAGE =
  'usage: switchyard simulate <scenario.yaml> [--seed N] [--json] [--wall] [--explain req.N] [--trace out.json]\n' +
  '  [--wire-check]    every frame crosses the codec (no envelope arrays; same report)\n' +
  '  [--step-by-step]  --wire-check, and every request event through the interpreted machine (the reference run)\n' +
  '       switchyard simulate --fleet <fleet-scenario.yaml> [--seed N] [--router gie-like|predicted] [--json] [--wall]\n' +
  '         [--step-by-step]  the reference fleet run (tokens counted one by one at the edge; same report)\n';

const FLAGS = {
  seed: flag.int({ min: 0, max: 2 ** 31 - 1 }),
  explain: flag.str(),
  trace: flag.str(),
  json: flag.bool(),
  wall: flag.bool(),
  'wire-check': flag.bool(),
  'step-by-step': flag.bool(),
  fleet: flag.bool(),
  router: flag.str(),
};

/** Runs the simulate command; returns the exit code. */
export function runSimulateCommand(argv: string[]): number {
  const args = parseOrUsage('simulate', USAGE, argv, FLAGS, { maxPositionals: 1 });
  if (!args) return 2;
  if (args.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const file = args.positionals[0];
  if (!file) {
    process.stderr.write(USAGE);
    return 2;
  }
  if (args.values.fleet) return fleetSimulate(file, args.values);
  if (args.values.router !== undefined) {
    process.stderr.write(`switchyard simulate: --router applies to --fleet runs only\n${USAGE}`);
    return 2;
  }
  const scenario = scenarioOrReport(file);
  if (!scenario) return 2;
  const seed = args.values.seed ?? scenario.seed;
  const explain = args.values.explain !== undefined ? [args.values.explain] : [];
  const t0 = performance.now();
  const trace = args.values.trace;
  let recorder: Recorder | null = null;
  const report = simulate(scenario, {
    seed,
    wall: args.values.wall,
    wireCheck: args.values['wire-check'] === true,
    stepByStep: args.values['step-by-step'] === true,
    explain,
    ...(typeof trace === 'string' ? { onStart: (cp: ControlPlane) => (recorder = startRecording(cp, { seed })) } : {}),
  });
  if (typeof trace === 'string' && recorder) {
    const rec = (recorder as Recorder).finish();
    writeRecording(trace, rec);
    process.stderr.write(`recorded ${rec.frames.length} inspection frames (${rec.dropped} dropped) to ${trace}\n`);
  }
  const wall = (performance.now() - t0) / 1000;
  process.stderr.write(
    `simulated ${report.sim.requests} requests, ${report.sim.simulatedSeconds} s in ${wall.toFixed(2)} s wall\n`,
  );
  if (args.values.json) process.stdout.write(`${JSON.stringify(report)}\n`);
  else process.stdout.write(formatReport(report));
  return report.invariants.violations.length > 0 ? 1 : 0;
}

function fleetSimulate(
  file: string,
  v: {
    seed: number | undefined;
    router: string | undefined;
    json: boolean;
    wall: boolean;
    explain?: string;
    'step-by-step'?: boolean;
  },
): number {
  if (v.router !== undefined && v.router !== 'gie-like' && v.router !== 'predicted') {
    process.stderr.write(`switchyard simulate: --router: expected gie-like or predicted, got "${v.router}"\n${USAGE}`);
    return 2;
  }
  if (v.explain !== undefined) {
    process.stderr.write(`switchyard simulate: --explain applies to single-node runs only\n${USAGE}`);
    return 2;
  }
  return runFleetSimulate(file, {
    ...(v.seed !== undefined ? { seed: v.seed } : {}),
    ...(v.router !== undefined ? { router: v.router } : {}),
    json: v.json,
    wall: v.wall,
    stepByStep: v['step-by-step'] === true,
  });
}

/** A human-readable table of a report. */
export function formatReport(r: SimReport): string {
  const lines: string[] = [];
  lines.push(`scenario ${r.scenario}  seed ${r.seed}  simulated ${r.sim.simulatedSeconds} s`);
  lines.push(
    `requests ${Object.entries(r.requests)
      .map(([k, v]) => `${k}=${v}`)
      .join('  ')}`,
  );
  lines.push(`throughput ${r.throughput.requestsPerS} req/s, ${r.throughput.outputTokensPerS} output tok/s`);
  lines.push('');
  lines.push('metric            p50        p90        p99        max');
  for (const [name, s] of [
    ['TTFT ms', r.ttftMs],
    ['TPOT ms', r.tpotMs],
    ['TBT ms', r.tbtMs],
    ['e2e ms', r.e2eMs],
    ['queue wait ms', r.queueWaitMs],
  ] as const) {
    lines.push(`${name.padEnd(14)} ${[s.p50, s.p90, s.p99, s.max].map((x) => String(x).padStart(10)).join(' ')}`);
  }
  lines.push('');
  lines.push(`batch mean size ${r.batch.meanSize} over ${r.batch.steps} steps, ${r.batch.preemptions} preemptions`);
  if (r.prefix)
    lines.push(
      `prefix cache: hit rate ${(r.prefix.hitRate * 100).toFixed(1)}% (${r.prefix.cachedTokens} of ${r.prefix.promptTokens} prompt tokens over ${r.prefix.requests} requests): ${r.prefix.cachedTokens} prefill tokens saved`,
    );
  lines.push(`gpu utilisation ${r.gpus.utilisation.map((u) => `${Math.round(u * 100)}%`).join(' ')}`);
  lines.push(
    `invariants: ${r.invariants.violations.length} violations, ${r.invariants.overBudget} over budget, ${r.invariants.withoutOneOutcome} without an outcome`,
  );
  for (const [id, traces] of Object.entries(r.explain ?? {})) lines.push('', formatTraces(id, traces).trimEnd());
  return `${lines.join('\n')}\n`;
}
