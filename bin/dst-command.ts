// `npm run dst -- --seeds N --sim-seconds S [--seed K] [--from F] [--workers W] [--mutation M] [--check-determinism D]`:
// deterministic simulation testing over many seeds, in parallel worker processes. Ends with one JSON line.
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { DST_MUTATIONS, runDstSeed, shrinkFaults, type DstMutation, type DstResult } from '../actors/sim/dst.ts';
import { flag, parseOrUsage } from './args.ts';

interface Job {
  seeds: number[];
  simSeconds: number;
  mutation: DstMutation;
}

const USAGE = `usage: npm run dst -- [--seeds N] [--sim-seconds S] [--seed K] [--from F] [--workers W]
                      [--mutation ${DST_MUTATIONS.join('|')}] [--check-determinism D]
`;
const FLAGS = {
  seeds: flag.intOr(100, { min: 1, max: 1_000_000 }),
  'sim-seconds': flag.intOr(60, { min: 1, max: 1_000_000 }),
  seed: flag.int({ min: 0, max: 2 ** 31 - 1 }),
  from: flag.intOr(1, { min: 0, max: 2 ** 31 - 1 }),
  workers: flag.intOr(2, { min: 1, max: 256 }),
  mutation: flag.oneOf<readonly [DstMutation, ...DstMutation[]]>(
    'none',
    ...(DST_MUTATIONS as [DstMutation, ...DstMutation[]]),
  ),
  'check-determinism': flag.intOr(0, { min: 0, max: 1_000_000 }),
  // Set on the child processes this command forks.
  worker: flag.bool(),
};
const args = parseOrUsage('dst', USAGE, process.argv.slice(2), FLAGS, { maxPositionals: 0 });
const self = fileURLToPath(import.meta.url);

function reproduce(seed: number, simSeconds: number, mutation: DstMutation): string {
  return `npm run dst -- --seed ${seed} --sim-seconds ${simSeconds}${mutation === 'none' ? '' : ` --mutation ${mutation}`}`;
}

/** Runs jobs in `workers` child processes; each child runs its seeds and sends back results. */
function runParallel(
  seeds: number[],
  simSeconds: number,
  mutation: DstMutation,
  workers: number,
  onResult: (r: DstResult) => void,
): Promise<void> {
  const chunks: number[][] = Array.from({ length: workers }, () => []);
  seeds.forEach((s, i) => chunks[i % workers]!.push(s));
  return Promise.all(
    chunks
      .filter((c) => c.length > 0)
      .map(
        (chunk) =>
          new Promise<void>((resolve, reject) => {
            const child = fork(self, ['--worker'], {
              execArgv: ['--import', 'tsx'],
              stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
            });
            child.on('message', (m: DstResult | 'done') => (m === 'done' ? undefined : onResult(m)));
            child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`dst worker exited with ${code}`))));
            child.send({ seeds: chunk, simSeconds, mutation } satisfies Job);
          }),
      ),
  ).then(() => undefined);
}

async function main(): Promise<number> {
  if (!args) return 2;
  if (args.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (args.values.worker) {
    process.on('message', (job: Job) => {
      for (const seed of job.seeds)
        process.send!(runDstSeed(seed, { simSeconds: job.simSeconds, mutation: job.mutation }));
      process.exit(0);
    });
    return 0;
  }
  const simSeconds = args.values['sim-seconds'];
  const mutation: DstMutation = args.values.mutation;
  const single = args.values.seed ?? null;
  const { from, seeds: count, workers } = args.values;
  const seeds = single !== null ? [single] : Array.from({ length: count }, (_, i) => from + i);
  const t0 = performance.now();
  const results: DstResult[] = [];
  let done = 0;
  await runParallel(seeds, simSeconds, mutation, Math.min(workers, seeds.length), (r) => {
    results.push(r);
    done++;
    if (r.violations.length > 0 || single !== null || done % 25 === 0 || done === seeds.length) {
      process.stderr.write(
        `[${done}/${seeds.length}] seed ${r.seed} ${r.layout}: ${r.requests} requests, ${r.faults.length} faults${r.permanent ? ' (one permanent)' : ''}, ${r.violations.length} violations\n`,
      );
    }
  });
  results.sort((a, b) => a.seed - b.seed);
  const failing = results.filter((r) => r.violations.length > 0);
  for (const r of failing.slice(0, 5)) {
    console.log(`\nseed ${r.seed} (${r.layout}) violated:`);
    for (const v of r.violations.slice(0, 10)) console.log(`  ${v}`);
    const shrunk = shrinkFaults(r.seed, { simSeconds, mutation }, r.faults);
    console.log(`  shrunk fault schedule (${r.faults.length} -> ${shrunk.length}): ${JSON.stringify(shrunk)}`);
    console.log(`  reproduce: ${reproduce(r.seed, simSeconds, mutation)}`);
  }
  // Determinism: the first D seeds run twice must give identical trace hashes.
  const det = args.values['check-determinism'];
  let nondeterministic = 0;
  if (det > 0) {
    const again: DstResult[] = [];
    await runParallel(
      results.slice(0, det).map((r) => r.seed),
      simSeconds,
      mutation,
      workers,
      (r) => again.push(r),
    );
    for (const r of again) {
      const first = results.find((x) => x.seed === r.seed)!;
      if (first.traceHash !== r.traceHash) {
        nondeterministic++;
        console.log(`seed ${r.seed}: trace hash ${first.traceHash} then ${r.traceHash} (non-deterministic)`);
      }
    }
    console.log(`determinism: ${det} seeds run twice, ${nondeterministic} differed`);
  }
  const outcomes: Record<string, number> = {};
  for (const r of results) for (const [k, v] of Object.entries(r.outcomes)) outcomes[k] = (outcomes[k] ?? 0) + v;
  const faultKinds: Record<string, number> = {};
  for (const r of results) for (const f of r.faults) faultKinds[f.kind] = (faultKinds[f.kind] ?? 0) + 1;
  const violations = failing.reduce((n, r) => n + r.violations.length, 0);
  console.log(
    `\n${results.length} seeds × ${simSeconds} simulated s, ${results.reduce((n, r) => n + r.requests, 0)} requests, faults ${JSON.stringify(faultKinds)}, ${results.filter((r) => r.permanent).length} with a permanent fault`,
  );
  console.log(
    `outcomes ${JSON.stringify(outcomes)}; ${failing.length} failing seeds; wall ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
  console.log(
    JSON.stringify({
      seeds: results.length,
      simulatedSeconds: results.reduce((n, r) => n + r.simulatedSeconds, 0),
      violations,
      failingSeeds: failing.map((r) => r.seed),
      nondeterministic,
      mutation,
    }),
  );
  return violations > 0 || nondeterministic > 0 ? 1 : 0;
}

main().then((code) => {
  if (!process.argv.includes('--worker')) process.exitCode = code;
});
