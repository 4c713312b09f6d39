// `switchyard plan <scenario.yaml>`: simulates the candidate placements for the scenario's traffic and targets, prints
// a table per candidate, and says which meet every model's target — or "infeasible" and what must change.
import { plan, type CandidateResult, type PlanProgress, type PlanResult } from '../actors/placement/planner.ts';
import { flag, parseOrUsage } from './args.ts';
import { scenarioOrReport } from './scenario-file.ts';
import { runFleetPlan } from './fleet-command.ts';

const USAGE = 'usage: switchyard plan [--fleet] <scenario.yaml> [--seed N] [--json]\n';
const FLAGS = { seed: flag.int({ min: 0, max: 2 ** 31 - 1 }), json: flag.bool(), fleet: flag.bool() };

/** Runs the plan command; returns the exit code (0 feasible, 3 infeasible, 2 usage or config error). */
export function runPlanCommand(argv: string[]): number {
  const args = parseOrUsage('plan', USAGE, argv, FLAGS, { maxPositionals: 1 });
  if (!args) return 2;
  const file = args.positionals[0];
  if (args.help || !file) {
    process.stderr.write(USAGE);
    return 2;
  }
  if (args.values.fleet)
    return runFleetPlan(file, {
      json: args.values.json,
      ...(args.values.seed !== undefined ? { seed: args.values.seed } : {}),
    });
  let scenario = scenarioOrReport(file);
  if (!scenario) return 2;
  scenario = { ...scenario, seed: args.values.seed ?? scenario.seed };
  const bar = progressBar();
  const result = plan(scenario, bar.update);
  bar.done();
  if (args.values.json) {
    const slim = {
      ...result,
      results: result.results.map((r) => ({
        ...r,
        candidate: { name: r.candidate.name, describe: r.candidate.describe },
        models: r.models.map(({ stretch: _s, ...m }) => m),
      })),
    };
    process.stdout.write(`${JSON.stringify({ ...slim, best: result.best?.candidate.name ?? null })}\n`);
  } else process.stdout.write(formatPlan(scenario.name, result));
  return result.feasible ? 0 : 3;
}

/** The human-readable plan: one table per candidate, a summary, and the verdict. */
export function formatPlan(name: string, r: PlanResult): string {
  const lines: string[] = [];
  lines.push(
    `plan for ${name}: each model must meet its TTFT and TPOT targets for ${r.attainment * 100}% of its requests`,
  );
  const candidates = r.results.filter((x) => !x.candidate.name.startsWith('search:'));
  for (const [i, c] of candidates.entries()) {
    lines.push('');
    lines.push(
      `candidate ${i + 1}/${candidates.length}: ${c.candidate.name} — ${c.candidate.describe} (${c.simulatedS} s simulated)`,
    );
    lines.push(table(c));
  }
  lines.push('');
  lines.push('summary');
  lines.push(
    `  ${'candidate'.padEnd(22)} ${candidates[0]?.models.map((m) => m.model.padStart(14)).join(' ') ?? ''}   verdict`,
  );
  for (const c of candidates) {
    lines.push(
      `  ${c.candidate.name.padEnd(22)} ${c.models.map((m) => `${m.attainment.toFixed(2)}${m.meets ? ' ok' : ' --'}`.padStart(14)).join(' ')}   ${c.feasible ? 'meets every target' : 'misses'}`,
    );
  }
  lines.push('');
  if (r.feasible) {
    const ok = r.results.filter((x) => x.feasible).map((x) => x.candidate.name);
    lines.push(`feasible: ${ok.join(', ')}; best: ${r.best?.candidate.name} (${r.best?.candidate.describe})`);
  } else {
    lines.push(
      `infeasible: no candidate meets both models' targets on ${candidates[0]?.candidate.scenario.node.gpus ?? '?'} GPUs. What must change:`,
    );
    for (const a of r.advice) lines.push(`  - ${a}`);
  }
  return `${lines.join('\n')}\n`;
}

function table(c: CandidateResult): string {
  const head = `  ${'model'.padEnd(14)} ${'requests'.padStart(8)} ${'SLO att.'.padStart(9)} ${'goodput req/s'.padStart(14)} ${'p99 TTFT ms'.padStart(12)} ${'p99 TPOT ms'.padStart(12)} ${'worst wait s'.padStart(13)}  meets`;
  const rows = c.models.map(
    (m) =>
      `  ${m.model.padEnd(14)} ${String(m.requests).padStart(8)} ${m.attainment.toFixed(2).padStart(9)} ${String(m.goodputRps).padStart(14)} ${String(m.p99TtftMs ?? '-').padStart(12)} ${String(m.p99TpotMs ?? '-').padStart(12)} ${String(m.worstWaitS).padStart(13)}  ${m.meets ? 'yes' : 'no'}`,
  );
  return [head, ...rows].join('\n');
}

/** A progress bar on stderr: redrawn in place on a terminal, one line per simulation otherwise. */
function progressBar(): { update(p: PlanProgress): void; done(): void } {
  const tty = process.stderr.isTTY === true;
  let lastLine = '';
  return {
    update: (p) => {
      const width = 30;
      const overall = (p.index - 1 + p.fraction) / Math.max(1, p.total);
      const filled = Math.round(overall * width);
      const line = `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${p.index}/${p.total} ${p.label} ${Math.round(p.fraction * 100)}%`;
      if (tty) process.stderr.write(`\r${line.padEnd(lastLine.length)}`);
      else if (p.fraction === 1) process.stderr.write(`${line}\n`);
      lastLine = line;
    },
    done: () => {
      if (tty) process.stderr.write('\n');
    },
  };
}
