// `npm run bench:fidelity`: one request stream served live on the real llama.cpp engine through switchyard's batcher,
// and simulated (`simulate()` on the same config, the calibrated profile giving every step time), side by
// side as simulated ÷ measured. Also compares each live step with the profile's prediction for its shape, so a miss
// can be told apart: step-time model (calibration) or live overheads between steps.
//
// Usage: tsx bench/fidelity.ts [--quick] [--requests N] [--time-scale X] [--clock cpu|wall] [--config file.yaml]
//                             [--profile file.json] [--calibrate] [--dump steps.json]
// The profile is the config's (bench/profiles/bench.json, which `switchyard calibrate --config bench/engine.yaml`
// writes), or the one `--profile` names (a profile from another machine, build or thread count). The live steps
// judge it as serve judges a stored profile (actors/profile-fit.ts): when it does not fit, the bench prints serve's
// line saying so, and its verdict and predicted ÷ measured step time go into the final JSON line. `--dump` writes
// every live step (shape, CPU and wall ms) and the run's calibration samples, for looking at the step model by shape.
// With --calibrate the bench calibrates on the live run's own engine (same threads, cache and batch), half the
// repetitions just before the live run and half just after, and simulates with that profile instead, so both sides
// see the same machine on average over the run; the stored profile's prediction of the live steps is printed too.
// Why it matters (see actors/engine/README.md, "Fidelity"): a step's CPU time on this shared machine moves by several
// % with the other tenants' load, and at this load (time scale 2, near saturation) queueing multiplies a step-time
// error 2-3x in the latency percentiles; with --quick's 40 requests the TPOT p50 also sits between the clusters
// of requests that did and did not share a step with a prefill chunk, so it jumps by 20 % for a 2 % step-time change.
// The live side runs in process (batcher + engine, no server), on the cpu clock by default
// (see bench/lib/engine-serve.ts).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { applyCalibrations } from '../actors/calibration.ts';
import { loadScenario } from '../actors/config.ts';
import {
  DEFAULT_GRID,
  engineOrigin,
  fitProfile,
  gridFor,
  measureGrid,
  timingFor,
  type CalibrationSample,
} from '../actors/engine/calibrate.ts';
import { loadLlamaEngine } from '../actors/engine/llama-engine.ts';
import {
  describeOrigin,
  engineProfileAt,
  originDifferences,
  profileOrigin,
  profileStepS,
  type EngineProfile,
} from '../actors/gpu/profile-cost-model.ts';
import { createProfileFits, type ProfileFit } from '../actors/profile-fit.ts';
import type { EngineSpec } from '../actors/worker/engines.ts';
import { simulate } from '../actors/sim/simulate.ts';
import { printFigures, quick, writeChartData } from './lib/data.ts';
import {
  createBenchClock,
  figuresOf,
  limitsForEngine,
  scenarioRequests,
  serveWithSwitchyard,
} from './lib/engine-serve.ts';

const argv = process.argv.slice(2);
const opt = (name: string): string | undefined => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const configFile = opt('config') ?? 'bench/engine.yaml';
const clockKind = (opt('clock') ?? 'cpu') as 'cpu' | 'wall';
const useStored = !argv.includes('--calibrate');
const load = (): string => execFileSync('uptime', { encoding: 'utf8' }).trim();

const profileFile = opt('profile');
const scenario = loadScenario(configFile, { calibrations: profileFile === undefined });
if (profileFile !== undefined) {
  scenario.models[0]!.calibration = resolve(profileFile);
  applyCalibrations(scenario, dirname(configFile));
}
// A config named with --config brings its own stream (its requests and time scale: bench/engine-100m.yaml's 200 at
// 0.4); the bench model's default is 300 at time scale 2: the busiest load at which the simulated router admits
// every request of the 300 (at 3 it sheds 7, at 16 it sheds 134 with `overloaded` for want of KV headroom), so both
// sides serve the same requests.
const ownStream = opt('config') !== undefined;
const traffic = scenario.traffic[0]!;
traffic.requests = Number(opt('requests') ?? (quick ? 40 : ownStream ? traffic.requests : 300));
traffic.arrival.timeScale = Number(opt('time-scale') ?? (ownStream ? (traffic.arrival.timeScale ?? 1) : 2));
const model = scenario.models[0]!;
const storedFile = model.calibration!;
const stored = engineProfileAt(storedFile);
const reqs = scenarioRequests(scenario);
const b = model.batching;
const threads = model.engine!.threads ?? stored.threads;
process.stderr.write(
  `bench:fidelity ${reqs.length} requests, ${useStored ? `stored profile ${stored.name}` : 'profile calibrated in this run'}, ` +
    `${threads} thread(s), ${clockKind} clock\nload before: ${load()}\n`,
);

const { gpu, gpuLayers } = model.engine! as EngineSpec;
const loadStarted = performance.now();
const engine = await loadLlamaEngine(model.engine!.file, {
  ...(gpu ? { gpu } : {}),
  ...(gpuLayers !== undefined ? { gpuLayers } : {}),
  sequences: model.engine!.sequences,
  contextTokens: model.engine!.contextTokens,
  threads,
  batchTokens: b.tokenBudget,
});
const loadS = (performance.now() - loadStarted) / 1e3;
const cap = engine.capacity();
const limits = limitsForEngine(b, cap);
const origin = await engineOrigin(engine);
const storedOrigin = { origin: profileOrigin(stored), threads: stored.threads };
const differences = originDifferences(storedOrigin, { origin, threads });
process.stderr.write(
  `profile ${stored.name} fitted on ${describeOrigin(storedOrigin.origin, stored.threads)}; ` +
    `this run: ${describeOrigin(origin, threads)}` +
    `${differences.length > 0 ? ` (differs: ${differences.join(', ')})` : ''}\n`,
);
// Half the repetitions before the live run, half after (each half warms up first); quick runs take fewer.
const reps = quick ? 2 : Math.ceil(DEFAULT_GRID.repetitions / 2);
const timing = timingFor(engine, clockKind === 'cpu' ? 'cpu' : 'wall');
const calibrated: CalibrationSample[] = [];
// The grid `switchyard calibrate` times for this model (its running sequences, token budget and context).
const grid = { ...gridFor({ ...b, cellsPerSequence: cap.cellsPerSequence }), repetitions: reps };
const calibrating = async (): Promise<void> => {
  if (!useStored) calibrated.push(...(await measureGrid(engine, grid, timing)));
};
await calibrating();
/** One live step: its shape, and its time by the run's clock, by CPU and by wall. */
interface LiveStep {
  shape: Parameters<typeof profileStepS>[1];
  prefill: boolean;
  ms: number;
  cpuMs: number;
  wallMs: number;
}
const steps: LiveStep[] = [];
const live = await serveWithSwitchyard(engine, reqs, limits, createBenchClock(clockKind), (plan, cpuMs, wallMs) => {
  const ms = clockKind === 'cpu' ? cpuMs : wallMs;
  steps.push({ shape: plan.shape, prefill: plan.prefillTokens > 0, ms, cpuMs, wallMs });
});
await calibrating();
await engine.unload();

/** The profile the simulation uses: fitted on this run's samples, or the stored one. */
function runProfile(): EngineProfile {
  if (useStored) return stored;
  const { coefficients, fit } = fitProfile(calibrated);
  return {
    ...stored,
    name: `${stored.name}-in-run`,
    threads,
    fittedOn: origin,
    timing,
    loadS,
    capacity: {
      sequences: cap.sequences,
      cellsPerSequence: cap.cellsPerSequence,
      totalCells: cap.totalCells,
      batchTokens: cap.batchTokens,
    },
    coefficients,
    fit,
    samples: calibrated,
  };
}
const profile = runProfile();
const dir = mkdtempSync(join(tmpdir(), 'switchyard-fidelity-'));
if (!useStored) {
  model.calibration = join(dir, 'profile.json');
  writeFileSync(model.calibration, JSON.stringify(profile));
}
/** The profile's predictions for the live steps ÷ what they measured: all, decode-only, with prefill. */
function stepModel(p: EngineProfile) {
  const sum = { all: [0, 0], decodeOnly: [0, 0], withPrefill: [0, 0], absErr: 0 };
  for (const s of steps) {
    const predicted = profileStepS(p, s.shape) * 1e3;
    for (const k of ['all', s.prefill ? 'withPrefill' : 'decodeOnly'] as const) {
      sum[k][0]! += predicted;
      sum[k][1]! += s.ms;
    }
    sum.absErr += Math.abs(predicted - s.ms);
  }
  const r = (k: 'all' | 'decodeOnly' | 'withPrefill'): number => sum[k][0]! / sum[k][1]!;
  return {
    all: r('all'),
    decodeOnly: r('decodeOnly'),
    withPrefill: r('withPrefill'),
    absErr: sum.absErr / sum.all[1]!,
  };
}
/**
 * Judges profile `file` on the live steps as serve judges a stored profile on an engine's first steps (the same
 * comparison, tolerance and line: actors/profile-fit.ts), printing serve's line when it does not fit.
 */
function judge(file: string): ProfileFit {
  const fits = createProfileFits(new Map([[model.name, file]]), (line) => process.stdout.write(`${line}\n`));
  const p = engineProfileAt(file);
  for (const s of steps)
    fits.observe(model.name, { steps: 1, predictedMs: profileStepS(p, s.shape) * 1e3, busyMs: s.ms });
  return fits.of(model.name)!;
}
const loadAfter = load();

if (opt('dump')) writeFileSync(opt('dump')!, JSON.stringify({ steps, calibrated }));
const fit = judge(model.calibration!);
const storedFit = useStored ? undefined : judge(storedFile);
const sim = simulate(scenario);
rmSync(dir, { recursive: true, force: true });
const model_ = stepModel(profile);
const drift = useStored ? undefined : stepModel(stored);

const m = figuresOf(live);
const sched = live.scheduler!;
const liveSpanMs = m.tokensPerS > 0 ? (m.outputTokens / m.tokensPerS) * 1e3 : 0;
const ratios = {
  throughputRatio: sim.throughput.outputTokensPerS / m.tokensPerS,
  ttftP50Ratio: sim.ttftMs.p50 / m.ttft.p50,
  ttftP99Ratio: sim.ttftMs.p99 / m.ttft.p99,
  tpotP50Ratio: sim.tpotMs.p50 / m.tpot.p50,
  tpotP99Ratio: sim.tpotMs.p99 / m.tpot.p99,
};
const f = (x: number, d = 1): string => x.toFixed(d).padStart(11);
const row = (name: string, s: number, l: number, target: string): string =>
  `${name.padEnd(22)}${f(s)}${f(l)}${f(s / l, 3)}   ${target}`;
const lines = [
  `${''.padEnd(22)}${'simulated'.padStart(11)}${'measured'.padStart(11)}${'ratio'.padStart(11)}   target`,
  row('output tokens/s', sim.throughput.outputTokensPerS, m.tokensPerS, '0.90-1.10'),
  row('TTFT p50 ms', sim.ttftMs.p50, m.ttft.p50, '0.85-1.15'),
  row('TTFT p99 ms', sim.ttftMs.p99, m.ttft.p99, '0.75-1.25'),
  row('TPOT p50 ms', sim.tpotMs.p50, m.tpot.p50, '0.85-1.15'),
  row('TPOT p99 ms', sim.tpotMs.p99, m.tpot.p99, '0.75-1.25'),
  row('TBT p99 ms', sim.tbtMs.p99, m.tbt.p99, ''),
  `simulated outcomes: ${Object.entries(sim.requests)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ')}${sim.requests.total !== (sim.requests['done'] ?? 0) ? ' (NOT all served: the sides differ)' : ''}`,
  `steps: simulated ${sim.batch.steps}, live ${steps.length}; span: simulated ${sim.sim.simulatedSeconds} s, live ` +
    `${(liveSpanMs / 1e3).toFixed(3)} s; output tokens: simulated ${Math.round(sim.throughput.outputTokensPerS * sim.sim.simulatedSeconds)}, ` +
    `live ${m.outputTokens} (${m.eosEnded} ended by EOS)`,
  `profile: ${profile.name}, fit over ${profile.fit.points} shapes, mean |error| ${(profile.fit.meanRelError * 100).toFixed(1)} %` +
    (useStored ? '' : ` (${reps} + ${reps} repetitions around the live run)`),
  `step-time model on the live steps: predicted ÷ measured ${model_.all.toFixed(3)} ` +
    `(decode-only steps ${model_.decodeOnly.toFixed(3)}, steps with prefill ${model_.withPrefill.toFixed(3)}), ` +
    `mean |error| per step ${(model_.absErr * 100).toFixed(1)} % of the step` +
    (drift ? `; the stored profile (${stored.name}) would predict ${drift.all.toFixed(3)}` : ''),
  `live time outside engine steps: scheduler ${sched.schedCpuMs.toFixed(0)} ms CPU, other (frees, event loop) ` +
    `${Math.max(0, live.cpuS * 1e3 - sched.schedCpuMs - sched.engineCpuMs).toFixed(0)} ms CPU of ` +
    `${(live.cpuS * 1e3).toFixed(0)} ms; live measured in process (batcher + engine)`,
  `load after: ${loadAfter}`,
];
process.stdout.write(`${lines.join('\n')}\n`);
writeChartData({ simulated: sim.throughput, measured: { tokensPerS: m.tokensPerS }, ratios });
printFigures({
  ...ratios,
  stepModelRatio: model_.all,
  decodeOnlyStepModelRatio: model_.decodeOnly,
  withPrefillStepModelRatio: model_.withPrefill,
  ...(drift ? { storedProfileStepModelRatio: drift.all } : {}),
  profileVerdict: fit.verdict,
  profileFitRatio: fit.ratio,
  ...(storedFit ? { storedProfileVerdict: storedFit.verdict, storedProfileFitRatio: storedFit.ratio } : {}),
  fittedOn: fit.fittedOn,
  ...(useStored ? {} : { storedFittedOn: storedFit!.fittedOn }),
  profile: useStored ? 'stored' : 'in-run',
  simulatedDone: sim.requests['done'] ?? 0,
  requests: reqs.length,
  clock: clockKind,
  path: 'in-process',
  load: loadAfter.replace(/.*load average: /, ''),
});
