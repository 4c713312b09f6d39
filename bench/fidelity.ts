// `npm run bench:fidelity`: one request stream served live on the real llama.cpp engine through switchyard's batcher,
// and simulated (`simulate()` on the same config, the model's calibrated profile giving every step time), side by
// side as simulated ÷ measured. Also compares each live step with the profile's prediction for its shape, so a miss
// can be told apart: step-time model (calibration) or live overheads between steps.
//
// Usage: tsx bench/fidelity.ts [--quick] [--requests N] [--time-scale X] [--clock cpu|wall] [--config file.yaml]
// The profile is bench/profiles/bench.json (`switchyard calibrate --config bench/engine.yaml` writes it); the live
// side runs in process (batcher + engine, no server), on the cpu clock by default (see bench/lib/engine-serve.ts).
import { execFileSync } from 'node:child_process';
import { loadScenario } from '../actors/config.ts';
import { loadLlamaEngine } from '../actors/engine/llama-engine.ts';
import { engineProfileAt, profileStepS } from '../actors/gpu/profile-cost-model.ts';
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
const load = (): string => execFileSync('uptime', { encoding: 'utf8' }).trim();

const scenario = loadScenario(configFile);
scenario.traffic[0]!.requests = Number(opt('requests') ?? (quick ? 40 : 300));
// Time scale 2: the busiest load at which the simulated router admits every request of the 300 (at 3 it sheds 7,
// at 16 it sheds 134 with `overloaded` for want of KV headroom), so both sides serve the same requests.
scenario.traffic[0]!.arrival.timeScale = Number(opt('time-scale') ?? 2);
const model = scenario.models[0]!;
const profile = engineProfileAt(model.calibration!);
const reqs = scenarioRequests(scenario);
const b = model.batching;
process.stderr.write(
  `bench:fidelity ${reqs.length} requests, profile ${profile.name} (${profile.timing ?? 'wall'} timing, fit mean ` +
    `${(profile.fit.meanRelError * 100).toFixed(1)} %), ${clockKind} clock\nload before: ${load()}\n`,
);

const sim = simulate(scenario);

const engine = await loadLlamaEngine(model.engine!.file, {
  sequences: model.engine!.sequences,
  contextTokens: model.engine!.contextTokens,
  threads: profile.threads,
  batchTokens: b.tokenBudget,
});
const cap = engine.capacity();
const limits = limitsForEngine(b, cap);
const steps = { n: 0, predictedMs: 0, measuredMs: 0, absErrMs: 0, decodeOnly: [0, 0], withPrefill: [0, 0] };
const live = await serveWithSwitchyard(engine, reqs, limits, createBenchClock(clockKind), (plan, cpuMs, wallMs) => {
  const measured = clockKind === 'cpu' ? cpuMs : wallMs;
  const predicted = profileStepS(profile, plan.shape) * 1e3;
  steps.n++;
  steps.predictedMs += predicted;
  steps.measuredMs += measured;
  steps.absErrMs += Math.abs(predicted - measured);
  const bucket = plan.prefillTokens > 0 ? steps.withPrefill : steps.decodeOnly;
  bucket[0]! += predicted;
  bucket[1]! += measured;
});
await engine.unload();
const loadAfter = load();

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
  `steps: simulated ${sim.batch.steps}, live ${steps.n}; span: simulated ${sim.sim.simulatedSeconds} s, live ` +
    `${(liveSpanMs / 1e3).toFixed(3)} s; output tokens: simulated ${Math.round(sim.throughput.outputTokensPerS * sim.sim.simulatedSeconds)}, ` +
    `live ${m.outputTokens} (${m.eosEnded} ended by EOS)`,
  `step-time model on the live steps: predicted ÷ measured ${(steps.predictedMs / steps.measuredMs).toFixed(3)} ` +
    `(decode-only steps ${(steps.decodeOnly[0]! / steps.decodeOnly[1]!).toFixed(3)}, steps with prefill ` +
    `${(steps.withPrefill[0]! / steps.withPrefill[1]!).toFixed(3)}), mean |error| per step ` +
    `${((steps.absErrMs / steps.measuredMs) * 100).toFixed(1)} % of the step`,
  `live time outside engine steps: scheduler ${sched.schedCpuMs.toFixed(0)} ms CPU, other (frees, event loop) ` +
    `${Math.max(0, live.cpuS * 1e3 - sched.schedCpuMs - sched.engineCpuMs).toFixed(0)} ms CPU of ` +
    `${(live.cpuS * 1e3).toFixed(0)} ms; live measured in process (batcher + engine)`,
  `load after: ${loadAfter}`,
];
process.stdout.write(`${lines.join('\n')}\n`);
writeChartData({ simulated: sim.throughput, measured: { tokensPerS: m.tokensPerS }, ratios });
printFigures({
  ...ratios,
  stepModelRatio: steps.predictedMs / steps.measuredMs,
  simulatedDone: sim.requests['done'] ?? 0,
  requests: reqs.length,
  clock: clockKind,
  path: 'in-process',
  load: loadAfter.replace(/.*load average: /, ''),
});
