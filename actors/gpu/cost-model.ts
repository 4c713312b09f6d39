// The one step-time and memory model for a tensor-parallel replica: a roofline over bytes moved and FLOPs per rank.
//
// Combination rule. A pure max(memory, compute) roofline is ~20 % low in the middle of the token curve, where
// neither term dominates and the GEMMs neither saturate HBM nor the tensor cores. We combine the two terms with a
// p-norm, t = (m^p + c^p)^(1/p), p = 2: equal to the larger term at both ends, sqrt(2) x max where they cross.
// Fitted against ten published linear-layer iteration times (A100 Llama-3-8B TP1 and H100 Llama-3-70B TP8 at
// 1-4096 tokens) with etaMem 0.7 / etaCompute 0.6, p = 2 keeps every point within 17.2 % (p = 1.5 and p = 3 both
// break 20 %). The same combination is applied to the whole step in step()/stepS().
//
// Accounting choices (all per rank; TP splits weights, heads, KV and FLOPs by tp, which must divide kvHeads):
// - Bytes: the linear weights (transformer blocks + LM head) are streamed once per iteration whatever the batch;
//   the input embedding is a row gather and is not counted. KV of the context each token attends to is read
//   (decode context and the already-cached prefix of each prefill chunk); KV of every new token is written.
// - FLOPs: 2 * blockParams per token; the LM head only runs on rows that are sampled, one per decoding sequence and
//   one per prefill chunk (vLLM computes logits at the last scheduled position of each request). Attention is
//   4 * layers * qHeads * headDim / tp per query-key pair: T * (K + T/2) pairs for a prefill chunk, the context
//   length for a decoding sequence.
// - step() applies one roofline to the step's total bytes and FLOPs; linearS is the roofline of the linear part
//   alone and attentionS is what the attention bytes and FLOPs add on top of it.
// - KV budget per GPU: gpuMemoryUtilization * memory - weights/tp - reserve, where the reserve is 1 GB (context,
//   graphs, NCCL) + bf16 activations of a maxContext-token profiling run + 256 rows of fp32 logits.
// - All-reduce: two per layer (after attention and after the MLP), ring cost alpha + bytes/beta with bf16
//   activations (2 bytes, also for FP8-weight models, whose activations stay bf16).
// - A step with no tokens costs exactly 0 (no CPU overhead either).

import type { GpuProfile, ModelProfile } from './profiles.ts';

/** Tunable efficiencies and fixed costs of the roofline; see DEFAULT_COST_PARAMS for the calibrated values. */
export interface CostParams {
  /** Achievable fraction of HBM bandwidth. */
  etaMem: number;
  /** Achievable fraction of dense bf16 peak FLOP/s. */
  etaCompute: number;
  /** Per all-reduce latency, seconds. */
  allReduceAlphaS: number;
  /** All-reduce bus bandwidth per GPU, bytes/s. */
  allReduceBytesPerS: number;
  /** Host-side scheduling/launch overhead per iteration, seconds. */
  cpuOverheadS: number;
  /** Weight load bandwidth per GPU from host, bytes/s. */
  loadBytesPerS: number;
  /** Engine start-up before weights load (process, CUDA context, NCCL), seconds. */
  engineInitS: number;
  /** Warm-up after weights load (profiling run, CUDA graph capture), seconds. */
  warmupS: number;
  /** Fraction of GPU memory the engine may use (vLLM gpu_memory_utilization). */
  gpuMemoryUtilization: number;
}

/** Calibrated defaults for CostParams. */
export const DEFAULT_COST_PARAMS: CostParams = Object.freeze({
  etaMem: 0.7,
  etaCompute: 0.6,
  allReduceAlphaS: 25e-6,
  allReduceBytesPerS: 200e9,
  cpuOverheadS: 0.002,
  loadBytesPerS: 5e9,
  engineInitS: 8,
  warmupS: 2,
  gpuMemoryUtilization: 0.9,
});

/** T new tokens of one sequence processed after K tokens of the same sequence already in the KV cache. */
export interface PrefillChunk {
  tokens: number;
  cached: number;
}

/** What one engine iteration processes: prefill chunks plus one token for each decoding sequence. */
export interface StepShape {
  prefill: readonly PrefillChunk[];
  decodeBatch: number;
  /** Total context tokens across the decoding sequences. */
  decodeContext: number;
  /**
   * Passes over the weights the engine runs the step in: llama.cpp with a cache stream per sequence splits a batch
   * into micro-batches of sequences in consecutive slots (actors/batcher/slots.ts), and the batcher counts them
   * from its slots. Absent (an estimate, a shape built by hand): one per distinct token count. A vLLM engine
   * runs every step in one pass: the roofline below does not read it.
   */
  passes?: number;
}

/** Where one iteration's time goes; linearS + attentionS + allReduceS + overheadS = totalS. */
export interface StepBreakdown {
  /** Roofline time of the linear layers alone. */
  linearS: number;
  /** Extra roofline time that attention (KV reads/writes, attention FLOPs) adds on top of the linear layers. */
  attentionS: number;
  allReduceS: number;
  overheadS: number;
  totalS: number;
  /** FLOPs per rank. */
  flops: number;
  /** HBM bytes moved per rank. */
  bytes: number;
}

/** Step times, load time and KV capacity of one replica of a model on tp GPUs of one type. */
export interface CostModel {
  readonly model: ModelProfile;
  readonly gpu: GpuProfile;
  readonly tp: number;
  readonly params: CostParams;
  /** KV cache bytes per token for the whole model (all ranks). */
  kvBytesPerToken: number;
  /** Weight bytes resident on each GPU: weightBytes / tp. */
  weightsBytesPerGpu: number;
  /** Memory per GPU held back from the KV cache for activations, CUDA context, graphs and NCCL buffers. */
  activationReserveBytesPerGpu: number;
  /** KV blocks of blockTokens tokens that fit in the replica (floor, never negative). */
  kvBlocks(blockTokens: number): number;
  /** Time breakdown of one mixed iteration (chunked prefill + decodes). */
  step(shape: StepShape): StepBreakdown;
  /** step(shape).totalS without allocating; the simulator's per-step hot path. */
  stepS(shape: StepShape): number;
  /** Time of a prefill-only step of `tokens` new tokens after `cached` cached ones. */
  prefillS(tokens: number, cached: number): number;
  /** Time of a decode-only step of `batch` sequences holding `contextTokens` context tokens in total. */
  decodeS(batch: number, contextTokens: number): number;
  /** Linear layers only for `tokens` tokens of one sequence in one iteration (one sampled LM-head row). */
  linearS(tokens: number): number;
  /** Seconds from starting an engine to serving: weight load + engine init + warm-up. */
  loadS(): number;
  /** Whether the weights per GPU leave room for at least one maxContext-long sequence of KV. */
  fits(): boolean;
}

/** Activations (and hence all-reduce messages) are bf16 regardless of weight dtype. */
const ACTIVATION_BYTES = 2;
/** CUDA context, NCCL buffers, CUDA graphs and allocator slack per GPU. */
const FIXED_RESERVE_BYTES = 1e9;
/** Rows of fp32 logits the start-up profiling run materialises (vLLM max_num_seqs default). */
const PROFILE_SAMPLED_ROWS = 256;

/** Builds the cost model of one replica; tp must be a positive integer dividing the model's q and kv heads. */
export function createCostModel(
  model: ModelProfile,
  gpu: GpuProfile,
  tp: number,
  params: Partial<CostParams> = {},
): CostModel {
  if (!Number.isInteger(tp) || tp < 1 || model.kvHeads % tp !== 0 || model.qHeads % tp !== 0) {
    throw new RangeError(
      `tp must be a positive integer dividing qHeads (${model.qHeads}) and kvHeads (${model.kvHeads}) of ${model.name}; got ${tp}`,
    );
  }
  const p: CostParams = Object.freeze({ ...DEFAULT_COST_PARAMS, ...params });
  const { layers, hidden, qHeads, kvHeads, headDim, ffn, vocab, dtypeBytes } = model;

  const blockParams = layers * (hidden * (2 * qHeads * headDim + 2 * kvHeads * headDim) + 3 * hidden * ffn);
  const lmHeadParams = vocab * hidden;
  const linearWeightBytes = ((blockParams + lmHeadParams) * dtypeBytes) / tp;
  const kvBytesPerToken = 2 * layers * kvHeads * headDim * dtypeBytes;
  const kvBytesPerTokenPerRank = kvBytesPerToken / tp;
  const weightsBytesPerGpu = model.weightBytes / tp;
  const memBytesPerS = gpu.hbmBytesPerS * p.etaMem;
  const flopsPerS = gpu.peakFlops * p.etaCompute;
  const attnFlopsPerPair = (4 * layers * qHeads * headDim) / tp;
  const allReduceBytesPerToken = (hidden * ACTIVATION_BYTES * 2 * (tp - 1)) / tp;
  const activationReserveBytesPerGpu =
    FIXED_RESERVE_BYTES +
    model.maxContext * (3 * (ffn / tp) + 4 * hidden) * ACTIVATION_BYTES +
    PROFILE_SAMPLED_ROWS * (vocab / tp) * 4;
  const kvBudgetBytesPerGpu = Math.max(
    0,
    p.gpuMemoryUtilization * gpu.memoryBytes - weightsBytesPerGpu - activationReserveBytesPerGpu,
  );

  // The p = 2 norm of memory time and compute time (see the header comment).
  const roofline = (bytes: number, flops: number): number => {
    const m = bytes / memBytesPerS;
    const c = flops / flopsPerS;
    return Math.sqrt(m * m + c * c);
  };
  const linearFlops = (tokens: number, sampledRows: number): number =>
    (2 * (blockParams * tokens + lmHeadParams * sampledRows)) / tp;
  const allReduceS = (tokens: number): number =>
    tp === 1 ? 0 : 2 * layers * (p.allReduceAlphaS + (tokens * allReduceBytesPerToken) / p.allReduceBytesPerS);
  const stepBytes = (tokens: number, kvReadTokens: number): number =>
    linearWeightBytes + (kvReadTokens + tokens) * kvBytesPerTokenPerRank;
  const stepFlops = (tokens: number, sampledRows: number, attnPairs: number): number =>
    linearFlops(tokens, sampledRows) + attnPairs * attnFlopsPerPair;

  // Scalar core shared by every entry point: attnPairs are query-key pairs summed over the step.
  const total = (tokens: number, sampledRows: number, attnPairs: number, kvReadTokens: number): number =>
    tokens <= 0
      ? 0
      : p.cpuOverheadS +
        roofline(stepBytes(tokens, kvReadTokens), stepFlops(tokens, sampledRows, attnPairs)) +
        allReduceS(tokens);

  // Scratch for summarising a StepShape without allocating; written by scan(), read right after.
  let sTokens = 0;
  let sRows = 0;
  let sPairs = 0;
  let sKvRead = 0;
  const scan = (shape: StepShape): void => {
    sTokens = shape.decodeBatch;
    sRows = shape.decodeBatch;
    sPairs = shape.decodeContext;
    sKvRead = shape.decodeContext;
    const chunks = shape.prefill;
    for (let i = 0; i < chunks.length; i++) {
      const chunk = chunks[i]!;
      if (chunk.tokens <= 0) continue;
      sTokens += chunk.tokens;
      sRows += 1;
      sPairs += chunk.tokens * (chunk.cached + chunk.tokens / 2);
      sKvRead += chunk.cached;
    }
  };

  const stepS = (shape: StepShape): number => {
    scan(shape);
    return total(sTokens, sRows, sPairs, sKvRead);
  };

  const step = (shape: StepShape): StepBreakdown => {
    scan(shape);
    if (sTokens <= 0) {
      return { linearS: 0, attentionS: 0, allReduceS: 0, overheadS: 0, totalS: 0, flops: 0, bytes: 0 };
    }
    const bytes = stepBytes(sTokens, sKvRead);
    const flops = stepFlops(sTokens, sRows, sPairs);
    const linear = roofline(linearWeightBytes, linearFlops(sTokens, sRows));
    const compute = roofline(bytes, flops);
    const allReduce = allReduceS(sTokens);
    return {
      linearS: linear,
      attentionS: compute - linear,
      allReduceS: allReduce,
      overheadS: p.cpuOverheadS,
      totalS: p.cpuOverheadS + compute + allReduce,
      flops,
      bytes,
    };
  };

  return {
    model,
    gpu,
    tp,
    params: p,
    kvBytesPerToken,
    weightsBytesPerGpu,
    activationReserveBytesPerGpu,
    kvBlocks: (blockTokens) => {
      if (!Number.isInteger(blockTokens) || blockTokens < 1) {
        throw new RangeError(`blockTokens must be a positive integer; got ${blockTokens}`);
      }
      return Math.floor(kvBudgetBytesPerGpu / (kvBytesPerTokenPerRank * blockTokens));
    },
    step,
    stepS,
    prefillS: (tokens, cached) => total(tokens, tokens > 0 ? 1 : 0, tokens * (cached + tokens / 2), cached),
    decodeS: (batch, contextTokens) => total(batch, batch, contextTokens, contextTokens),
    linearS: (tokens) => (tokens <= 0 ? 0 : roofline(linearWeightBytes, linearFlops(tokens, 1))),
    loadS: () => weightsBytesPerGpu / p.loadBytesPerS + p.engineInitS + p.warmupS,
    fits: () => kvBudgetBytesPerGpu / kvBytesPerTokenPerRank >= model.maxContext,
  };
}
