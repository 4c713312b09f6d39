// Calibration: times the real engine over a grid of step shapes and fits step-time coefficients (least squares).
//
// The fitted model is linear in eight features of a step:
//
//   t = base + perPass · N  +  perPrefillToken · Σ T  +  perPrefillCached · Σ K  +  perDecodeSeq · B
//            + perContextToken · C  +  perPrefillSeq · P  +  perSinglePass · S
//
// for a step run in N passes (llama.cpp micro-batches over consecutive slots, actors/batcher/slots.ts) holding P
// prefill chunks of T new tokens after K cached ones and B decoding sequences holding C context tokens in total, S of
// the passes of a decode-only step holding a single decode (singlePassesOf: llama.cpp's matrix-vector kernel, not
// its tiled one). The grid times decode-only steps (1 to 8 decodes) as well as mixed ones, each with its sequences
// in consecutive slots (packed, as the batcher places them) and, where that changes the passes, spread over every
// other slot (as after a hole): the same work in more passes, which separates a pass's cost from a token's. A decode-only step is timed
// after warming runs of the same step (CalibrationGrid.warmSteps), as served decode steps run; CPU time keeps each
// shape's mean run, which the simulation's sums of step times need.
// A chunk after a cache is priced by the cached tokens it reads (Σ K), not by token pairs Σ T·(K + T/2): on the
// ~100M model the pair term, pinned only by the grid's chunks after 192 cached tokens, priced the served 256-token
// chunks after 256-512 cached ones 10-25 % slow (steps with prefill 1.11× their live time, TTFT p50 1.25×), while the
// cached-token term predicts the same live steps within 1-2 % (docs/performance-notes.md). The profile format keeps
// perPrefillPair (0 from this fit; the roofline and the upstream calibration use it): on a GPU at long contexts the
// T·K products are real work, which a grid reaching such contexts would have to pin (not run here).
// Building a CostModel from a profile: stepS(shape) = profileStepS(profile, shape) (actors/gpu/profile-cost-model.ts);
// prefillS(T, K) is the same with one chunk and B = C = 0; decodeS(B, C) with no chunks; a step with no tokens costs
// 0, as in the roofline; kvBlocks(blockTokens) = floor(capacity.totalCells / blockTokens), but a sequence may never
// hold more than capacity.cellsPerSequence cells (the stock llama.cpp build gives each sequence a fixed block);
// loadS() is profile.loadS. tp is 1 (one engine host per replica), so there is no all-reduce term.
import { availableParallelism, cpus } from 'node:os';
import { getModuleVersion } from 'node-llama-cpp';
import {
  passesOf,
  predictS,
  prefillSeqsOf,
  singlePassesOf,
  type CalibrationSample,
  type EngineProfile,
  type ProfileOrigin,
  type StepCoefficients,
} from '../gpu/profile-cost-model.ts';
import type { Engine, EngineOffload, StepItem } from './engine.ts';

// The profile types and the step-time formula live with the cost model built from them (actors/gpu).
export { predictS, profileStepS } from '../gpu/profile-cost-model.ts';
export type { CalibrationSample, EngineProfile, ProfileOrigin, StepCoefficients } from '../gpu/profile-cost-model.ts';

/** How a shape's sequences sit in the engine's slots: consecutive (as the batcher places them: the fewest passes), or
 * spread over every other slot (decodes in passes of their own, as after holes: more passes for the same work). */
export type SlotLayout = 'packed' | 'spread';

/** The grid of step shapes to time: every combination of prefill chunk, decode count and per-sequence context. */
export interface CalibrationGrid {
  prefillTokens: readonly number[];
  decodeSeqs: readonly number[];
  contextTokens: readonly number[];
  /** Tokens already cached in the prefilling sequence (a chunk continuing a prompt); default [0]. */
  cachedTokens?: readonly number[];
  /**
   * Prefill chunks the prefill tokens are split over (the tail of one prompt beside the head of the next, as chunked
   * prefill plans them); default [1]. With 2, the first chunk continues after the cached tokens, the second is fresh.
   */
  prefillChunks?: readonly number[];
  /** Decode counts also timed alone (no prefill), beyond those of decodeSeqs: a full engine decoding; default []. */
  decodeOnlySeqs?: readonly number[];
  /** Slot layouts; `spread` is timed only where it changes the passes (2 or more decodes, fewer than the resident
   * decoding sequences, at most one fresh chunk); default both. */
  layouts?: readonly SlotLayout[];
  /**
   * Untimed runs of a decode-only step just before it is timed; default 3. Served decode-only steps come in runs of
   * the same shape (the same sequences decoding token after token), and llama.cpp runs a step like the one before
   * it faster than one after a different shape (it reuses the previous step's graph, and the weights and cache are
   * still warm): on the bench model a single decode costs ~1.3 ms in such a run and ~1.9 ms after a prefill step.
   * Steps with prefill rarely follow one of the same shape, so they are timed after whatever came before.
   */
  warmSteps?: number;
  repetitions: number;
}

/**
 * The default grid: 253 shapes — one or two prefill chunks (fresh, or continuing after 192 cached tokens) beside 0 to
 * 6 decodes at three contexts, 8 decodes alone, and the spread layout of 2 and 4 decodes — 7 repetitions each.
 * Prefills stop at 64 tokens, the largest chunk a step of the benchmarks' budget holds: larger ones would pull the fit
 * towards shapes that are never served.
 */
export const DEFAULT_GRID: CalibrationGrid = Object.freeze<CalibrationGrid>({
  prefillTokens: [0, 8, 24, 48, 64],
  decodeSeqs: [0, 1, 2, 4, 6],
  contextTokens: [32, 128, 384],
  cachedTokens: [0, 192],
  prefillChunks: [1, 2],
  decodeOnlySeqs: [8],
  layouts: ['packed', 'spread'],
  repetitions: 7,
});

/** What a served model asks of its engine, which its calibration grid must reach. */
export interface ServedLimits {
  /** Most sequences running at once (batching.maxRunning, at most the engine's slots). */
  maxRunning: number;
  /** Most tokens in one step (batching.tokenBudget). */
  tokenBudget: number;
  /** Cells of one sequence (contextTokens - 1). */
  cellsPerSequence: number;
}

/**
 * `base` (the default grid) stretched or cut to a served model: prefill chunks up to its token budget (doubling
 * from the base's largest), decodes beside a chunk only while a slot is left for it, decodes alone up to its
 * maxRunning, cached tokens that leave room for a full chunk, and contexts up to what a sequence's cells hold above
 * the calibration's own decodes (decodesPerRound): the largest context is added when the base's stop short of it by
 * more than a fifth. For the bench model (8 running, budget 64, 511 cells) it is the default grid.
 */
export function gridFor(limits: ServedLimits, base: CalibrationGrid = DEFAULT_GRID): CalibrationGrid {
  const budget = limits.tokenBudget;
  const prefillTokens = base.prefillTokens.filter((t) => t <= budget);
  for (let t = Math.max(...prefillTokens) * 2; t > 0 && prefillTokens.at(-1)! < budget; t *= 2) {
    prefillTokens.push(Math.min(t, budget));
  }
  const decodeSeqs = base.decodeSeqs.filter((d) => d < limits.maxRunning);
  const decodeOnlySeqs = [...(base.decodeOnlySeqs ?? []), limits.maxRunning].filter(
    (d, i, all) => d <= limits.maxRunning && d > Math.max(...decodeSeqs) && all.indexOf(d) === i,
  );
  const cachedTokens = (base.cachedTokens ?? [0]).filter((k) => k === 0 || k + budget <= limits.cellsPerSequence);
  const shaped = { ...base, prefillTokens, decodeSeqs, decodeOnlySeqs, cachedTokens };
  const top = limits.cellsPerSequence - decodesPerRound(shaped) - 2;
  const contextTokens = base.contextTokens.filter((c) => c <= top);
  if (contextTokens.length === 0 || top > Math.max(...contextTokens) * 1.2) contextTokens.push(top);
  return { ...shaped, contextTokens };
}

/** Untimed runs of a decode-only step before it is timed (CalibrationGrid.warmSteps). */
const DEFAULT_WARM_STEPS = 3;

/** Features of a sample, in the order of the coefficients. */
const features = (s: Omit<CalibrationSample, 'seconds'>): number[] => [
  1,
  s.prefillTokens,
  s.prefillCached ?? 0,
  s.decodeSeqs,
  s.contextTokens,
  prefillSeqsOf(s),
  passesOf(s),
  singlePassesOf(s),
];

/** Solves the least-squares problem min ‖Xb − y‖ through the normal equations, with column scaling and pivoting. */
export function leastSquares(rows: readonly (readonly number[])[], y: readonly number[]): number[] {
  const n = rows[0]?.length ?? 0;
  // Scale each column to unit max so tokens (hundreds) and pairs (tens of thousands) are comparable.
  const scale = Array.from({ length: n }, (_, j) => Math.max(1e-300, ...rows.map((r) => Math.abs(r[j]!))));
  const a = Array.from({ length: n }, () => new Array<number>(n + 1).fill(0));
  rows.forEach((r, i) => {
    for (let j = 0; j < n; j++) {
      for (let k = 0; k < n; k++) a[j]![k]! += (r[j]! / scale[j]!) * (r[k]! / scale[k]!);
      a[j]![n]! += (r[j]! / scale[j]!) * y[i]!;
    }
  });
  for (let col = 0; col < n; col++) {
    let pivot = col;
    for (let r = col + 1; r < n; r++) if (Math.abs(a[r]![col]!) > Math.abs(a[pivot]![col]!)) pivot = r;
    [a[col], a[pivot]] = [a[pivot]!, a[col]!];
    const p = a[col]![col]!;
    if (Math.abs(p) < 1e-12) continue; // a feature that never varies: its coefficient stays 0
    for (let r = 0; r < n; r++) {
      if (r === col) continue;
      const f = a[r]![col]! / p;
      for (let k = col; k <= n; k++) a[r]![k]! -= f * a[col]![k]!;
    }
  }
  return a.map((row, j) => (Math.abs(row[j]!) < 1e-12 ? 0 : row[n]! / row[j]! / scale[j]!));
}

/** The coefficients from a fitted vector in the order of the features (terms past its end are 0). */
export const toCoefficients = (b: readonly number[]): StepCoefficients => ({
  baseS: b[0]!,
  perPrefillTokenS: b[1]!,
  perPrefillPairS: 0,
  perPrefillCachedS: b[2]!,
  perDecodeSeqS: b[3]!,
  perContextTokenS: b[4]!,
  perPrefillSeqS: b[5]!,
  perPassS: b[6] ?? 0,
  perSinglePassS: b[7] ?? 0,
});

/** Fits the coefficients to the samples (minimising relative error); reports the fit's mean and max relative error. */
export function fitProfile(samples: readonly CalibrationSample[]): {
  coefficients: StepCoefficients;
  fit: EngineProfile['fit'];
} {
  // Each row divided by its measured time: least squares on relative error, so 1 ms steps count as much as 20 ms.
  const coefficients = toCoefficients(
    leastSquares(
      samples.map((s) => features(s).map((x) => x / s.seconds)),
      samples.map(() => 1),
    ),
  );
  return { coefficients, fit: fitOf(samples.map((s) => Math.abs(predictS(coefficients, s) - s.seconds) / s.seconds)) };
}

/** A fit's summary from each sample's relative error. */
export function fitOf(errors: readonly number[]): EngineProfile['fit'] {
  const meanRelError = errors.reduce((a, b) => a + b, 0) / Math.max(1, errors.length);
  return { points: errors.length, meanRelError, maxRelError: Math.max(0, ...errors) };
}

/** Filler prompt tokens: printable bytes, valid in any byte-level vocabulary. */
const filler = (n: number, salt: number): number[] => Array.from({ length: n }, (_, i) => 97 + ((i + salt) % 26));

/**
 * One shape of the grid: `prefill` tokens in `chunks` chunks (the first after `cached` tokens, a second one fresh),
 * beside `decode` decodes, its sequences in the slots of `layout`.
 */
interface GridShape {
  prefill: number;
  cached: number;
  chunks: number;
  decode: number;
  layout: SlotLayout;
}

/** The prefilling sequences of the calibration: the first continues after the cached tokens. */
const PREFILLING = ['cal.p', 'cal.q'] as const;

/** The chunk sizes of a shape's prefill: split as evenly as possible. */
const chunkSizes = (s: GridShape): number[] =>
  Array.from({ length: s.chunks }, (_, i) => Math.floor(s.prefill / s.chunks) + (i < s.prefill % s.chunks ? 1 : 0));

/** Whether the spread layout gives a shape other passes than the packed one (see CalibrationGrid.layouts): some
 * resident slots stay out of it, and at most one fresh chunk. */
const spreads = (s: Omit<GridShape, 'layout'>, resident: number): boolean =>
  s.decode >= 2 && s.decode < resident && s.chunks <= 1 && !s.cached;

/** The shapes of the grid worth timing (the context does not matter without decodes, nor the cache without prefill). */
const gridShapes = (grid: CalibrationGrid, context: number, resident: number): GridShape[] => {
  const first = context === grid.contextTokens[0];
  const base: Omit<GridShape, 'layout'>[] = grid.prefillTokens.flatMap((prefill) =>
    (prefill > 0 ? (grid.cachedTokens ?? [0]) : [0]).flatMap((cached) =>
      (prefill > 0 ? (grid.prefillChunks ?? [1]) : [0])
        .filter((chunks) => chunks <= Math.min(prefill, PREFILLING.length))
        .flatMap((chunks) =>
          grid.decodeSeqs
            .filter((decode) => (prefill > 0 || decode > 0) && (decode > 0 || first))
            .map((decode) => ({ prefill, cached, chunks, decode })),
        ),
    ),
  );
  for (const decode of grid.decodeOnlySeqs ?? []) base.push({ prefill: 0, cached: 0, chunks: 0, decode });
  const layouts = grid.layouts ?? ['packed', 'spread'];
  return base.flatMap((s) =>
    layouts.filter((layout) => layout === 'packed' || spreads(s, resident)).map((layout) => ({ ...s, layout })),
  );
};

/** The most decodes a resident decoding sequence runs in one round of the grid (timed and warming steps): how far
 * its context drifts above the grid's before it is set up again. */
export function decodesPerRound(grid: CalibrationGrid): number {
  const warm = grid.warmSteps ?? DEFAULT_WARM_STEPS;
  return gridShapes(grid, grid.contextTokens[0]!, Math.max(...grid.decodeSeqs))
    .filter((s) => s.decode > 0)
    .reduce((n, s) => n + (s.chunks === 0 ? 1 + warm : 1), 0);
}

/**
 * The slots of a shape's decoding sequences and chunks, with `resident` decoding sequences open in slots 0 … resident-1
 * and `slots` in all. Packed: the decodes are the top ones of the resident run (and those above it), the chunks follow
 * them: one run. Spread: the decodes take every other resident slot, the chunks the top slots.
 */
export function shapeSlots(shape: GridShape, resident: number, slots: number): { decode: number[]; chunks: number[] } {
  const n = shape.decode;
  if (shape.layout === 'spread') {
    const order = [...Array.from({ length: resident }, (_, i) => i).filter((i) => i % 2 === 0)];
    for (let i = 1; i < resident; i += 2) order.push(i);
    return { decode: order.slice(0, n), chunks: Array.from({ length: shape.chunks }, (_, i) => slots - 1 - i) };
  }
  const from = n <= resident ? resident - n : 0;
  const decode = Array.from({ length: n }, (_, i) => from + i);
  const top = Math.max(resident, n);
  return { decode, chunks: Array.from({ length: shape.chunks }, (_, i) => top + i) };
}

/** Prefills `tokens` of `seq` in steps of at most the engine's batch, sampling after the last when asked; the sequence
 * opens in `slot` (the lowest free one when absent). */
async function prefillChunked(
  engine: Engine,
  seq: string,
  tokens: readonly number[],
  sample: boolean,
  slot?: number,
): Promise<void> {
  const batch = engine.capacity().batchTokens;
  for (let at = 0; at < tokens.length; at += batch) {
    const chunk = tokens.slice(at, at + batch);
    const last = sample && at + batch >= tokens.length;
    await engine.step({
      items: [{ seq, kind: 'prefill', tokens: chunk, sample: last, ...(slot === undefined ? {} : { slot }) }],
    });
  }
}

/**
 * Opens the first prefilling sequence in `slot` holding `cached` tokens, untimed: the round's filler, kept in the slot
 * from the shape before when it holds them (the engine's prefix reuse), so shapes after the same cache do not
 * prefill it again; its last token is evaluated in this step, the shape's chunk follows it.
 */
async function openCached(engine: Engine, cached: number, round: number, slot: number): Promise<void> {
  const tokens = filler(cached, round);
  const item = { seq: PREFILLING[0], kind: 'prefill' as const, sample: false, slot };
  await engine.step({ items: [{ ...item, prefix: tokens.slice(0, -1), tokens: tokens.slice(-1) }] });
}

/** How a step is timed: wall time, or the process's CPU time (the engine's own cost on a shared CPU, one thread). */
export type StepTiming = 'wall' | 'cpu';

/** Runs one step and returns its seconds under `timing` and the passes it ran in. */
async function timeStep(
  engine: Engine,
  items: StepItem[],
  timing: StepTiming,
): Promise<{ seconds: number; passes: number }> {
  const cpu = process.cpuUsage();
  const { ms, passes } = await engine.step({ items });
  const used = process.cpuUsage(cpu);
  return { seconds: timing === 'wall' ? ms / 1e3 : (used.user + used.system) / 1e6, passes: passes ?? items.length };
}

/** One timed run of a shape: seconds, the decoding sequences' context, passes. */
type Run = [seconds: number, held: number, passes: number];

/** Where and when a shape is timed: resident decoding sequences, the engine's slots, their context, the round. */
interface ShapeRun {
  resident: number;
  slots: number;
  context: number;
  round: number;
  timing: StepTiming;
  warmSteps: number;
}

const decoder = (slot: number): string => `cal.d${slot}`;

/** Times one shape: its chunks (and decoding sequences above the resident ones) set up first, untimed, in the slots
 * of its layout, then the shaped step; its own sequences are freed after. */
async function timeShape(engine: Engine, shape: GridShape, o: ShapeRun): Promise<Run> {
  const { decode, chunks } = shapeSlots(shape, o.resident, o.slots);
  const extra = decode.filter((slot) => slot >= o.resident);
  for (const slot of extra) await prefillChunked(engine, decoder(slot), filler(o.context, slot), true, slot);
  if (shape.cached > 0) await openCached(engine, shape.cached, o.round, chunks[0]!);
  const items: StepItem[] = decode.map((slot) => ({ seq: decoder(slot), kind: 'decode' as const, slot }));
  chunkSizes(shape).forEach((n, i) => {
    const tokens = filler(n, o.round + 7 + i);
    items.push({ seq: PREFILLING[i]!, kind: 'prefill', tokens, sample: true, slot: chunks[i]! });
  });
  if (shape.chunks === 0) for (let i = 0; i < o.warmSteps; i++) await engine.step({ items });
  const used = engine.capacity().used;
  const held = decode.reduce((sum, slot) => sum + (used[decoder(slot)] ?? 0) + 1, 0);
  const { seconds, passes } = await timeStep(engine, items, o.timing);
  for (const seq of PREFILLING) await engine.free(seq);
  for (const slot of extra) await engine.free(decoder(slot));
  return [seconds, held, passes];
}

/**
 * A shape's sample from its runs: wall time, the fastest run (other tenants only add time); CPU time, the mean run (a
 * loaded machine also inflates CPU time, through shared caches and memory bandwidth, and the serving steps pay that
 * too: the simulation sums step times, so it needs their mean, and served steps' CPU time has a tail — on the bench
 * model a single decode's mean is ~15 % above its median, a 64-token chunk's ~3 %).
 */
function sampleOf(s: GridShape, runs: Run[], timing: StepTiming): CalibrationSample {
  const sorted = runs.sort((x, y) => x[0] - y[0]);
  const [fastest, held, passes] = sorted[timing === 'wall' ? 0 : Math.floor((sorted.length - 1) / 2)]!;
  const seconds = timing === 'wall' ? fastest : runs.reduce((sum, r) => sum + r[0], 0) / runs.length;
  const sizes = chunkSizes(s);
  return {
    prefillTokens: s.prefill,
    prefillPairs: sizes.reduce((sum, n, i) => sum + n * ((i === 0 ? s.cached : 0) + n / 2), 0),
    prefillCached: s.prefill > 0 ? s.cached : 0,
    prefillSeqs: sizes.length,
    decodeSeqs: s.decode,
    contextTokens: held,
    passes,
    seconds,
  };
}

/**
 * Times every shape of the grid on a loaded engine (sequences >= max decodeSeqs + prefill chunks, cells >= the
 * largest context plus the decodes of the calibration, and >= the largest cached + prefill). Repetitions go round the
 * whole grid, so a burst of load from other processes spreads over many shapes instead of skewing one; each shape
 * keeps its fastest time by wall time, its mean by CPU time (see sampleOf). With `timing: 'cpu'` a step is timed by
 * the CPU time the process spent in it, which a loaded machine inflates far less than wall time (valid for one engine
 * thread on the CPU). The resident decoding sequences (slots 0 … max decodeSeqs - 1) grow by one token per timed
 * decode, so contexts drift upwards during a run: each sample records the context it really had, and the passes the
 * engine ran it in.
 */
export async function measureGrid(
  engine: Engine,
  grid: CalibrationGrid,
  timing: StepTiming = 'wall',
): Promise<CalibrationSample[]> {
  const samples: CalibrationSample[] = [];
  const { sequences: slots, batchTokens } = engine.capacity();
  const resident = Math.min(Math.max(...grid.decodeSeqs), slots);
  const warmSteps = grid.warmSteps ?? DEFAULT_WARM_STEPS;
  for (const context of grid.contextTokens) {
    // A shape the engine cannot run as one batch is never planned on it either.
    const shapes = gridShapes(grid, context, resident)
      .filter((shape) => shape.prefill + shape.decode <= batchTokens && shape.decode + shape.chunks <= slots)
      .map((shape) => ({ shape, runs: [] as Run[] }));
    for (let round = -1; round < grid.repetitions; round++) {
      // Set-up steps, not timed: each resident decoding sequence holds `context` tokens and has a sampled token
      // pending (again each round, so the contexts drift by at most one round's decodes).
      for (let slot = 0; slot < resident; slot++) {
        await engine.free(decoder(slot));
        await prefillChunked(engine, decoder(slot), filler(context, slot), true, slot);
      }
      for (const s of shapes) {
        const run = await timeShape(engine, s.shape, { resident, slots, context, round, timing, warmSteps });
        if (round >= 0) s.runs.push(run); // the first round warms caches and threads up
      }
    }
    for (const s of shapes) samples.push(sampleOf(s.shape, s.runs, timing));
    for (let slot = 0; slot < resident; slot++) await engine.free(decoder(slot));
  }
  return samples;
}

/** Whether an accelerator runs (some of) the engine's layers: its steps then take wall time the process's CPU time
 * does not see (the CPU waits for the device). */
export const offloaded = (o: EngineOffload | undefined): boolean =>
  o !== undefined && o.backend !== 'cpu' && o.gpuLayers > 0;

/** The engine build and device of a loaded engine: node-llama-cpp's version, its build, and the GPUs that hold its
 * layers (beside the CPU's model when some layers stay on it), or the CPU's model alone. */
export async function engineOrigin(engine: Engine): Promise<ProfileOrigin> {
  const o = engine.capacity().offload;
  const cpu = cpus()[0]?.model.trim() || 'unknown CPU';
  const devices = !offloaded(o) ? [cpu] : o!.gpuLayers < o!.totalLayers ? [...o!.devices, cpu] : o!.devices;
  return { nodeLlamaCpp: await getModuleVersion(), build: o?.backend ?? 'cpu', devices };
}

/** The timing a calibration uses: the one asked for, but wall time whenever an accelerator runs the steps. */
export const timingFor = (engine: Engine, asked: StepTiming): StepTiming =>
  offloaded(engine.capacity().offload) ? 'wall' : asked;

/** Runs a calibration on a loaded engine and returns the fitted profile. */
export async function calibrate(
  engine: Engine,
  opts: { name: string; threads: number; loadS: number; grid?: CalibrationGrid; timing?: StepTiming },
): Promise<EngineProfile> {
  const timing = timingFor(engine, opts.timing ?? 'wall');
  const samples = await measureGrid(engine, opts.grid ?? DEFAULT_GRID, timing);
  const { coefficients, fit } = fitProfile(samples);
  const { sequences, cellsPerSequence, totalCells, batchTokens } = engine.capacity();
  return {
    kind: 'switchyard.engine-profile',
    version: 1,
    name: opts.name,
    engine: 'llama.cpp',
    model: engine.file,
    threads: opts.threads,
    fittedOn: await engineOrigin(engine),
    timing,
    machine: { cpus: availableParallelism(), platform: process.platform, arch: process.arch },
    loadS: opts.loadS,
    capacity: { sequences, cellsPerSequence, totalCells, batchTokens },
    coefficients,
    fit,
    samples,
  };
}
