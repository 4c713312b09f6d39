// `npm run bench`: runs every benchmark, then writes docs/BENCHMARKS.md with tables and SVG charts beside it.
// `--quick` runs each benchmark in its quick mode (for CI: checks that the report builds). `--only=a,b` runs some.
// The page opens with one row per claim (bench/claims.ts) holding this run's figure. Every run's results (output and
// JSON line) are kept in results.json in the run's directory, printed at the end; `--render <results.json>` writes the
// page again from them without running anything.
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { cpus, totalmem, tmpdir, release } from 'node:os';
import { join } from 'node:path';
import { renderSvg, type ChartSpec } from './charts.ts';
import { chartsFor } from './report-charts.ts';
import { claimsTable, type Figures } from './claims.ts';

/** One benchmark the report runs. */
interface Bench {
  name: string;
  script: string;
  title: string;
  seeds: string;
  /** Arguments of the full run (not of --quick). */
  args?: string[];
}

const BENCHES: Bench[] = [
  { name: 'sim', script: 'bench/sim.ts', title: 'Simulation speed', seeds: '1' },
  { name: 'routing', script: 'bench/routing.ts', title: 'Routing policies and overload', seeds: 'see table' },
  { name: 'batching', script: 'bench/batching.ts', title: 'Batching policies', seeds: 'see table' },
  {
    name: 'placement',
    script: 'bench/placement.ts',
    title: 'Placement, starvation and GPU failure',
    seeds: 'see table',
  },
  { name: 'live', script: 'bench/live.ts', title: 'Live serving overhead', seeds: 'n/a (wall clock)' },
  { name: 'overload', script: 'bench/overload.ts', title: 'Live overload and recovery', seeds: 'n/a (wall clock)' },
  {
    name: 'engine',
    script: 'bench/engine.ts',
    title: 'Real engine: switchyard vs node-llama-cpp batching',
    seeds: '1 (CPU-time clock)',
  },
  {
    name: 'fidelity',
    script: 'bench/fidelity.ts',
    title: 'Simulation fidelity against the real engine (profile calibrated in the run)',
    seeds: '1 (CPU-time clock)',
    args: ['--calibrate'],
  },
  { name: 'fleet', script: 'bench/fleet.ts', title: 'A fleet of nodes behind the cluster router', seeds: '7' },
  { name: 'prefix', script: 'bench/prefix.ts', title: 'Prefix reuse and prefix-aware routing', seeds: '1' },
  {
    name: 'upstream',
    script: 'bench/upstream.ts',
    title: '`engine: openai`: switchyard in front of a model server',
    seeds: 'n/a (wall clock)',
  },
];

const quickMode = process.argv.includes('--quick');
const only = process.argv
  .find((a) => a.startsWith('--only='))
  ?.slice(7)
  .split(',');

interface Result {
  bench: Bench;
  code: number | null;
  seconds: number;
  stdout: string;
  figures: Figures | null;
  data: unknown;
}

/** The arguments a benchmark runs with: --quick in quick mode, else its own. */
const argsOf = (b: Bench, quick: boolean): string[] => (quick ? ['--quick'] : (b.args ?? []));

function runOne(b: Bench, dataFile: string): Promise<Result> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const args = ['--import', 'tsx', b.script, ...argsOf(b, quickMode)];
    const child = spawn(process.execPath, args, {
      env: { ...process.env, BENCH_DATA: dataFile, ...(quickMode ? { BENCH_QUICK: '1' } : {}) },
    });
    let stdout = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) =>
      process.stderr.write(`    ${b.name} | ${d.toString().trimEnd().replace(/\n/g, `\n    ${b.name} | `)}\n`),
    );
    child.on('close', (code) => {
      const lines = stdout.trimEnd().split('\n');
      let figures: Figures | null = null;
      try {
        figures = JSON.parse(lines[lines.length - 1] ?? '') as Figures;
      } catch {
        figures = null;
      }
      const data = existsSync(dataFile) ? (JSON.parse(readFileSync(dataFile, 'utf8')) as unknown) : null;
      resolve({ bench: b, code, seconds: (performance.now() - t0) / 1000, stdout, figures, data });
    });
  });
}

/** What a run of the report keeps: enough to write the page again (`--render`). */
interface Saved {
  started: string;
  quick: boolean;
  machine: string;
  results: Result[];
}

async function runAll(): Promise<Saved> {
  const started = new Date();
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-bench-'));
  const benches = BENCHES.filter((b) => (!only || only.includes(b.name)) && existsSync(b.script));
  const results: Result[] = [];
  for (const [i, b] of benches.entries()) {
    const shown = [b.script, ...argsOf(b, quickMode)].join(' ');
    process.stderr.write(`[${i + 1}/${benches.length}] bench:${b.name} (${shown}) ...\n`);
    const r = await runOne(b, join(dir, `${b.name}.json`));
    process.stderr.write(
      `[${i + 1}/${benches.length}] bench:${b.name} ${r.code === 0 ? 'done' : `FAILED (exit ${r.code})`} in ${r.seconds.toFixed(1)} s\n`,
    );
    results.push(r);
  }
  const cpu = cpus();
  const saved: Saved = {
    started: started.toISOString(),
    quick: quickMode,
    machine: `${cpu.length} × ${cpu[0]?.model ?? 'unknown CPU'}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Linux ${release()}, Node ${process.version}`,
    results,
  };
  const file = join(dir, 'results.json');
  writeFileSync(file, JSON.stringify(saved));
  process.stderr.write(`results kept in ${file} (\`npm run bench -- --render ${file}\` writes the page again)\n`);
  return saved;
}

async function render(saved: Saved, figures: Record<string, Figures | null>): Promise<string[]> {
  const { results, quick } = saved;
  mkdirSync('docs/img', { recursive: true });
  const lines: string[] = [];
  lines.push('# switchyard benchmarks');
  lines.push('');
  lines.push(`Generated by \`npm run bench${quick ? ' -- --quick' : ''}\` on ${saved.started.slice(0, 10)}.`);
  lines.push(
    `Machine: ${saved.machine}. Shared and noisy: compare ratios measured in one run, not absolute times across runs.`,
  );
  if (quick) lines.push('\n**Quick mode**: reduced sizes for CI; the figures are not the headline numbers.');
  lines.push('');
  lines.push('## Claims');
  lines.push('');
  lines.push("Each claim's figure from this run (the closing JSON line of its benchmark, whose full output follows).");
  lines.push('');
  lines.push(...claimsTable(figures));
  lines.push('');
  for (const r of results) {
    const args = argsOf(r.bench, quick);
    lines.push(`## ${r.bench.title}`);
    lines.push('');
    lines.push(
      `Command: \`npm run bench:${r.bench.name}${args.length ? ` -- ${args.join(' ')}` : ''}\` — seeds: ${r.bench.seeds} — ${r.seconds.toFixed(1)} s${r.code === 0 ? '' : ` — **exited with ${r.code}**`}`,
    );
    lines.push('');
    lines.push('```');
    lines.push(r.stdout.trimEnd());
    lines.push('```');
    lines.push('');
    const charts: { file: string; title: string; spec: ChartSpec }[] = r.data ? chartsFor(r.bench.name, r.data) : [];
    for (const c of charts) {
      const file = `bench-${r.bench.name}-${c.file}.svg`;
      writeFileSync(join('docs/img', file), await renderSvg(c.spec));
      lines.push(`![${c.title}](img/${file})`);
      lines.push('');
    }
  }
  return lines;
}

async function main(): Promise<number> {
  const from = process.argv.indexOf('--render');
  const saved = from >= 0 ? (JSON.parse(readFileSync(process.argv[from + 1] ?? '', 'utf8')) as Saved) : await runAll();
  const { results } = saved;
  const figures = Object.fromEntries(results.map((r) => [r.bench.name, r.figures]));
  const lines = await render(saved, figures);
  writeFileSync('docs/BENCHMARKS.md', `${lines.join('\n')}\n`);
  const failed = results.filter((r) => r.code !== 0 || !r.figures).map((r) => r.bench.name);
  process.stderr.write(`wrote docs/BENCHMARKS.md (${results.length} benchmarks, ${failed.length} failed)\n`);
  process.stdout.write(
    `${JSON.stringify({ benchmarks: results.length, failed, seconds: Math.round(results.reduce((a, r) => a + r.seconds, 0)), figures })}\n`,
  );
  return failed.length === 0 ? 0 : 1;
}

main().then((c) => (process.exitCode = c));
