// A cost model fitted to a real engine on this machine (an engine profile written by `switchyard calibrate`).
//
// The profile's step time is linear in nine features of a step (see actors/engine/calibrate.ts):
//
//   t = base + perPass · N  +  perPrefillToken · Σ T  +  perPrefillPair · Σ T·(K + T/2)  +  perPrefillCached · Σ K
//            + perDecodeSeq · B  +  perContextToken · C  +  perPrefillSeq · P  +  perSinglePass · S
//
// for a step run in N passes (llama.cpp micro-batches: see actors/batcher/slots.ts) holding P prefill chunks of T new
// tokens after K cached ones and B decoding sequences holding C context tokens in total, S of the passes of a
// decode-only step holding a single decode (singlePassesOf). A pass reads every weight once; a token costs its matrix
// work on top. The batcher gives each step its passes from the slots of its
// sequences (StepShape.passes); a shape without them (an estimate) is priced at the fewest its items can take.
// Profiles written before passes were counted have no perPass: their per-sequence terms carry a pass each (the engine
// then queued every sequence as a pass of its own), and they are priced as before.
// The CostModel built from it answers every question the roofline answers, from the profile instead: step times,
// KV blocks (the engine's real cache), load time. tp is 1 (one engine host per replica), so there is no all-reduce.
// The roofline model (cost-model.ts) stays the model of the published GPU profiles; this one sits behind the same
// interface, so the batcher, router, placement and simulator use either without knowing which.
import { readFileSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { createCostModel, DEFAULT_COST_PARAMS, type CostModel, type StepShape } from './cost-model.ts';
import { gpuProfile, modelProfile, type GpuProfile, type ModelProfile } from './profiles.ts';

/** Step-time coefficients in seconds; see the file header for the formula. */
export interface StepCoefficients {
  baseS: number;
  perPrefillTokenS: number;
  perPrefillPairS: number;
  perDecodeSeqS: number;
  perContextTokenS: number;
  /** Fixed cost of each prefill chunk (a sequence of the batch); absent in older profiles (0). */
  perPrefillSeqS?: number;
  /** Cost of each pass over the weights (a llama.cpp micro-batch); absent in older profiles (0). */
  perPassS?: number;
  /**
   * What a pass of a decode-only step holding one decode costs beside one holding several (negative: cheaper).
   * llama.cpp's CPU build multiplies the weights by one token with its matrix-vector kernel and by several with its
   * tiled matrix kernel, whose cost moves in steps of the tile: on the bench model one decode costs ~1.1 ms, two or
   * three in one pass ~2.3-2.5 ms, four ~3.4 ms. Absent in older profiles (0).
   */
  perSinglePassS?: number;
  /**
   * Cost of each cached token a prefill chunk attends over (its sequence's cells before it, K): the chunk reads them
   * once whatever its length, beside the pair term's T·K products. On llama.cpp's CPU build a short chunk after a
   * long cache pays mostly this read (on the ~100M model a 48-token chunk after 192 cached tokens costs 17 ms more
   * than a fresh one, a 256-token chunk 15-45 ms more); a fit with the pair term alone priced long chunks after a
   * cache up to 25 % slow. Absent in older profiles (0).
   */
  perPrefillCachedS?: number;
}

/** One measured step shape: its features and its (fastest) wall time. */
export interface CalibrationSample {
  prefillTokens: number;
  prefillPairs: number;
  /** Cached tokens the step's prefill chunks attend over, Σ K; absent in older profiles (0). */
  prefillCached?: number;
  decodeSeqs: number;
  contextTokens: number;
  /** Prefill chunks in the step; absent in older profiles (then 1 when prefillTokens > 0). */
  prefillSeqs?: number;
  /** Passes (micro-batches) the step ran in; absent in older profiles (then one per sequence, as they ran). */
  passes?: number;
  seconds: number;
}

/** The engine's cache as calibrated: slots, cells per sequence and in total, most tokens per step. */
export interface ProfileCapacity {
  sequences: number;
  cellsPerSequence: number;
  totalCells: number;
  batchTokens: number;
}

/** What a profile was fitted on besides its threads: the engine build and the device that ran the steps. */
export interface ProfileOrigin {
  /** node-llama-cpp's version (`3.22.1`). */
  nodeLlamaCpp: string;
  /** The llama.cpp build that ran the steps: `cpu`, `cuda`, `vulkan` or `metal`. */
  build: string;
  /** The GPU devices as node-llama-cpp names them, or the CPU model when the CPU ran the steps. */
  devices: string[];
}

/** A fitted engine profile, serialisable as JSON, from which a cost model is built by name. */
export interface EngineProfile {
  kind: 'switchyard.engine-profile';
  version: 1;
  name: string;
  engine: 'llama.cpp';
  model: string;
  threads: number;
  /** The engine build and device it was fitted on; absent in older profiles (read as unknown, see profileOrigin). */
  fittedOn?: ProfileOrigin;
  /** How steps were timed: wall time, or process CPU time (one engine thread on a shared CPU). Default wall. */
  timing?: 'wall' | 'cpu';
  machine: { cpus: number; platform: string; arch: string };
  loadS: number;
  capacity: ProfileCapacity;
  coefficients: StepCoefficients;
  fit: { points: number; meanRelError: number; maxRelError: number };
  samples: CalibrationSample[];
}

/** What a profile was fitted on: its own record, or `unknown` for each part an older profile did not record. */
export function profileOrigin(p: Pick<EngineProfile, 'fittedOn'>): ProfileOrigin {
  const o = p.fittedOn;
  return {
    nodeLlamaCpp: o?.nodeLlamaCpp || 'unknown',
    build: o?.build || 'unknown',
    devices: o?.devices.length ? o.devices : ['unknown'],
  };
}

/** One line naming what a profile was fitted on: `node-llama-cpp 3.22.1 cpu build on AMD EPYC, 1 thread`. */
export function describeOrigin(o: ProfileOrigin, threads: number | undefined): string {
  const t = threads === undefined ? 'unknown threads' : `${threads} thread${threads === 1 ? '' : 's'}`;
  return `node-llama-cpp ${o.nodeLlamaCpp} ${o.build} build on ${o.devices.join(' + ')}, ${t}`;
}

/** The parts of `here` that differ from where a profile was fitted (`there`), each as `what: there → here`; parts
 * either side does not know are left out. */
export function originDifferences(
  there: { origin: ProfileOrigin; threads: number },
  here: { origin: ProfileOrigin; threads: number },
): string[] {
  const out: string[] = [];
  const known = (x: string): boolean => x !== 'unknown';
  const part = (what: string, a: string, b: string): void => {
    if (known(a) && known(b) && a !== b) out.push(`${what}: ${a} → ${b}`);
  };
  part('node-llama-cpp', there.origin.nodeLlamaCpp, here.origin.nodeLlamaCpp);
  part('build', there.origin.build, here.origin.build);
  part('device', there.origin.devices.join(' + '), here.origin.devices.join(' + '));
  if (there.threads !== here.threads) out.push(`threads: ${there.threads} → ${here.threads}`);
  return out;
}

/** Prefill chunks of a sample (older profiles did not record them: one chunk when there was a prefill). */
export const prefillSeqsOf = (s: Omit<CalibrationSample, 'seconds'>): number =>
  s.prefillSeqs ?? (s.prefillTokens > 0 ? 1 : 0);

/** Passes of a sample (older profiles did not record them: every sequence ran as a pass of its own). */
export const passesOf = (s: Omit<CalibrationSample, 'seconds'>): number => s.passes ?? s.decodeSeqs + prefillSeqsOf(s);

/**
 * Passes of a decode-only step holding a single decode. A step's shape gives its decodes B and passes N, not how the
 * decodes split over the passes: at least 2N − B passes hold one, exactly so for N = 1, N = B and N = B − 1. Steps
 * with prefill count none: their decodes share a pass with a chunk's first token.
 */
export const singlePassesOf = (s: Omit<CalibrationSample, 'seconds'>): number =>
  s.prefillTokens > 0 ? 0 : Math.max(0, 2 * passesOf(s) - s.decodeSeqs);

/** Predicted seconds of a step's features under the coefficients. */
export function predictS(c: StepCoefficients, s: Omit<CalibrationSample, 'seconds'>): number {
  return (
    c.baseS +
    c.perPrefillTokenS * s.prefillTokens +
    c.perPrefillPairS * s.prefillPairs +
    (c.perPrefillCachedS ?? 0) * (s.prefillCached ?? 0) +
    c.perDecodeSeqS * s.decodeSeqs +
    c.perContextTokenS * s.contextTokens +
    (c.perPrefillSeqS ?? 0) * prefillSeqsOf(s) +
    (c.perPassS ?? 0) * passesOf(s) +
    (c.perSinglePassS ?? 0) * singlePassesOf(s)
  );
}

/** Step time of a StepShape under a profile; a step with no tokens costs 0, as in the roofline. */
export function profileStepS(profile: Pick<EngineProfile, 'coefficients'>, shape: StepShape): number {
  let prefillTokens = 0;
  let prefillPairs = 0;
  let prefillCached = 0;
  let prefillSeqs = 0;
  for (const chunk of shape.prefill) {
    if (chunk.tokens <= 0) continue;
    prefillSeqs++;
    prefillTokens += chunk.tokens;
    prefillPairs += chunk.tokens * (chunk.cached + chunk.tokens / 2);
    prefillCached += chunk.cached;
  }
  if (prefillTokens + shape.decodeBatch <= 0) return 0;
  const c = profile.coefficients;
  const s = {
    prefillTokens,
    prefillPairs,
    prefillCached,
    prefillSeqs,
    decodeSeqs: shape.decodeBatch,
    contextTokens: shape.decodeContext,
    // A profile without a pass term prices a pass into each sequence; its perPassS is 0 whatever the passes.
    passes: c.perPassS === undefined ? 0 : (shape.passes ?? shapeFewestPasses(shape)),
  };
  return Math.max(0, predictS(c, s));
}

/** The passes of a shape's items in consecutive slots in ascending order of tokens (actors/batcher/slots.ts'
 * fewestPasses): one per distinct token count, decodes counting one token. */
export function shapeFewestPasses(shape: StepShape): number {
  const counts: number[] = shape.decodeBatch > 0 ? [1] : [];
  for (const chunk of shape.prefill) if (chunk.tokens > 0 && !counts.includes(chunk.tokens)) counts.push(chunk.tokens);
  return counts.length;
}

/** The CPU "GPU" a profile runs on: only its name matters (memory is the profile's cache, not a budget). */
const ENGINE_DEVICE: GpuProfile = Object.freeze({ name: 'engine', memoryBytes: 0, hbmBytesPerS: 1, peakFlops: 1 });

/**
 * Builds the cost model of a calibrated engine. `model` is the profile of the config entry, kept for the few
 * readers of its shape (stateless batching); its maxContext becomes the engine's cells per sequence.
 */
export function createProfileCostModel(profile: EngineProfile, model: ModelProfile, gpu = ENGINE_DEVICE): CostModel {
  const cap = profile.capacity;
  const stepS = (shape: StepShape): number => profileStepS(profile, shape);
  const one = (tokens: number, cached: number): StepShape => ({
    prefill: [{ tokens, cached }],
    decodeBatch: 0,
    decodeContext: 0,
  });
  return {
    model: Object.freeze({ ...model, maxContext: cap.cellsPerSequence }),
    gpu,
    tp: 1,
    params: DEFAULT_COST_PARAMS,
    kvBytesPerToken: 0,
    weightsBytesPerGpu: 0,
    activationReserveBytesPerGpu: 0,
    kvBlocks: (blockTokens) => {
      if (!Number.isInteger(blockTokens) || blockTokens < 1) {
        throw new RangeError(`blockTokens must be a positive integer; got ${blockTokens}`);
      }
      return Math.floor(cap.totalCells / blockTokens);
    },
    step: (shape) => {
      const totalS = stepS(shape);
      return { linearS: totalS, attentionS: 0, allReduceS: 0, overheadS: 0, totalS, flops: 0, bytes: 0 };
    },
    stepS,
    prefillS: (tokens, cached) => (tokens > 0 ? stepS(one(tokens, cached)) : 0),
    decodeS: (batch, contextTokens) => stepS({ prefill: [], decodeBatch: batch, decodeContext: contextTokens }),
    linearS: (tokens) => (tokens > 0 ? stepS(one(tokens, 0)) : 0),
    loadS: () => profile.loadS,
    fits: () => cap.cellsPerSequence >= 1,
  };
}

/** Thrown when a profile file is missing, unreadable or not an engine profile; the message names the file. */
export class EngineProfileError extends Error {
  override readonly name = 'EngineProfileError';
  constructor(
    readonly file: string,
    message: string,
  ) {
    super(`engine profile ${file}: ${message}`);
  }
}

const finite = (x: unknown): boolean => typeof x === 'number' && Number.isFinite(x);

/** Reads and checks an engine profile file. */
export function readEngineProfile(file: string): EngineProfile {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new EngineProfileError(file, `cannot be read as JSON (${(e as Error).message})`);
  }
  const p = raw as Partial<EngineProfile>;
  if (p?.kind !== 'switchyard.engine-profile' || p.version !== 1) {
    throw new EngineProfileError(file, 'is not a switchyard engine profile (kind/version)');
  }
  const c = p.coefficients as unknown as Record<string, unknown> | undefined;
  const keys: (keyof StepCoefficients)[] = [
    'baseS',
    'perPrefillTokenS',
    'perPrefillPairS',
    'perDecodeSeqS',
    'perContextTokenS',
  ];
  const optional: (keyof StepCoefficients)[] = ['perPrefillSeqS', 'perPassS', 'perSinglePassS', 'perPrefillCachedS'];
  if (!c || !keys.every((k) => finite(c[k])) || !optional.every((k) => c[k] === undefined || finite(c[k]))) {
    throw new EngineProfileError(file, 'has no valid coefficients');
  }
  const cap = p.capacity as unknown as Record<string, unknown> | undefined;
  if (!cap || !['sequences', 'cellsPerSequence', 'totalCells', 'batchTokens'].every((k) => finite(cap[k]))) {
    throw new EngineProfileError(file, 'has no valid capacity');
  }
  if (!finite(p.loadS) || typeof p.name !== 'string') throw new EngineProfileError(file, 'has no name or loadS');
  const o = p.fittedOn as unknown as Record<string, unknown> | undefined;
  const origin = (x: Record<string, unknown>): boolean =>
    typeof x['nodeLlamaCpp'] === 'string' &&
    typeof x['build'] === 'string' &&
    Array.isArray(x['devices']) &&
    x['devices'].every((d) => typeof d === 'string');
  if (o !== undefined && (o === null || typeof o !== 'object' || !origin(o))) {
    throw new EngineProfileError(file, 'has an invalid fittedOn (nodeLlamaCpp, build, devices)');
  }
  return p as EngineProfile;
}

/** Prefix of the model key (the `model` of a gpu.assign) naming a calibrated profile file instead of a profile. */
export const CALIBRATED_PREFIX = 'calibrated:';
/** Prefix of the model key of an uncalibrated llama.cpp model: its cost follows from its GGUF file's size. */
export const SIZED_PREFIX = 'sized:';

/** The engine of a model entry, as far as its default cost needs it. */
export interface SizedEngine {
  file: string;
  threads: number;
  sequences: number;
  contextTokens: number;
  batchTokens?: number;
}

/**
 * Rough figures of one CPU core running llama.cpp, for a model nobody has calibrated (measured on the development
 * machine with the 26 MB bench model: a pass over the weights ~3 ms, ~1 ms of matrix work per token).
 */
const CPU_DEFAULT = Object.freeze({ bytesPerS: 8e9, flopsPerThreadS: 26e9, loadBaseS: 2, loadBytesPerS: 1e9 });

/**
 * The default profile of an uncalibrated llama.cpp model, from its GGUF size alone: each pass of a step (a
 * micro-batch of sequences in consecutive slots) reads the weights once (bytes ÷ memory bandwidth), each token costs
 * two FLOPs per parameter (parameters ≈ bytes ÷ 2, F16), attention is left out. An order of magnitude for routing and
 * admission until `switchyard calibrate` measures the engine; never presented as a fit (its fit has 0 points).
 */
export function sizedEngineProfile(fileBytes: number, e: Omit<SizedEngine, 'file'>): EngineProfile {
  const passS = fileBytes / CPU_DEFAULT.bytesPerS;
  const tokenS = fileBytes / (CPU_DEFAULT.flopsPerThreadS * Math.max(1, e.threads));
  return {
    kind: 'switchyard.engine-profile',
    version: 1,
    name: `sized-${fileBytes}`,
    engine: 'llama.cpp',
    model: '',
    threads: e.threads,
    machine: { cpus: 0, platform: 'default', arch: 'default' },
    loadS: CPU_DEFAULT.loadBaseS + fileBytes / CPU_DEFAULT.loadBytesPerS,
    capacity: {
      sequences: e.sequences,
      cellsPerSequence: e.contextTokens - 1,
      totalCells: e.sequences * e.contextTokens,
      batchTokens: e.batchTokens ?? e.contextTokens,
    },
    coefficients: {
      baseS: 0,
      perPrefillTokenS: tokenS,
      perPrefillPairS: 0,
      perDecodeSeqS: tokenS,
      perContextTokenS: 0,
      perPrefillSeqS: 0,
      perPassS: passS,
    },
    fit: { points: 0, meanRelError: 0, maxRelError: 0 },
    samples: [],
  };
}

/**
 * The model key a worker builds a replica's cost model from: the calibrated profile file; for an uncalibrated
 * llama.cpp model whose file exists, its size and cache (the default above); else the profile name (the roofline).
 */
export function costModelKey(model: { profile: string; calibration?: string; engine?: SizedEngine }): string {
  if (model.calibration) return `${CALIBRATED_PREFIX}${resolve(model.calibration)}|${model.profile}`;
  const e = model.engine;
  if (!e) return model.profile;
  let bytes: number;
  try {
    bytes = statSync(e.file).size;
  } catch {
    return model.profile; // not written yet (a generated model) or unreadable: refused when the engine loads
  }
  const fields = [bytes, e.threads, e.sequences, e.contextTokens, e.batchTokens ?? e.contextTokens];
  return `${SIZED_PREFIX}${fields.join(':')}|${model.profile}`;
}

const profileCache = new Map<string, EngineProfile>();

/** Reads a profile file once per process (simulate, plan and the worker all ask for the same file). */
export function engineProfileAt(file: string): EngineProfile {
  const path = resolve(file);
  let p = profileCache.get(path);
  if (!p) {
    p = readEngineProfile(path);
    profileCache.set(path, p);
  }
  return p;
}

/** The cost model of a model key (see costModelKey) on `gpuType` with `tp` ranks: calibrated or the roofline. */
export function costModelFor(key: string, gpuType: string, tp: number): CostModel {
  if (key.startsWith(SIZED_PREFIX)) {
    const [fields, profile] = key.slice(SIZED_PREFIX.length).split('|') as [string, string];
    const [bytes, threads, sequences, contextTokens, batchTokens] = fields.split(':').map(Number) as number[];
    const sized = sizedEngineProfile(bytes!, {
      threads: threads!,
      sequences: sequences!,
      contextTokens: contextTokens!,
    });
    sized.capacity.batchTokens = batchTokens!;
    // One engine host runs the replica over all its GPUs (tp ranks): its cost does not divide by tp.
    return createProfileCostModel(sized, modelProfile(profile));
  }
  if (!key.startsWith(CALIBRATED_PREFIX)) return createCostModel(modelProfile(key), gpuProfile(gpuType), tp);
  const rest = key.slice(CALIBRATED_PREFIX.length);
  const bar = rest.lastIndexOf('|');
  const profile = engineProfileAt(rest.slice(0, bar));
  if (tp !== 1) throw new RangeError(`a calibrated engine runs as one host (tp 1); got tp ${tp}`);
  return createProfileCostModel(profile, modelProfile(rest.slice(bar + 1)));
}
