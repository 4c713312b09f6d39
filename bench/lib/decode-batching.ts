// Decode batching on the real engine: whether a step of decodes runs as one pass over the weights, what it costs
// against the same decodes one step each, and throughput by concurrency for switchyard and node-llama-cpp alone.
//
// Passes. llama.cpp splits a batch into micro-batches of sequences in consecutive slots (actors/batcher/slots.ts);
// the engine counts them from its items' slots as llama.cpp splits them (StepResult.passes). node-llama-cpp exposes
// no count of llama.cpp's micro-batches, so timing checks it: a pass's cost comes from 4 decodes in slots 0, 2, 4, 6
// (four passes) against 4 in slots 0-3 (one), a decode token's from 4 in one pass against 1; the 8-decode step's
// time then says how many passes it took (1 + its time beyond one pass, in passes). On this CPU build a pass of
// exactly 8 tokens is slower than one of 7 or 9 (a matrix kernel's tiling, measured below on one sequence's prefill),
// which that estimate counts as extra passes: the counted figure is llama.cpp's split, the timed one a cross-check.
//
// Costs are process CPU time per engine step (the engine runs one thread; this machine is shared), medians over
// interleaved repetitions. The sweep serves closed-loop requests (all in at once, `c` in flight) with switchyard's
// batcher (maxRunning c) and with node-llama-cpp's own batching (c sequences), on the cpu clock.
import { createContinuousBatcher, type ContinuousLimits } from '../../actors/batcher/continuous.ts';
import { loadLlamaEngine } from '../../actors/engine/llama-engine.ts';
import type { Engine, EngineLoadOptions, StepItem } from '../../actors/engine/engine.ts';
import {
  createBenchClock,
  figuresOf,
  serveWithEngineAlone,
  serveWithSwitchyard,
  type BenchRequest,
} from './engine-serve.ts';

/** What the measurement needs: the model file, the engine's options (sequences: the largest concurrency). */
export interface DecodeBatchingOptions {
  file: string;
  engine: EngineLoadOptions;
  /** Timed repetitions of each step shape (default 15; 7 when quick). */
  repetitions?: number;
  /** Requests per concurrency level of the sweep, per sequence in flight (default 4). */
  requestsPerSlot?: number;
  quick?: boolean;
}

/** One concurrency level of the sweep: output tokens per second (cpu clock) of both sides. */
export interface SweepPoint {
  concurrency: number;
  switchyardTokensPerS: number;
  engineTokensPerS: number;
}

/** The figures (JSON keys of bench:engine) and the lines to print. */
export interface DecodeBatching {
  figures: {
    /** Passes of a step of 8 decodes in slots 0-7, as llama.cpp splits the batch (counted by the engine). */
    passesPerDecodeStep8: number;
    /** The same estimated from timing (see the file header). */
    passesPerDecodeStep8Timed: number;
    /** CPU of one step of 8 decodes ÷ CPU of 8 steps of one decode each. */
    decode8CostRatio: number;
    decode8Ms: number;
    decode1Ms: number;
    /** Greedy tokens of 8 sequences decoded together equal each decoded alone. */
    decode8SameTokens: boolean;
    decodeSweep: SweepPoint[];
  };
  lines: string[];
}

const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e3;
};

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? 0 : s[Math.floor((s.length - 1) / 2)]!;
};

/** Filler prompt tokens: printable bytes, valid in any byte-level vocabulary. */
const filler = (n: number, salt: number): number[] => Array.from({ length: n }, (_, i) => 97 + ((i * 7 + salt) % 26));

/** Tokens each sequence was given by the timed steps, in order. */
type Got = Map<string, number[]>;

/** Runs one step; its CPU ms and passes; the tokens it sampled go to `got`. */
async function timed(engine: Engine, items: StepItem[], got: Got) {
  const c0 = cpuMs();
  const r = await engine.step({ items });
  const ms = cpuMs() - c0;
  for (const t of r.sampled) got.set(t.seq, [...(got.get(t.seq) ?? []), t.token]);
  return { ms, passes: r.passes ?? items.length };
}

const decodes = (slots: readonly number[]): StepItem[] =>
  slots.map((slot) => ({ seq: `d${slot}`, kind: 'decode' as const, slot }));

/** The step shapes timed: 8 decodes together and one at a time, 4 in one pass and in four, 1, and one sequence's
 * prefill of 7, 8 and 9 tokens (the kernel's 8-token case). */
async function timeShapes(engine: Engine, reps: number, got: Got) {
  const slots = [0, 1, 2, 3, 4, 5, 6, 7];
  const t = { d8: [] as number[], d1x8: [] as number[], d4: [] as number[], d4apart: [] as number[] };
  const p: Record<string, number[]> = { p7: [], p8: [], p9: [] };
  let passes8 = 0;
  for (let r = -1; r < reps; r++) {
    const eight = await timed(engine, decodes(slots), got);
    passes8 = eight.passes;
    let ones = 0;
    for (const slot of slots) ones += (await timed(engine, decodes([slot]), got)).ms;
    const four = await timed(engine, decodes([0, 1, 2, 3]), got);
    const apart = await timed(engine, decodes([0, 2, 4, 6]), got);
    for (const n of [7, 8, 9]) {
      const seq = `p${n}`;
      // The prefill runs in the slot of d7, freed for it and set up again after (untimed).
      await engine.free('d7');
      const items: StepItem[] = [{ seq, kind: 'prefill', tokens: filler(n, r), sample: true, slot: 7 }];
      const one = await timed(engine, items, got);
      await engine.free(seq);
      await engine.step({ items: [{ seq: 'd7', kind: 'prefill', tokens: filler(48, 7), sample: true, slot: 7 }] });
      if (r >= 0) p[`p${n}`]!.push(one.ms);
    }
    if (r < 0) continue; // a warm-up round
    t.d8.push(eight.ms);
    t.d1x8.push(ones);
    t.d4.push(four.ms);
    t.d4apart.push(apart.ms);
  }
  return { t, p, passes8 };
}

/** Greedy tokens of sequence `d<slot>` decoded alone from the same prompt: what decoding it beside others must give. */
async function aloneTokens(engine: Engine, slot: number, n: number): Promise<number[]> {
  const out: number[] = [];
  let r = await engine.step({ items: [{ seq: 'alone', kind: 'prefill', tokens: filler(48, slot), sample: true }] });
  while (out.length < n) {
    r = await engine.step({ items: [{ seq: 'alone', kind: 'decode' }] });
    out.push(r.sampled[0]!.token);
  }
  await engine.free('alone');
  return out;
}

/** Closed-loop requests: `n` at time 0, each a seeded prompt and `output` tokens. */
const closedLoop = (n: number, output: number): BenchRequest[] =>
  Array.from({ length: n }, (_, i) => ({ id: `q${i}`, t: 0, prompt: [256, ...filler(31, i)], outputTokens: output }));

/** Output tokens per second of both sides at concurrency 1, 2, 4, … up to the engine's sequences. */
async function sweep(o: DecodeBatchingOptions, perSlot: number, output: number): Promise<SweepPoint[]> {
  const points: SweepPoint[] = [];
  const levels: number[] = [];
  for (let c = 1; c < o.engine.sequences; c *= 2) levels.push(c);
  levels.push(o.engine.sequences);
  for (const c of levels) {
    const reqs = closedLoop(perSlot * c, output);
    const engine = await loadLlamaEngine(o.file, { ...o.engine, threads: o.engine.threads ?? 1 });
    const cap = engine.capacity();
    const limits: ContinuousLimits = {
      policy: 'chunked',
      maxRunning: c,
      tokenBudget: cap.batchTokens,
      blockTokens: 16,
      blocksTotal: Math.floor(cap.totalCells / 16),
      maxContext: cap.cellsPerSequence,
      watermarkBlocks: 0,
    };
    createContinuousBatcher(limits); // refuses bad limits before the run
    const ours = await serveWithSwitchyard(engine, reqs, limits, createBenchClock('cpu')).finally(() =>
      engine.unload(),
    );
    const alone = await serveWithEngineAlone(
      o.file,
      reqs,
      { sequences: c, contextTokens: o.engine.contextTokens, threads: o.engine.threads ?? 1 },
      createBenchClock('cpu'),
    );
    points.push({
      concurrency: c,
      switchyardTokensPerS: figuresOf(ours).tokensPerS,
      engineTokensPerS: figuresOf(alone).tokensPerS,
    });
  }
  return points;
}

/** Measures decode batching on the model (the engine loaded with `o.engine`, 8 sequences or more). */
export async function measureDecodeBatching(o: DecodeBatchingOptions): Promise<DecodeBatching> {
  if (o.engine.sequences < 8) throw new RangeError(`decode batching needs 8 sequences; got ${o.engine.sequences}`);
  const reps = o.repetitions ?? (o.quick ? 7 : 15);
  const engine = await loadLlamaEngine(o.file, { ...o.engine, threads: o.engine.threads ?? 1 });
  let shapes: Awaited<ReturnType<typeof timeShapes>>;
  let same = true;
  try {
    for (let slot = 0; slot < 8; slot++) {
      const items: StepItem[] = [{ seq: `d${slot}`, kind: 'prefill', tokens: filler(48, slot), sample: true, slot }];
      await engine.step({ items });
    }
    const got: Got = new Map();
    shapes = await timeShapes(engine, reps, got);
    // d0-d6 decoded in steps of 8, 4 and 1 from their prompts (d7 was set up again between shapes): each sequence's
    // tokens must be its greedy continuation alone.
    for (let slot = 0; slot < 7; slot++) {
      await engine.free(`d${slot}`);
      const beside = got.get(`d${slot}`) ?? [];
      if (beside.join() !== (await aloneTokens(engine, slot, beside.length)).join()) same = false;
    }
  } finally {
    await engine.unload();
  }
  return report(shapes, same, await sweep(o, o.requestsPerSlot ?? (o.quick ? 2 : 4), o.quick ? 24 : 48));
}

function report(shapes: Awaited<ReturnType<typeof timeShapes>>, same: boolean, points: SweepPoint[]): DecodeBatching {
  const { t, p, passes8 } = shapes;
  const d8 = median(t.d8);
  const d1x8 = median(t.d1x8);
  const d4 = median(t.d4);
  const d4apart = median(t.d4apart);
  const d1 = d1x8 / 8;
  const pass = (d4apart - d4) / 3;
  const token = (d4 - d1) / 3;
  // What one pass of 8 tokens costs beyond the line through 7 and 9 (the 8-token kernel), taken out of the estimate.
  const kernel8 = median(p.p8!) - (median(p.p7!) + median(p.p9!)) / 2;
  const timedPasses = pass > 0 ? 1 + (d8 - d1 - 7 * token - Math.max(0, kernel8)) / pass : Number.NaN;
  const f = (x: number): string => x.toFixed(2);
  const lines = [
    `decode batching (CPU ms per step, medians): 8 decodes in slots 0-7 ${f(d8)} ms in ${passes8} pass(es) as ` +
      `llama.cpp splits the batch; 8 one-decode steps ${f(d1x8)} ms; ratio ${(d8 / d1x8).toFixed(3)} (target <= 0.6)`,
    `  timing check: 4 decodes in one pass ${f(d4)} ms, in four (slots 0,2,4,6) ${f(d4apart)} ms: a pass ${f(pass)} ms, ` +
      `a decode token ${f(token)} ms; the 8-decode step reads as ${timedPasses.toFixed(1)} passes (less the 8-token ` +
      `kernel's ${f(kernel8)} ms)`,
    `  one sequence's prefill in one pass: 7 tokens ${f(median(p.p7!))} ms, 8 tokens ${f(median(p.p8!))} ms, ` +
      `9 tokens ${f(median(p.p9!))} ms (8-token passes hit a slower matrix kernel on this CPU build)`,
    `  greedy tokens of sequences decoded together = decoded alone: ${same ? 'yes' : 'NO'}`,
    `throughput by concurrency (output tokens/s, cpu clock): ` +
      points
        .map(
          (x) =>
            `${x.concurrency}: switchyard ${x.switchyardTokensPerS.toFixed(0)}, alone ${x.engineTokensPerS.toFixed(0)}`,
        )
        .join('; '),
  ];
  return {
    figures: {
      passesPerDecodeStep8: passes8,
      passesPerDecodeStep8Timed: Number(timedPasses.toFixed(2)),
      decode8CostRatio: d8 / d1x8,
      decode8Ms: d8,
      decode1Ms: d1,
      decode8SameTokens: same,
      decodeSweep: points,
    },
    lines,
  };
}
