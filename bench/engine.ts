// `npm run bench:engine`: one request stream on the real llama.cpp engine, served by switchyard's batcher (every step
// planned by the chunked continuous batcher, run as one engine batch) and by node-llama-cpp's own batching of
// concurrent sequences with no scheduler in front; same model, slots, cache cells and greedy sampling.
//
// Usage: tsx bench/engine.ts [--quick] [--requests N] [--time-scale X] [--clock cpu|wall] [--config file.yaml]
//                           [--path both|in-process|served]
// The stream is traffic[0] of bench/engine.yaml (splitwise_code rows that fit the context: long prompts, short
// outputs), arrivals compressed by --time-scale. `in-process` runs switchyard's side in this process (batcher +
// engine, no server) against the engine alone, on --clock (default cpu). `served` and `both` (the default; the two
// are the same run) run all three sides on the wall clock, one after the other: in process, the engine alone, and
// served through `switchyard serve` → worker → engine host (three processes, /v1/ws client here): the served side
// can only be timed by its client's wall clock, so every ratio it is in is taken on that clock.
//
// Overhead share, every side measured the same way (bench/lib/thread-cpu.ts): the CPU of every thread that is not
// llama.cpp's (libuv's pool, where llama_decode and sampling run) ÷ the CPU of llama.cpp's threads. Served, that is
// serve + worker + the host's main and helper threads; in process, this process's threads but the pool; for the
// engine alone, the same, i.e. node-llama-cpp's own JavaScript and the driver, the floor any node-llama-cpp user pays.
// llama.cpp's CPU per output token is printed for each side: the shares compare like with like only when it agrees.
// The engine's idle share (served) is the hosts' own measurement: from a step's return to the next dispatch while
// the core had runnable work, over the run's wall time.
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
const withServed = path !== 'in-process';
// The served path is timed by its client's wall clock (its three processes have no common CPU clock), and so are the
// in-process run and the engine alone it is compared with.
if (withServed && opt('clock') === 'cpu') throw new Error('--clock cpu needs --path in-process (served is wall only)');
const clockKind = withServed ? 'wall' : ((opt('clock') ?? 'cpu') as 'cpu' | 'wall');
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
const inProcess = await split(() => serveWithSwitchyard(engine, reqs, limits, createBenchClock(clockKind)));
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
const served = withServed ? await serveThroughSwitchyard(configFile, model.name, reqs, inFlight) : undefined;
const loadAfter = load();

/** One side of the comparison: its figures, and llama.cpp's CPU per output token (the work it did). */
interface Side {
  name: string;
  fig: RunFigures;
  llamaMsPerToken: number;
}
const sideOf = (name: string, run: ServeRun, engineMs: number): Side => {
  const fig = figuresOf(run);
  return { name, fig, llamaMsPerToken: engineMs / Math.max(1, fig.outputTokens) };
};
const p = sideOf('in process', inProcess.run, inProcess.cpu.engineMs);
const e = sideOf('engine', alone.run, alone.cpu.engineMs);
const s = served ? sideOf('served', served, served.cpu.engineMs) : undefined;
const sides = s ? [s, p, e] : [p, e];
// Ratios: served / engine alone and served / in process when served ran, else in process / engine alone.
const pairs: [Side, Side][] = s
  ? [
      [s, e],
      [s, p],
    ]
  : [[p, e]];

const f = (x: number, d = 1): string => x.toFixed(d).padStart(12);
const row = (name: string, get: (x: Side) => number, d = 1): string =>
  name.padEnd(26) + sides.map((x) => f(get(x), d)).join('') + pairs.map(([x, y]) => f(get(x) / get(y), 3)).join('');
const lines = [
  ''.padEnd(26) +
    sides.map((x) => x.name.padStart(12)).join('') +
    pairs.map(([x, y]) => `${x.name}/${y.name}`.slice(0, 11).padStart(12)).join('') +
    `   (all on the ${clockKind} clock)`,
  row('output tokens', (x) => x.fig.outputTokens, 0),
  row(`tokens/s to last token`, (x) => x.fig.tokensPerS),
  row('tokens/s over the run', (x) => x.fig.tokensPerWallS),
  row('tokens/CPU s', (x) => x.fig.tokensPerCpuS),
  row('llama.cpp CPU ms/token', (x) => x.llamaMsPerToken, 3),
];
for (const [name, k] of [
  ['TTFT', 'ttft'],
  ['TBT', 'tbt'],
  ['TPOT', 'tpot'],
] as const) {
  for (const q of ['p50', 'p90', 'p99'] as const) lines.push(row(`${name} ${q} ms`, (x) => x.fig[k][q]));
}
lines.push(
  `throughput (tokens/s from the first arrival to the last token, ${clockKind} clock on both sides of each pair): ` +
    pairs.map(([x, y]) => `${x.name} / ${y.name} ${(x.fig.tokensPerS / y.fig.tokensPerS).toFixed(3)}`).join(', '),
  `requests ended by EOS: ${sides.map((x) => `${x.name} ${x.fig.eosEnded}`).join(', ')}; batch tokens: switchyard ` +
    `budget ${b.tokenBudget}, node-llama-cpp batch ${alone.run.batchTokens}`,
  `overhead share = CPU outside llama.cpp's threads ÷ llama.cpp's threads' CPU:`,
  `  engine alone (node-llama-cpp's own JavaScript and the driver): ${pct(shareOf(alone.cpu))}`,
  inProcessLine(inProcess.run, inProcess.cpu),
);
if (served) lines.push(...servedLines(served));
lines.push(`load after: ${loadAfter}`);
process.stdout.write(`${lines.join('\n')}\n`);

function pct(x: number): string {
  return `${(x * 100).toFixed(2)} %`;
}

function inProcessLine(run: ServeRun, cpu: EngineThreadSplit): string {
  const sc = run.scheduler!;
  return (
    `  in process: ${pct(shareOf(cpu))} (main thread ${cpu.mainMs.toFixed(0)} ms, other threads ` +
    `${cpu.otherMs.toFixed(0)} ms vs llama.cpp ${cpu.engineMs.toFixed(0)} ms over ${sc.steps} steps); the batcher ` +
    `alone ${((sc.schedCpuMs / sc.steps) * 1e3).toFixed(1)} us a step = ${pct(sc.schedCpuMs / sc.engineCpuMs)} of ` +
    `engine.step's ${(sc.engineCpuMs / sc.steps).toFixed(2)} ms; the engine idle between steps ` +
    `${pct(sc.schedWallMs / (run.wallS * 1e3))} of the wall time`
  );
}

function servedLines(r: ServedRun): string[] {
  const c = r.cpu;
  const us = (ms: number): string => `${((ms / Math.max(1, r.steps)) * 1e3).toFixed(0)} us`;
  const g = figuresOf(r);
  const en = r.engine;
  const wallMs = r.wallS * 1e3;
  return [
    `  served: ${pct(c.switchyardMs / c.engineMs)} (${pct(c.switchyardMs / c.engineMs - shareOf(alone.cpu))} over ` +
      `the engine alone) — per step (${r.steps} steps): serve ${us(c.serveMs)}, worker ${us(c.workerMs)}, host main ` +
      `thread ${us(c.hostMainMs)}, host helper threads ${us(c.hostOtherMs)} vs llama.cpp ${us(c.engineMs)}`,
    `  served idle (before the run, counted in the run): serve ${r.idle.serveMsPerS.toFixed(1)} ms/s, worker ` +
      `${r.idle.workerMsPerS.toFixed(1)} ms/s, host ${r.idle.hostMsPerS.toFixed(1)} ms/s; llama.cpp threads ` +
      c.pools
        .map((q) => `${q.pid}: ${q.threads.map((t) => t.tid).join(',')} (busiest other ${q.otherMaxMs.toFixed(0)} ms)`)
        .join('; ') +
      (c.hostsGone > 0 ? `; ${c.hostsGone} engine host(s) exited mid-run: share NOT valid` : ''),
    `  engine in the host (its own clock): ${en.steps} steps, busy ${en.busyMs.toFixed(0)} ms = ` +
      `${pct(en.busyMs / wallMs)} of the run's wall time; idle while runnable work existed (a step's return to the ` +
      `next dispatch) ${en.idleMs.toFixed(0)} ms over ${en.idleGaps} gaps = ${pct(en.idleMs / wallMs)} ` +
      `(${((en.idleMs / Math.max(1, en.idleGaps)) * 1e3).toFixed(0)} us a gap)`,
    `  served latency (wall clock): TTFT p50 ${g.ttft.p50.toFixed(0)} p99 ${g.ttft.p99.toFixed(0)} ms, TBT p50 ` +
      `${g.tbt.p50.toFixed(0)} p99 ${g.tbt.p99.toFixed(0)} ms, ${g.tokensPerS.toFixed(1)} tokens/s; failures ` +
      `${JSON.stringify(r.failures)}, ${r.retries} submissions refused as overloaded and retried; at most ` +
      `${inFlight} requests in flight (the rest wait at the client, as for the engine alone)`,
  ];
}

const figures = (x: RunFigures) => ({ tokensPerS: x.tokensPerS, ttft: x.ttft, tbt: x.tbt, tpot: x.tpot });
const ours = s ?? p;
writeChartData({ switchyard: figures(ours.fig), engine: figures(e.fig) });
const sched = inProcess.run.scheduler!;
const overheadShare = served ? served.cpu.switchyardMs / served.cpu.engineMs : shareOf(inProcess.cpu);
const perStepUs = (ms: number): number => (ms / Math.max(1, served!.steps)) * 1e3;
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
  // The served side over the engine alone when served ran, else the in-process side's.
  throughputRatio: ours.fig.tokensPerS / e.fig.tokensPerS,
  ...(s ? { servedVsInProcess: s.fig.tokensPerS / p.fig.tokensPerS } : {}),
  inProcessVsAlone: p.fig.tokensPerS / e.fig.tokensPerS,
  ...(served
    ? {
        engineIdleShare: served.engine.idleMs / (served.wallS * 1e3),
        engineBusyShare: served.engine.busyMs / (served.wallS * 1e3),
      }
    : {}),
  // The deployment's share when the served path ran, else the in-process one.
  overheadShare,
  engineAloneShare: shareOf(alone.cpu),
  overheadOverAlone: overheadShare - shareOf(alone.cpu),
  overheadShareInProcess: shareOf(inProcess.cpu),
  schedulerShareInProcess: sched.schedCpuMs / sched.engineCpuMs,
  ...(s ? { llamaCpuMsPerTokenServed: s.llamaMsPerToken } : {}),
  llamaCpuMsPerTokenInProcess: p.llamaMsPerToken,
  llamaCpuMsPerTokenAlone: e.llamaMsPerToken,
  ...(served
    ? {
        servedPerStepUs: {
          serve: perStepUs(served.cpu.serveMs),
          worker: perStepUs(served.cpu.workerMs),
          hostMain: perStepUs(served.cpu.hostMainMs),
          hostOtherThreads: perStepUs(served.cpu.hostOtherMs),
          llama: perStepUs(served.cpu.engineMs),
        },
      }
    : {}),
  tbtP99Ratio: ours.fig.tbt.p99 / e.fig.tbt.p99,
  ttftP50Ratio: ours.fig.ttft.p50 / e.fig.ttft.p50,
  ttftP99Ratio: ours.fig.ttft.p99 / e.fig.ttft.p99,
  tokensPerCpuSRatio: ours.fig.tokensPerCpuS / e.fig.tokensPerCpuS,
  requests: reqs.length,
  clock: clockKind,
  path,
  ...(served
    ? {
        servedSteps: served.steps,
        engineSteps: served.engine.steps,
        hostsGone: served.cpu.hostsGone,
        failures: served.failures,
        retries: served.retries,
      }
    : {}),
  load: loadAfter.replace(/.*load average: /, ''),
});
