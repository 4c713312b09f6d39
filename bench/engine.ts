// `npm run bench:engine`: one request stream on the real llama.cpp engine, served by switchyard's batcher (every step
// planned by the chunked continuous batcher, run as one engine batch) and by node-llama-cpp's own batching of
// concurrent sequences with no scheduler in front; same model, slots, cache cells and greedy sampling.
//
// Usage: tsx bench/engine.ts [--quick] [--requests N] [--time-scale X] [--clock cpu|wall] [--config file.yaml]
//                           [--path in-process|served]
// The stream is traffic[0] of bench/engine.yaml (splitwise_code rows that fit the context: long prompts, short
// outputs), arrivals compressed by --time-scale. Switchyard's side runs in process (batcher + engine, no server) by
// default; `--path served` runs it through `switchyard serve` → worker → engine host (three processes, /v1/ws
// client here, wall clock), and its overhead share is the CPU of everything but llama_decode's threads ÷ theirs.
import { execFileSync } from 'node:child_process';
import { loadScenario } from '../actors/config.ts';
import { loadLlamaEngine } from '../actors/engine/llama-engine.ts';
import { printFigures, quick, writeChartData } from './lib/data.ts';
import {
  createBenchClock,
  figuresOf,
  limitsForEngine,
  scenarioRequests,
  serveWithEngineAlone,
  serveWithSwitchyard,
  type RunFigures,
} from './lib/engine-serve.ts';
import { serveThroughSwitchyard } from './lib/engine-served.ts';

const argv = process.argv.slice(2);
const opt = (name: string): string | undefined => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const configFile = opt('config') ?? 'bench/engine.yaml';
const path = (opt('path') ?? 'in-process') as 'in-process' | 'served';
if (path !== 'in-process' && path !== 'served') throw new Error(`--path is in-process or served; got ${String(path)}`);
// The served path is timed by its client's wall clock: its three processes have no common CPU clock.
const clockKind = path === 'served' ? 'wall' : ((opt('clock') ?? 'cpu') as 'cpu' | 'wall');
const requests = Number(opt('requests') ?? (quick ? 40 : 300));
const timeScale = Number(opt('time-scale') ?? 16);

const load = (): string => execFileSync('uptime', { encoding: 'utf8' }).trim();

const scenario = loadScenario(configFile, { calibrations: false });
const model = scenario.models[0]!;
scenario.traffic[0]!.requests = requests;
scenario.traffic[0]!.arrival.timeScale = timeScale;
const reqs = scenarioRequests(scenario);
const file = model.engine!.file;
const b = model.batching;
const contextTokens = model.engine!.contextTokens;
process.stderr.write(`load before: ${load()}\n`);

const engine = await loadLlamaEngine(file, {
  sequences: model.engine!.sequences,
  contextTokens,
  threads: 1,
  batchTokens: b.tokenBudget,
});
const cap = engine.capacity();
process.stderr.write(
  `bench:engine ${reqs.length} requests (${scenario.traffic[0]!.lengths.trace}, time scale ${timeScale}), ` +
    `${cap.sequences} sequences x ${cap.cellsPerSequence} cells, budget ${b.tokenBudget}, ${clockKind} clock\n`,
);
const limits = limitsForEngine(b, cap);
if (path === 'served') await engine.unload(); // the served side loads its own, in its engine host
const served = path === 'served' ? await serveThroughSwitchyard(configFile, model.name, reqs) : undefined;
const ours = served ?? (await serveWithSwitchyard(engine, reqs, limits, createBenchClock(clockKind)));
await engine.unload();
const alone = await serveWithEngineAlone(
  file,
  reqs,
  { sequences: model.engine!.sequences, contextTokens, threads: 1 },
  createBenchClock(clockKind),
);
const loadAfter = load();

const a = figuresOf(ours);
const e = figuresOf(alone);
const s = ours.scheduler;
const f = (x: number, d = 1): string => x.toFixed(d).padStart(10);
const row = (name: string, x: number, y: number, d = 1): string =>
  `${name.padEnd(24)}${f(x, d)}${f(y, d)}${f(x / y, 3)}`;
const lines = [
  `${''.padEnd(24)}${'switchyard'.padStart(10)}${'engine'.padStart(10)}${'ratio'.padStart(10)}`,
  row('output tokens', a.outputTokens, e.outputTokens, 0),
  row('tokens/s (clock)', a.tokensPerS, e.tokensPerS),
  row('tokens/s (wall)', a.tokensPerWallS, e.tokensPerWallS),
  row('tokens/CPU s', a.tokensPerCpuS, e.tokensPerCpuS),
];
for (const [name, k] of [
  ['TTFT', 'ttft'],
  ['TBT', 'tbt'],
  ['TPOT', 'tpot'],
] as const) {
  for (const p of ['p50', 'p90', 'p99'] as const) lines.push(row(`${name} ${p} ms`, a[k][p], e[k][p]));
}
// In process: the scheduler's CPU between steps ÷ the engine steps' CPU. Served: the CPU of serve, worker and the
// host's main thread ÷ the CPU of the host's other threads, llama_decode's (bench/lib/engine-served.ts).
const overheadShare = served ? served.cpu.switchyardMs / served.cpu.engineMs : s!.schedCpuMs / s!.engineCpuMs;
lines.push(
  `requests ended by EOS: switchyard ${a.eosEnded}, engine ${e.eosEnded}; batch tokens: switchyard budget ` +
    `${b.tokenBudget}, node-llama-cpp batch ${alone.batchTokens}`,
  served
    ? `switchyard's processes: ${(served.cpu.switchyardMs / 1e3).toFixed(2)} s CPU (serve ` +
        `${(served.cpu.serveMs / 1e3).toFixed(2)}, worker ${(served.cpu.workerMs / 1e3).toFixed(2)}, the host's main ` +
        `thread ${(served.cpu.hostMainMs / 1e3).toFixed(2)}) vs the engine host's other threads (llama_decode) ${(served.cpu.engineMs / 1e3).toFixed(2)} s CPU: ` +
        `${(overheadShare * 100).toFixed(2)} %; failures ${JSON.stringify(served.failures)}, ` +
        `${served.retries} submissions refused as overloaded and retried` +
        (served.cpu.hostsGone > 0 ? `; ${served.cpu.hostsGone} engine host(s) exited mid-run: share NOT valid` : '')
    : `switchyard per step: ${s!.steps} steps, scheduler ${((s!.schedCpuMs / s!.steps) * 1e3).toFixed(1)} us CPU ` +
        `(${((s!.schedWallMs / s!.steps) * 1e3).toFixed(1)} us wall) vs engine step ` +
        `${(s!.engineCpuMs / s!.steps).toFixed(2)} ms CPU (${(s!.engineWallMs / s!.steps).toFixed(2)} ms wall): ` +
        `${(overheadShare * 100).toFixed(2)} % of the step (CPU), ` +
        `${((s!.schedWallMs / s!.engineWallMs) * 100).toFixed(2)} % (wall)`,
  `wall: switchyard ${ours.wallS.toFixed(1)} s, engine ${alone.wallS.toFixed(1)} s; switchyard measured ` +
    (served
      ? 'through serve + worker + engine host (3 processes, /v1/ws client, wall clock)'
      : 'in process (batcher + engine)'),
  `load after: ${loadAfter}`,
);
process.stdout.write(`${lines.join('\n')}\n`);

const figures = (x: RunFigures) => ({ tokensPerS: x.tokensPerS, ttft: x.ttft, tbt: x.tbt, tpot: x.tpot });
writeChartData({ switchyard: figures(a), engine: figures(e) });
printFigures({
  throughputRatio: a.tokensPerS / e.tokensPerS,
  tbtP99Ratio: a.tbt.p99 / e.tbt.p99,
  overheadShare,
  ...(s ? { overheadShareWall: s.schedWallMs / s.engineWallMs } : {}),
  ttftP50Ratio: a.ttft.p50 / e.ttft.p50,
  ttftP99Ratio: a.ttft.p99 / e.ttft.p99,
  tokensPerCpuSRatio: a.tokensPerCpuS / e.tokensPerCpuS,
  requests: reqs.length,
  clock: clockKind,
  path,
  ...(served ? { hostsGone: served.cpu.hostsGone, failures: served.failures } : {}),
  load: loadAfter.replace(/.*load average: /, ''),
});
