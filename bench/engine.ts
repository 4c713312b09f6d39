// `npm run bench:engine`: one request stream on the real llama.cpp engine, served by switchyard's batcher (every step
// planned by the chunked continuous batcher, run as one engine batch) and by node-llama-cpp's own batching of
// concurrent sequences with no scheduler in front; same model, slots, cache cells and greedy sampling.
//
// Usage: tsx bench/engine.ts [--quick] [--requests N] [--time-scale X] [--clock cpu|wall] [--config file.yaml]
//                           [--path both|in-process|served]
// The stream is traffic[0] of bench/engine.yaml (splitwise_code rows that fit the context: long prompts, short
// outputs), arrivals compressed by --time-scale. `in-process` runs switchyard's side in this process (batcher +
// engine, no server); `served` runs it through `switchyard serve` → worker → engine host (three processes, /v1/ws
// client here, wall clock); `both` (the default) runs the in-process side against the engine alone for the
// throughput and latency ratios, then the served side for the overhead share.
//
// Overhead share, every side measured the same way (bench/lib/thread-cpu.ts): the CPU of every thread that is not
// llama.cpp's (libuv's pool, where llama_decode and sampling run) ÷ the CPU of llama.cpp's threads. Served, that is
// serve + worker + the host's main and helper threads; in process, this process's threads but the pool; for the
// engine alone, the same, i.e. node-llama-cpp's own JavaScript and the driver, the floor any node-llama-cpp user pays.
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
  type ServeRun,
} from './lib/engine-serve.ts';
import { serveThroughSwitchyard, type ServedRun } from './lib/engine-served.ts';
import { poolSize, splitEngineThreads, threadCpu, threadDelta, type EngineThreadSplit } from './lib/thread-cpu.ts';

const argv = process.argv.slice(2);
const opt = (name: string): string | undefined => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const configFile = opt('config') ?? 'bench/engine.yaml';
const path = (opt('path') ?? 'both') as 'both' | 'in-process' | 'served';
if (!['both', 'in-process', 'served'].includes(path)) throw new Error(`--path is both, in-process or served`);
// The served path is timed by its client's wall clock (its three processes have no common CPU clock), and so is
// the engine alone it is compared with.
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

/** Runs `work`, splitting this process's CPU over it into llama.cpp's pool threads and the rest. */
async function split<T>(work: () => Promise<T>): Promise<{ run: T; cpu: EngineThreadSplit }> {
  const before = threadCpu(process.pid)!;
  const run = await work();
  const cpu = splitEngineThreads(process.pid, threadDelta(before, threadCpu(process.pid)!), poolSize(process.pid));
  return { run, cpu };
}
const shareOf = (s: EngineThreadSplit): number => (s.mainMs + s.otherMs) / s.engineMs;

const engine = await loadLlamaEngine(file, {
  sequences: model.engine!.sequences,
  contextTokens,
  threads: 1,
  batchTokens: b.tokenBudget,
});
const cap = engine.capacity();
process.stderr.write(
  `bench:engine ${reqs.length} requests (${scenario.traffic[0]!.lengths.trace}, time scale ${timeScale}), ` +
    `${cap.sequences} sequences x ${cap.cellsPerSequence} cells, budget ${b.tokenBudget}, ${clockKind} clock, ` +
    `path ${path}\n`,
);
const limits = limitsForEngine(b, cap);
const inProcess =
  path === 'served'
    ? undefined
    : await split(() => serveWithSwitchyard(engine, reqs, limits, createBenchClock(clockKind)));
await engine.unload();
const alone = await split(() =>
  serveWithEngineAlone(
    file,
    reqs,
    { sequences: model.engine!.sequences, contextTokens, threads: 1 },
    createBenchClock(clockKind),
  ),
);
// The served side loads its own engine, in its engine host.
// Its client keeps as many requests in flight as the engine has sequences; the rest wait at the client in arrival
// order, as the engine alone's driver holds them (time scale 16 is several times the engine's capacity: a client
// with every request in flight at once only measures the control plane refusing and the client retrying).
const inFlight = model.engine!.sequences;
const served = path === 'in-process' ? undefined : await serveThroughSwitchyard(configFile, model.name, reqs, inFlight);
const loadAfter = load();

const ours: ServeRun = inProcess?.run ?? served!;
const a = figuresOf(ours);
const e = figuresOf(alone.run);
const f = (x: number, d = 1): string => x.toFixed(d).padStart(10);
const row = (name: string, x: number, y: number, d = 1): string =>
  `${name.padEnd(24)}${f(x, d)}${f(y, d)}${f(x / y, 3)}`;
const lines = [
  `${''.padEnd(24)}${'switchyard'.padStart(10)}${'engine'.padStart(10)}${'ratio'.padStart(10)}   ` +
    `(switchyard ${inProcess ? 'in process' : 'served'}, ${clockKind} clock)`,
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
lines.push(
  `requests ended by EOS: switchyard ${a.eosEnded}, engine ${e.eosEnded}; batch tokens: switchyard budget ` +
    `${b.tokenBudget}, node-llama-cpp batch ${alone.run.batchTokens}`,
  `overhead share = CPU outside llama.cpp's threads ÷ llama.cpp's threads' CPU:`,
  `  engine alone (node-llama-cpp's own JavaScript and the driver): ${pct(shareOf(alone.cpu))}`,
);
if (inProcess) lines.push(inProcessLine(inProcess.run, inProcess.cpu));
if (served) lines.push(...servedLines(served));
lines.push(`load after: ${loadAfter}`);
process.stdout.write(`${lines.join('\n')}\n`);

function pct(x: number): string {
  return `${(x * 100).toFixed(2)} %`;
}

function inProcessLine(run: ServeRun, cpu: EngineThreadSplit): string {
  const s = run.scheduler!;
  return (
    `  in process: ${pct(shareOf(cpu))} (main thread ${cpu.mainMs.toFixed(0)} ms, helpers ` +
    `${cpu.otherMs.toFixed(0)} ms vs llama.cpp ${cpu.engineMs.toFixed(0)} ms over ${s.steps} steps); the batcher ` +
    `alone ${((s.schedCpuMs / s.steps) * 1e3).toFixed(1)} us a step = ${pct(s.schedCpuMs / s.engineCpuMs)} of ` +
    `engine.step's ${(s.engineCpuMs / s.steps).toFixed(2)} ms`
  );
}

function servedLines(r: ServedRun): string[] {
  const c = r.cpu;
  const us = (ms: number): string => `${((ms / Math.max(1, r.steps)) * 1e3).toFixed(0)} us`;
  const g = servedFigures(r);
  return [
    `  served: ${pct(c.switchyardMs / c.engineMs)} — per step (${r.steps} steps): serve ${us(c.serveMs)}, worker ` +
      `${us(c.workerMs)}, host main thread ${us(c.hostMainMs)}, host helper threads ${us(c.hostOtherMs)} vs ` +
      `llama.cpp ${us(c.engineMs)}`,
    `  served idle (before the run, counted in the run): serve ${r.idle.serveMsPerS.toFixed(1)} ms/s, worker ` +
      `${r.idle.workerMsPerS.toFixed(1)} ms/s, host ${r.idle.hostMsPerS.toFixed(1)} ms/s; llama.cpp threads ` +
      c.pools
        .map((p) => `${p.pid}: ${p.threads.map((t) => t.tid).join(',')} (busiest other ${p.otherMaxMs.toFixed(0)} ms)`)
        .join('; ') +
      (c.hostsGone > 0 ? `; ${c.hostsGone} engine host(s) exited mid-run: share NOT valid` : ''),
    `  served latency (wall clock): TTFT p50 ${g.ttft.p50.toFixed(0)} p99 ${g.ttft.p99.toFixed(0)} ms, TBT p50 ` +
      `${g.tbt.p50.toFixed(0)} p99 ${g.tbt.p99.toFixed(0)} ms, ${g.tokensPerS.toFixed(1)} tokens/s; failures ` +
      `${JSON.stringify(r.failures)}, ${r.retries} submissions refused as overloaded and retried; at most ` +
      `${inFlight} requests in flight (the rest wait at the client, as for the engine alone)`,
  ];
}

function servedFigures(r: ServedRun): RunFigures {
  return figuresOf(r);
}

const figures = (x: RunFigures) => ({ tokensPerS: x.tokensPerS, ttft: x.ttft, tbt: x.tbt, tpot: x.tpot });
writeChartData({ switchyard: figures(a), engine: figures(e) });
const sched = inProcess?.run.scheduler;
// Decode batching on the bench model (bench/lib/decode-batching.ts): passes of a step of 8 decodes, its cost against
// 8 one-decode steps, and throughput by concurrency for switchyard and node-llama-cpp alone.
const { measureDecodeBatching } = await import('./lib/decode-batching.ts');
const batching = await measureDecodeBatching({
  file,
  engine: { sequences: model.engine!.sequences, contextTokens, threads: 1, batchTokens: b.tokenBudget },
  quick,
});
process.stdout.write(`${batching.lines.join('\n')}\n`);
printFigures({
  ...batching.figures,
  throughputRatio: a.tokensPerS / e.tokensPerS,
  tbtP99Ratio: a.tbt.p99 / e.tbt.p99,
  // The deployment's share when the served path ran, else the in-process one.
  overheadShare: served ? served.cpu.switchyardMs / served.cpu.engineMs : shareOf(inProcess!.cpu),
  ...(inProcess ? { overheadShareInProcess: shareOf(inProcess.cpu) } : {}),
  ...(sched ? { schedulerShareInProcess: sched.schedCpuMs / sched.engineCpuMs } : {}),
  engineAloneShare: shareOf(alone.cpu),
  ttftP50Ratio: a.ttft.p50 / e.ttft.p50,
  ttftP99Ratio: a.ttft.p99 / e.ttft.p99,
  tokensPerCpuSRatio: a.tokensPerCpuS / e.tokensPerCpuS,
  requests: reqs.length,
  clock: clockKind,
  path,
  ...(served
    ? { servedSteps: served.steps, hostsGone: served.cpu.hostsGone, failures: served.failures, retries: served.retries }
    : {}),
  load: loadAfter.replace(/.*load average: /, ''),
});
