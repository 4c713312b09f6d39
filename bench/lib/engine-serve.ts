// Serving one request stream on the real llama.cpp engine, two ways: switchyard's batcher planning every step, or
// node-llama-cpp's own batching of concurrent sequences; per-token timings and the scheduler's own time per step.
//
// Time. On a shared, oversubscribed machine, wall time measures the other tenants more than the engine. The `cpu`
// clock is this process's CPU time (the engine runs one thread; the scheduler runs between steps, while the engine
// waits), plus the idle time skipped when nothing is in flight and the next request has not arrived: what the wall
// clock would read on a dedicated core. The `wall` clock is the plain wall clock. Both are measured, not modelled.
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises';
import { getLlama, LlamaLogLevel, type LlamaContextSequence, type Token } from 'node-llama-cpp';
import {
  createContinuousBatcher,
  type ContinuousLimits,
  type PlanEntry,
  type StepPlan,
} from '../../actors/batcher/continuous.ts';
import { createSequence, type Sequence } from '../../actors/batcher/sequence.ts';
import type { Engine, EngineCapacity, StepItem } from '../../actors/engine/engine.ts';
import type { Scenario } from '../../actors/config.ts';
import { createArrivalStream } from '../../actors/sim/traffic.ts';
import { createRng } from '../../runtime/rng.ts';

/** One request of the stream: arrival (ms from the start), prompt token ids, output tokens wanted. */
export interface BenchRequest {
  id: string;
  t: number;
  prompt: number[];
  outputTokens: number;
}

/** The arrivals simulate() draws for traffic[0] of `scenario` (same seed, same fork), with seeded prompt bytes. */
export function scenarioRequests(scenario: Scenario, limit = Infinity): BenchRequest[] {
  const stream = createArrivalStream(scenario, 0, createRng(scenario.seed).fork('traffic'));
  const bytes = createRng(scenario.seed).fork('prompt-bytes');
  const out: BenchRequest[] = [];
  for (let a = stream.next(); a && out.length < limit; a = stream.next()) {
    // BOS, then printable bytes: valid in the byte-level vocabulary, prompt length exactly as the trace says.
    const prompt = [256, ...Array.from({ length: a.promptTokens - 1 }, () => 97 + bytes.int(26))];
    out.push({ id: `r${out.length}`, t: a.t, prompt, outputTokens: a.outputTokens });
  }
  return out;
}

/** A clock for a serving run: now() in ms, and waiting for the next arrival when nothing is in flight. */
export interface BenchClock {
  readonly kind: 'cpu' | 'wall';
  now(): number;
  /** Nothing is in flight: let time pass until `t` (the cpu clock skips it; the wall clock sleeps). */
  idleUntil(t: number): Promise<void>;
}

/** This process's CPU time, ms. */
export const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e3;
};

/** Creates a clock of the given kind starting at 0. */
export function createBenchClock(kind: 'cpu' | 'wall'): BenchClock {
  const cpu0 = cpuMs();
  const wall0 = performance.now();
  let skipped = 0;
  const now = (): number => (kind === 'cpu' ? cpuMs() - cpu0 + skipped : performance.now() - wall0);
  return {
    kind,
    now,
    idleUntil: async (t) => {
      const gap = t - now();
      if (gap <= 0) return;
      if (kind === 'cpu') skipped += gap;
      else await sleep(gap);
    },
  };
}

/** When each token of a request came (clock ms), and when it arrived. */
export interface RequestTiming {
  arrival: number;
  tokens: number[];
  /** Ended by the model's end-of-generation token before its output length. */
  eos: boolean;
}

/** Switchyard's time per step apart from the engine's: planning, building the batch, applying the result. */
export interface SchedulerTime {
  steps: number;
  /** CPU ms of the scheduler's work, and of the engine's steps. */
  schedCpuMs: number;
  engineCpuMs: number;
  /** The same in wall ms. */
  schedWallMs: number;
  engineWallMs: number;
}

/** What one serving run produced. */
export interface ServeRun {
  side: string;
  clock: 'cpu' | 'wall';
  timings: RequestTiming[];
  wallS: number;
  cpuS: number;
  scheduler?: SchedulerTime;
  batchTokens: number;
}

/** Engine items of a planned step: prefill chunks of prompt + generated ids (a recompute included), and decodes. */
function toItems(entries: readonly PlanEntry[], ids: Map<string, number[]>): StepItem[] {
  return entries.map(({ seq, chunk }): StepItem => {
    // Each sequence in the engine slot the batcher gave it (actors/batcher/slots.ts).
    if (chunk === 0) return { seq: seq.id, kind: 'decode', slot: seq.slot };
    const tokens = ids.get(seq.id)!.slice(seq.computed, seq.computed + chunk);
    return { seq: seq.id, kind: 'prefill', tokens, sample: seq.computed + chunk >= seq.prefillGoal, slot: seq.slot };
  });
}

/** The batcher's limits for a model's batching settings on an engine's real cache (blocks and context from it). */
export function limitsForEngine(b: Scenario['models'][number]['batching'], cap: EngineCapacity): ContinuousLimits {
  return {
    policy: b.policy,
    maxRunning: b.maxRunning,
    tokenBudget: b.tokenBudget,
    blockTokens: b.blockTokens,
    blocksTotal: b.kvBlocks ?? Math.floor(cap.totalCells / b.blockTokens),
    maxContext: Math.min(b.maxContext, cap.cellsPerSequence),
    watermarkBlocks: 0,
  };
}

/**
 * Serves `reqs` with switchyard's continuous batcher planning each step and `engine` executing it as one batch,
 * in process (no server, no worker, no wire): the same loop a replica runs, with the engine as its executor.
 */
export async function serveWithSwitchyard(
  engine: Engine,
  reqs: readonly BenchRequest[],
  limits: ContinuousLimits,
  clock: BenchClock,
  onStep?: (plan: StepPlan, cpuMs: number, wallMs: number) => void,
): Promise<ServeRun> {
  const wall0 = performance.now();
  const cpu0 = cpuMs();
  const batcher = createContinuousBatcher(limits);
  const timings = reqs.map((r) => ({ arrival: r.t, tokens: [] as number[], eos: false }));
  const ids = new Map<string, number[]>();
  const index = new Map(reqs.map((r, i) => [r.id, i]));
  const preempted: string[] = [];
  const finished: string[] = [];
  const sched: SchedulerTime = { steps: 0, schedCpuMs: 0, engineCpuMs: 0, schedWallMs: 0, engineWallMs: 0 };
  const listener = {
    scheduled: () => undefined,
    preempted: (s: Sequence) => preempted.push(s.id),
    tokens: (s: Sequence, _n: number, t: number) => timings[index.get(s.id)!]!.tokens.push(t),
    finished: (s: Sequence) => finished.push(s.id),
  };
  let next = 0;
  let done = 0;
  while (done < reqs.length) {
    const c0 = cpuMs();
    const w0 = performance.now();
    const now = clock.now();
    for (; next < reqs.length && reqs[next]!.t <= now; next++) {
      const r = reqs[next]!;
      ids.set(r.id, [...r.prompt]);
      const spec = { id: r.id, priority: 0, order: next, promptTokens: r.prompt.length, listener };
      batcher.enqueue(
        createSequence({ ...spec, outputTokens: r.outputTokens, maxTokens: r.outputTokens, receivedAt: r.t }),
      );
    }
    const plan = batcher.plan(now);
    const items = plan ? toItems(plan.entries, ids) : [];
    sched.schedCpuMs += cpuMs() - c0;
    sched.schedWallMs += performance.now() - w0;
    if (!plan) {
      await clock.idleUntil(reqs[next]!.t);
      continue;
    }
    for (const id of preempted.splice(0)) await engine.free(id);
    const c1 = cpuMs();
    const w1 = performance.now();
    const result = await engine.step({ items });
    const c2 = cpuMs();
    const w2 = performance.now();
    sched.engineCpuMs += c2 - c1;
    sched.engineWallMs += w2 - w1;
    sched.steps++;
    onStep?.(plan, c2 - c1, w2 - w1);
    const eos: string[] = [];
    for (const s of result.sampled) {
      ids.get(s.seq)!.push(s.token);
      if (s.finish) eos.push(s.seq);
    }
    batcher.complete(plan, clock.now());
    for (const id of eos) {
      if (!batcher.withdraw(id)) continue; // it also reached its length this step
      timings[index.get(id)!]!.eos = true;
      finished.push(id);
    }
    sched.schedCpuMs += cpuMs() - c2;
    sched.schedWallMs += performance.now() - w2;
    for (const id of finished.splice(0)) {
      await engine.free(id);
      ids.delete(id);
      done++;
    }
  }
  const wallS = (performance.now() - wall0) / 1e3;
  const cpuS = (cpuMs() - cpu0) / 1e3;
  return {
    side: 'switchyard',
    clock: clock.kind,
    timings,
    wallS,
    cpuS,
    scheduler: sched,
    batchTokens: limits.tokenBudget,
  };
}

/** The engine alone: node-llama-cpp's cache (same slots and cells) and its own batching of concurrent sequences. */
export interface EngineAloneOptions {
  sequences: number;
  contextTokens: number;
  threads: number;
}

/**
 * Serves `reqs` with no scheduler in front: each request, once a sequence is free, generates greedily on its own
 * LlamaContextSequence, and node-llama-cpp's default batching schedules whatever the sequences ask for.
 */
export async function serveWithEngineAlone(
  file: string,
  reqs: readonly BenchRequest[],
  opts: EngineAloneOptions,
  clock: BenchClock,
): Promise<ServeRun> {
  const llama = await getLlama({
    gpu: false,
    build: 'never',
    skipDownload: true,
    progressLogs: false,
    maxThreads: opts.threads,
    logLevel: LlamaLogLevel.error,
  });
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  const context = await model.createContext({
    contextSize: opts.contextTokens,
    sequences: opts.sequences,
    threads: opts.threads,
  });
  const free: LlamaContextSequence[] = Array.from({ length: opts.sequences }, () => context.getSequence());
  const timings = reqs.map((r) => ({ arrival: r.t, tokens: [] as number[], eos: false }));
  const waiting: number[] = [];
  let wake: () => void = () => undefined;
  let active = 0;
  let done = 0;
  const run = async (i: number, seq: LlamaContextSequence): Promise<void> => {
    const r = reqs[i]!;
    const timing = timings[i]!;
    for await (const token of seq.evaluate(r.prompt as Token[], { temperature: 0 })) {
      timing.tokens.push(clock.now());
      wake();
      if (model.isEogToken(token) && timing.tokens.length < r.outputTokens) timing.eos = true;
      if (timing.eos || timing.tokens.length >= r.outputTokens) break;
    }
    await seq.clearHistory();
    free.push(seq);
    active--;
    done++;
    wake();
  };
  const wall0 = performance.now();
  const cpu0 = cpuMs();
  let next = 0;
  while (done < reqs.length) {
    for (const now = clock.now(); next < reqs.length && reqs[next]!.t <= now; next++) waiting.push(next);
    while (waiting.length > 0 && free.length > 0) {
      active++;
      void run(waiting.shift()!, free.pop()!);
    }
    if (done >= reqs.length) break;
    const progress = new Promise<void>((resolve) => (wake = resolve));
    if (active > 0) {
      // Arrivals are let in at token boundaries (on the wall clock also when the next one is due).
      const due = next < reqs.length ? reqs[next]!.t - clock.now() : Infinity;
      await (clock.kind === 'wall' && Number.isFinite(due)
        ? Promise.race([progress, sleep(Math.max(0, due))])
        : progress);
    } else if (next < reqs.length) {
      await clock.idleUntil(reqs[next]!.t);
    } else {
      await nextTurn();
    }
  }
  const wallS = (performance.now() - wall0) / 1e3;
  const cpuS = (cpuMs() - cpu0) / 1e3;
  const batchTokens = context.batchSize;
  await context.dispose();
  await model.dispose();
  await llama.dispose();
  return { side: 'engine alone', clock: clock.kind, timings, wallS, cpuS, batchTokens };
}

/** Nearest-rank percentile of samples (0 when empty). */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

/** Throughput and latency figures of a run, in its clock's ms. */
export interface RunFigures {
  requests: number;
  outputTokens: number;
  eosEnded: number;
  /** Output tokens per second from time 0 to the last token (the simulator's definition). */
  tokensPerS: number;
  /** Output tokens per second of wall time and per CPU second of the process. */
  tokensPerWallS: number;
  tokensPerCpuS: number;
  ttft: { p50: number; p90: number; p99: number };
  tbt: { p50: number; p90: number; p99: number };
  tpot: { p50: number; p90: number; p99: number };
}

const pcts = (xs: number[]): { p50: number; p90: number; p99: number } => ({
  p50: percentile(xs, 50),
  p90: percentile(xs, 90),
  p99: percentile(xs, 99),
});

/** Summarises a run: throughput, TTFT, TBT (every gap between tokens), TPOT (per request). */
export function figuresOf(run: ServeRun): RunFigures {
  const ttft: number[] = [];
  const tbt: number[] = [];
  const tpot: number[] = [];
  let tokens = 0;
  let end = 0;
  for (const r of run.timings) {
    tokens += r.tokens.length;
    if (r.tokens.length === 0) continue;
    ttft.push(r.tokens[0]! - r.arrival);
    for (let i = 1; i < r.tokens.length; i++) tbt.push(r.tokens[i]! - r.tokens[i - 1]!);
    if (r.tokens.length > 1) tpot.push((r.tokens.at(-1)! - r.tokens[0]!) / (r.tokens.length - 1));
    end = Math.max(end, r.tokens.at(-1)!);
  }
  return {
    requests: run.timings.length,
    outputTokens: tokens,
    eosEnded: run.timings.filter((r) => r.eos).length,
    tokensPerS: end > 0 ? (tokens / end) * 1e3 : 0,
    tokensPerWallS: tokens / run.wallS,
    tokensPerCpuS: tokens / run.cpuS,
    ttft: pcts(ttft),
    tbt: pcts(tbt),
    tpot: pcts(tpot),
  };
}
