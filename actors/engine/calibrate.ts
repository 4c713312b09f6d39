// Calibration: times the real engine over a grid of step shapes and fits step-time coefficients (least squares).
//
// The fitted model is linear in six features of a step, the same quantities the roofline cost model
// (actors/gpu/cost-model.ts) derives from a StepShape:
//
//   t = base + perPrefillToken · Σ T  +  perPrefillPair · Σ T·(K + T/2)  +  perDecodeSeq · B  +  perContextToken · C
//            + perPrefillSeq · P   (P prefill chunks: each sequence of a batch pays a fixed cost in llama.cpp)
//
// for prefill chunks of T new tokens after K cached ones, B decoding sequences holding C context tokens in total.
// Building a CostModel from a profile: stepS(shape) = profileStepS(profile, shape) (actors/gpu/profile-cost-model.ts); prefillS(T, K) is the
// same with one chunk and B = C = 0; decodeS(B, C) with no chunks; a step with no tokens costs 0, as in the roofline;
// kvBlocks(blockTokens) = floor(capacity.totalCells / blockTokens), but a sequence may never hold more than
// capacity.cellsPerSequence cells (the stock llama.cpp build gives each sequence a fixed block); loadS() is
// profile.loadS. tp is 1 (one engine host per replica), so there is no all-reduce term.
import { availableParallelism } from 'node:os';
import {
  predictS,
  prefillSeqsOf,
  type CalibrationSample,
  type EngineProfile,
  type StepCoefficients,
} from '../gpu/profile-cost-model.ts';
import type { Engine, StepItem } from './engine.ts';

// The profile types and the step-time formula live with the cost model built from them (actors/gpu).
export { predictS, profileStepS } from '../gpu/profile-cost-model.ts';
export type { CalibrationSample, EngineProfile, StepCoefficients } from '../gpu/profile-cost-model.ts';

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
  repetitions: number;
}

/**
 * The default grid: 171 shapes — one or two prefill chunks (fresh, or continuing after 192 cached tokens) beside 0 to
 * 6 decodes at three contexts — 7 repetitions each. Prefills stop at 64 tokens, the largest chunk a step of the
 * benchmarks' budget holds: larger ones would pull the fit towards shapes that are never served.
 */
export const DEFAULT_GRID: CalibrationGrid = Object.freeze({
  prefillTokens: [0, 8, 24, 48, 64],
  decodeSeqs: [0, 1, 2, 4, 6],
  contextTokens: [32, 128, 384],
  cachedTokens: [0, 192],
  prefillChunks: [1, 2],
  repetitions: 7,
});

/** Features of a sample, in the order of the coefficients. */
const features = (s: Omit<CalibrationSample, 'seconds'>): number[] => [
  1,
  s.prefillTokens,
  s.prefillPairs,
  s.decodeSeqs,
  s.contextTokens,
  prefillSeqsOf(s),
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

const toCoefficients = (b: readonly number[]): StepCoefficients => ({
  baseS: b[0]!,
  perPrefillTokenS: b[1]!,
  perPrefillPairS: b[2]!,
  perDecodeSeqS: b[3]!,
  perContextTokenS: b[4]!,
  perPrefillSeqS: b[5]!,
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
  const errors = samples.map((s) => Math.abs(predictS(coefficients, s) - s.seconds) / s.seconds);
  const meanRelError = errors.reduce((a, b) => a + b, 0) / Math.max(1, errors.length);
  return { coefficients, fit: { points: samples.length, meanRelError, maxRelError: Math.max(0, ...errors) } };
}

/** Filler prompt tokens: printable bytes, valid in any byte-level vocabulary. */
const filler = (n: number, salt: number): number[] => Array.from({ length: n }, (_, i) => 97 + ((i + salt) % 26));

/**
 * One shape of the grid: `prefill` tokens in `chunks` chunks (the first after `cached` tokens, a second one fresh),
 * beside `decode` decodes.
 */
interface GridShape {
  prefill: number;
  cached: number;
  chunks: number;
  decode: number;
}

/** The prefilling sequences of the calibration: the first continues after the cached tokens. */
const PREFILLING = ['cal.p', 'cal.q'] as const;

/** The chunk sizes of a shape's prefill: split as evenly as possible. */
const chunkSizes = (s: GridShape): number[] =>
  Array.from({ length: s.chunks }, (_, i) => Math.floor(s.prefill / s.chunks) + (i < s.prefill % s.chunks ? 1 : 0));

/** The shapes of the grid worth timing (the context does not matter without decodes, nor the cache without prefill). */
const gridShapes = (grid: CalibrationGrid, context: number): GridShape[] =>
  grid.prefillTokens.flatMap((prefill) =>
    (prefill > 0 ? (grid.cachedTokens ?? [0]) : [0]).flatMap((cached) =>
      (prefill > 0 ? (grid.prefillChunks ?? [1]) : [0])
        .filter((chunks) => chunks <= Math.min(prefill, PREFILLING.length))
        .flatMap((chunks) =>
          grid.decodeSeqs
            .filter((decode) => (prefill > 0 || decode > 0) && (decode > 0 || context === grid.contextTokens[0]))
            .map((decode) => ({ prefill, cached, chunks, decode })),
        ),
    ),
  );

/** Prefills `tokens` of `seq` in steps of at most the engine's batch, sampling after the last when asked. */
async function prefillChunked(engine: Engine, seq: string, tokens: readonly number[], sample: boolean): Promise<void> {
  const batch = engine.capacity().batchTokens;
  for (let at = 0; at < tokens.length; at += batch) {
    const chunk = tokens.slice(at, at + batch);
    await engine.step({
      items: [{ seq, kind: 'prefill', tokens: chunk, sample: sample && at + batch >= tokens.length }],
    });
  }
}

/** How a step is timed: wall time, or the process's CPU time (the engine's own cost on a shared CPU, one thread). */
export type StepTiming = 'wall' | 'cpu';

/** Runs one step and returns its seconds under `timing`. */
async function timeStep(engine: Engine, items: StepItem[], timing: StepTiming): Promise<number> {
  const cpu = process.cpuUsage();
  const { ms } = await engine.step({ items });
  if (timing === 'wall') return ms / 1e3;
  const used = process.cpuUsage(cpu);
  return (used.user + used.system) / 1e6;
}

/**
 * Times every shape of the grid on a loaded engine (sequences >= max decodeSeqs + 1, cells >= the largest context
 * plus the decodes of the calibration, and >= the largest cached + prefill). Repetitions go round the whole grid, so a
 * burst of load from other processes spreads over many shapes instead of skewing one, and each shape keeps its
 * fastest time: other work on a shared machine only ever adds time, so the minimum is the engine's own cost. With
 * `timing: 'cpu'` a step is timed by the CPU time the process spent in it, which a loaded machine inflates far less
 * than wall time (valid for one engine thread on the CPU), and each shape keeps its median. The decoding sequences grow by one token per timed
 * decode, so contexts drift upwards during a run: each sample records the context it really had.
 */
export async function measureGrid(
  engine: Engine,
  grid: CalibrationGrid,
  timing: StepTiming = 'wall',
): Promise<CalibrationSample[]> {
  const samples: CalibrationSample[] = [];
  const decoding = Array.from({ length: Math.max(...grid.decodeSeqs) }, (_, i) => `cal.d${i}`);
  for (const context of grid.contextTokens) {
    // A shape the engine cannot run as one batch is never planned on it either.
    const shapes = gridShapes(grid, context)
      .filter((shape) => shape.prefill + shape.decode <= engine.capacity().batchTokens)
      .map((shape) => ({ ...shape, runs: [] as [number, number][] }));
    for (let r = -1; r < grid.repetitions; r++) {
      // Set-up steps, not timed: each decoding sequence holds `context` tokens and has a sampled token pending
      // (again each round, so the contexts drift by at most one round's decodes).
      for (const [i, seq] of decoding.entries()) {
        await engine.free(seq);
        await prefillChunked(engine, seq, filler(context, i), true);
      }
      for (const shape of shapes) {
        if (shape.cached > 0) await prefillChunked(engine, 'cal.p', filler(shape.cached, r), false);
        const items: StepItem[] = decoding.slice(0, shape.decode).map((seq) => ({ seq, kind: 'decode' as const }));
        chunkSizes(shape).forEach((n, i) => {
          items.push({ seq: PREFILLING[i]!, kind: 'prefill', tokens: filler(n, r + 7 + i), sample: true });
        });
        const used = engine.capacity().used;
        const held = decoding.slice(0, shape.decode).reduce((sum, seq) => sum + (used[seq] ?? 0) + 1, 0);
        const seconds = await timeStep(engine, items, timing);
        for (const seq of PREFILLING) await engine.free(seq);
        if (r < 0) continue; // the first round warms caches and threads up
        shape.runs.push([seconds, held]);
      }
    }
    for (const s of shapes) {
      // Wall time: the fastest run (other tenants only add time). CPU time: the median run (a loaded machine also
      // inflates CPU time, through shared caches and memory bandwidth, and the serving steps pay that too).
      const sorted = s.runs.sort((x, y) => x[0] - y[0]);
      const [seconds, held] = sorted[timing === 'wall' ? 0 : Math.floor((sorted.length - 1) / 2)]!;
      const sizes = chunkSizes(s);
      samples.push({
        prefillTokens: s.prefill,
        prefillPairs: sizes.reduce((sum, n, i) => sum + n * ((i === 0 ? s.cached : 0) + n / 2), 0),
        prefillSeqs: sizes.length,
        decodeSeqs: s.decode,
        contextTokens: held,
        seconds,
      });
    }
    for (const seq of decoding) await engine.free(seq);
  }
  return samples;
}

/** Runs a calibration on a loaded engine and returns the fitted profile. */
export async function calibrate(
  engine: Engine,
  opts: { name: string; threads: number; loadS: number; grid?: CalibrationGrid; timing?: StepTiming },
): Promise<EngineProfile> {
  const timing = opts.timing ?? 'wall';
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
    timing,
    machine: { cpus: availableParallelism(), platform: process.platform, arch: process.arch },
    loadS: opts.loadS,
    capacity: { sequences, cellsPerSequence, totalCells, batchTokens },
    coefficients,
    fit,
    samples,
  };
}
