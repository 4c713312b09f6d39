// Static hardware and model descriptions that the cost model turns into step times and memory budgets.
// Memory sizes use GB = 1e9 bytes throughout.

/** A GPU type: memory capacity, HBM bandwidth and dense bf16 peak throughput. */
export interface GpuProfile {
  name: string;
  memoryBytes: number;
  hbmBytesPerS: number;
  /** Dense bf16 tensor-core peak, FLOP/s. */
  peakFlops: number;
}

/** A decoder-only transformer: the shape numbers the roofline needs plus weight size on disk/in HBM. */
export interface ModelProfile {
  name: string;
  layers: number;
  hidden: number;
  qHeads: number;
  kvHeads: number;
  headDim: number;
  ffn: number;
  vocab: number;
  weightBytes: number;
  dtypeBytes: number;
  maxContext: number;
}

/** Known GPU types, keyed by the name used in configs and scenarios. */
export const GPU_PROFILES: Readonly<Record<string, GpuProfile>> = Object.freeze({
  'H100-SXM': Object.freeze({ name: 'H100-SXM', memoryBytes: 80e9, hbmBytesPerS: 3.35e12, peakFlops: 989e12 }),
  H200: Object.freeze({ name: 'H200', memoryBytes: 141e9, hbmBytesPerS: 4.8e12, peakFlops: 989e12 }),
  'A100-80GB': Object.freeze({ name: 'A100-80GB', memoryBytes: 80e9, hbmBytesPerS: 2.04e12, peakFlops: 312e12 }),
});

const LLAMA_3_70B_SHAPE = {
  layers: 80,
  hidden: 8192,
  qHeads: 64,
  kvHeads: 8,
  headDim: 128,
  ffn: 28672,
  vocab: 128256,
  maxContext: 8192,
};

/** Known models, keyed by the name used in configs and scenarios. */
export const MODEL_PROFILES: Readonly<Record<string, ModelProfile>> = Object.freeze({
  'llama-3-8b': Object.freeze({
    name: 'llama-3-8b',
    layers: 32,
    hidden: 4096,
    qHeads: 32,
    kvHeads: 8,
    headDim: 128,
    ffn: 14336,
    vocab: 128256,
    weightBytes: 16.1e9,
    dtypeBytes: 2,
    maxContext: 8192,
  }),
  'llama-3-70b': Object.freeze({ name: 'llama-3-70b', ...LLAMA_3_70B_SHAPE, weightBytes: 141e9, dtypeBytes: 2 }),
  // Weight-quantized FP8 (with an FP8 KV cache): half the bytes, so it fits TP-4 with room for KV.
  'llama-3-70b-fp8': Object.freeze({
    name: 'llama-3-70b-fp8',
    ...LLAMA_3_70B_SHAPE,
    weightBytes: 70.5e9,
    dtypeBytes: 1,
  }),
});

/** Thrown when a GPU or model name is not in the profile tables; the message lists the known names. */
export class UnknownProfileError extends Error {
  override readonly name = 'UnknownProfileError';
  constructor(
    readonly kind: 'gpu' | 'model',
    readonly requested: string,
    readonly known: readonly string[],
  ) {
    super(`unknown ${kind} profile '${requested}'; known ${kind} profiles: ${known.join(', ')}`);
  }
}

/** Looks up a GPU profile by name, throwing UnknownProfileError for names not in GPU_PROFILES. */
export function gpuProfile(name: string): GpuProfile {
  const found = Object.hasOwn(GPU_PROFILES, name) ? GPU_PROFILES[name] : undefined;
  if (found === undefined) throw new UnknownProfileError('gpu', name, Object.keys(GPU_PROFILES));
  return found;
}

/** Looks up a model profile by name, throwing UnknownProfileError for names not in MODEL_PROFILES. */
export function modelProfile(name: string): ModelProfile {
  const found = Object.hasOwn(MODEL_PROFILES, name) ? MODEL_PROFILES[name] : undefined;
  if (found === undefined) throw new UnknownProfileError('model', name, Object.keys(MODEL_PROFILES));
  return found;
}
