// `npm run modelcheck`: every machine's exploration and the heavier tensor-parallel runs, as a table and one JSON line.
import { machineSpecs } from './alphabets.ts';
import { explore } from './explore.ts';
import { replicaViolations } from './replica-properties.ts';
import { checkTensorParallel, orderDependent, type TpOptions, type TpReport } from './tp-composition.ts';

const quick = process.argv.includes('--quick');

/** One tensor-parallel configuration of the run. */
interface Run {
  name: string;
  options: TpOptions;
}

// One lost message and one early retry, with a fault and a unit of work.
const LOSS = { faults: 1, arrivals: 1, losses: 1, retries: 1 } as const;

const runs: Run[] = quick
  ? [
      { name: 'tp4', options: { gpus: 4, faults: 2, arrivals: 2 } },
      { name: 'tp2-full', options: { gpus: 2, faults: 2, arrivals: 2, downlink: 'fifo', pruneDeadReports: false } },
      { name: 'tp2', options: { gpus: 2, faults: 2, arrivals: 2 } },
      { name: 'tp2-loss-fifo', options: { ...LOSS, gpus: 2, downlink: 'fifo', pruneDeadReports: false } },
      { name: 'tp2-crash', options: { gpus: 2, faults: 1, arrivals: 3, crashes: 1 } },
    ]
  : [
      // The check `npm test` runs: eight ranks, two faults, a drain and three units of work (reaching saturation).
      { name: 'tp8', options: { gpus: 8, faults: 2, arrivals: 3 } },
      // The same at one unit of work, with and without dropping dead reports.
      { name: 'tp8-a1', options: { gpus: 8, faults: 2, arrivals: 1 } },
      { name: 'tp8-a1-full', options: { gpus: 8, faults: 2, arrivals: 1, pruneDeadReports: false } },
      // Four ranks with neither abstraction (per-GPU FIFO commands, every report delivered) against both.
      { name: 'tp4-full', options: { gpus: 4, faults: 2, arrivals: 2, downlink: 'fifo', pruneDeadReports: false } },
      { name: 'tp4', options: { gpus: 4, faults: 2, arrivals: 2 } },
      // A lost assignment, release or answer, made up for by the replica's retries (one may fire at any point).
      { name: 'tp4-loss', options: { ...LOSS, gpus: 4 } },
      { name: 'tp2-loss-fifo', options: { ...LOSS, gpus: 2, downlink: 'fifo', pruneDeadReports: false } },
      // The control plane's handling of progress throws once, at any point a report would be applied.
      { name: 'tp4-crash', options: { gpus: 4, faults: 2, arrivals: 3, crashes: 1 } },
    ];

// Pairs of runs that must reach the same outcomes: the abstraction against the plain model.
const agreements: [string, string][] = quick
  ? [['tp2', 'tp2-full']]
  : [
      ['tp8-a1', 'tp8-a1-full'],
      ['tp4', 'tp4-full'],
    ];

const pad = (v: unknown, n: number): string => String(v).padStart(n);

console.log('machine      states  transitions  declared(s/t)  unreachable(s/t)  dead-ends  trapped     ms');
const machines: Record<string, { statesExplored: number; transitions: number; problems: number }> = {};
let problems = 0;
for (const [name, spec] of Object.entries(machineSpecs)) {
  const t = performance.now();
  const s = spec();
  const r = explore(s);
  // The replica machine's own properties, in every state it reached.
  const broken = name === 'replica' ? replicaViolations(s, r) : [];
  const bad =
    r.unreachableStates.length + r.unreachableTransitions.length + r.deadEnds.length + r.trapped.length + broken.length;
  problems += bad;
  machines[name] = { statesExplored: r.states, transitions: r.transitions, problems: bad };
  console.log(
    `${name.padEnd(10)} ${pad(r.states, 8)} ${pad(r.transitions, 12)} ${pad(`${r.declaredStates}/${r.declaredTransitions}`, 14)} ` +
      `${pad(`${r.unreachableStates.length}/${r.unreachableTransitions.length}`, 17)} ${pad(r.deadEnds.length, 10)} ${pad(r.trapped.length, 8)} ${pad(Math.round(performance.now() - t), 6)}`,
  );
  for (const u of [...r.unreachableStates, ...r.unreachableTransitions]) console.log(`  unreachable: ${u}`);
  for (const v of broken) console.log(`  ${v.property}: ${v.detail}\n    ${v.path.join(' → ')}`);
  for (const k of [...r.deadEnds, ...r.trapped])
    console.log(
      `  stuck: ${k} via ${r
        .pathTo(k)
        .map((e) => e.type)
        .join(' → ')}`,
    );
}

console.log(
  '\nrun              gpus faults arrivals losses crashes downlink prune    states  transitions  at-rest scenarios violations order-dep       ms',
);
const results: Record<string, TpReport> = {};
const rows: Record<string, unknown>[] = [];
for (const { name, options } of runs) {
  const t = performance.now();
  const r = checkTensorParallel(options);
  const ms = Math.round(performance.now() - t);
  results[name] = r;
  const dependent = orderDependent(r).length;
  problems += r.violations.length + dependent;
  const downlink = options.downlink ?? 'eager';
  console.log(
    `${name.padEnd(16)} ${pad(options.gpus, 4)} ${pad(options.faults, 6)} ${pad(options.arrivals, 8)} ${pad(options.losses ?? 0, 6)} ${pad(options.crashes ?? 0, 7)} ${downlink.padEnd(8)} ${((options.pruneDeadReports ?? true) ? 'yes' : 'no').padEnd(5)} ${pad(r.states, 9)} ` +
      `${pad(r.transitions, 12)} ${pad(r.quiescent, 8)} ${pad(r.scenarios, 9)} ${pad(r.violations.length, 10)} ${pad(dependent, 9)} ${pad(ms, 8)}`,
  );
  for (const v of r.violations) console.log(`  ${v.property}: ${v.detail}\n    ${v.path.join(' → ')}`);
  for (const [k, o] of orderDependent(r)) console.log(`  order-dependent ${k}: ${o.join(' | ')}`);
  rows.push({
    name,
    ...options,
    downlink,
    pruneDeadReports: options.pruneDeadReports ?? true,
    statesExplored: r.states,
    transitions: r.transitions,
    atRest: r.quiescent,
    scenarios: r.scenarios,
    violations: r.violations.length,
    orderDependent: dependent,
    ms,
  });
}

// Each abstraction must find what the plain model finds.
const outcomes = (r: TpReport | undefined): string =>
  JSON.stringify([...(r?.outcomes ?? [])].map(([k, v]) => [k, [...v].sort()]).sort());
console.log('');
const agree: Record<string, boolean> = {};
for (const [a, b] of agreements) {
  agree[`${a}=${b}`] = outcomes(results[a]) === outcomes(results[b]);
  if (!agree[`${a}=${b}`]) problems++;
  console.log(`${a} reaches the same outcomes as ${b}: ${agree[`${a}=${b}`] ? 'yes' : 'NO'}`);
}
const abstractionsAgree = Object.values(agree).every(Boolean);
console.log(JSON.stringify({ machines, runs: rows, abstractionsAgree, problems }));
process.exitCode = problems > 0 ? 1 : 0;
