// The cost model's roofline bound on serving a set of requests under a replica's batching limits: no scheduler, on
// the same cost model, can finish them sooner. Saturated throughput is reported as a ratio to this bound.
//
// Derivation. Each request costs at least its prompt as one prefill (no re-reads of cached KV, one sampled row) and
// output - 1 decodes at contexts prompt + 1 .. prompt + output - 1. Those FLOPs and KV bytes are fixed by the work;
// only the weight bytes, the per-step overhead and the all-reduce latency grow with the number of steps S, which is
// at least the tokens over the per-step budget, the decodes over maxRunning, and the longest request's output (its
// tokens come one step after another). The cost model prices a step as overhead + (m^p + c^p)^(1/p) with p = 2, a
// norm: by Minkowski's inequality the sum over steps of (m_i^2 + c_i^2)^(1/2) is at least ((sum m)^2 + (sum c)^2)^(1/2),
// so pricing the total bytes and FLOPs as one step gives a lower bound on the sum of the step times.
import type { CostModel, StepShape } from '../gpu/cost-model.ts';

/** Prompt and output length of one request. */
export interface WorkItem {
  prompt: number;
  output: number;
}

/** The bound and what it was made of. */
export interface RooflineBound {
  /** Lower bound on the time to serve every request (s). */
  seconds: number;
  /** Lower bound on the number of steps. */
  steps: number;
  outputTokens: number;
  /** outputTokens / seconds: no schedule under these limits does better. */
  outputTokensPerS: number;
}

/** Limits the bound respects; `wholePrompts` lets one prompt longer than the budget run as a step of its own. */
export interface RooflineLimits {
  maxRunning: number;
  tokenBudget: number;
  wholePrompts?: boolean;
}

/** The roofline bound of `work` on `cost` under `limits`. */
export function rooflineBound(cost: CostModel, limits: RooflineLimits, work: readonly WorkItem[]): RooflineBound {
  const shape = (prefill: number, decodeBatch: number, decodeContext: number): StepShape => ({
    prefill: prefill > 0 ? [{ tokens: prefill, cached: 0 }] : [],
    decodeBatch,
    decodeContext,
  });
  // Per-step and per-token parts of the cost model, read off single steps: weights per step, KV bytes per token.
  const one = cost.step(shape(0, 1, 0));
  const two = cost.step(shape(0, 1, 1));
  const kvBytes = two.bytes - one.bytes;
  const weightBytes = one.bytes - kvBytes;
  const arTwo = cost.step(shape(0, 2, 0)).allReduceS;
  const arPerToken = arTwo - one.allReduceS;
  const arPerStep = one.allReduceS - arPerToken;

  let tokens = 0;
  let decodes = 0;
  let outputTokens = 0;
  let flops = 0;
  let varBytes = 0;
  let longest = 0;
  let maxPrompt = 0;
  for (const w of work) {
    const pre = cost.step(shape(w.prompt, 0, 0));
    flops += pre.flops;
    varBytes += pre.bytes - weightBytes;
    const d = w.output - 1;
    if (d > 0) {
      const ctx = d * w.prompt + (d * (d + 1)) / 2;
      const dec = cost.step(shape(0, d, ctx));
      flops += dec.flops;
      varBytes += dec.bytes - weightBytes;
    }
    tokens += w.prompt + Math.max(0, d);
    decodes += Math.max(0, d);
    outputTokens += w.output;
    longest = Math.max(longest, w.output);
    maxPrompt = Math.max(maxPrompt, w.prompt);
  }
  const perStep = limits.wholePrompts ? Math.max(limits.tokenBudget, maxPrompt) : limits.tokenBudget;
  const steps = Math.max(Math.ceil(tokens / perStep), Math.ceil(decodes / limits.maxRunning), longest);
  const memS = (steps * weightBytes + varBytes) / (cost.gpu.hbmBytesPerS * cost.params.etaMem);
  const computeS = flops / (cost.gpu.peakFlops * cost.params.etaCompute);
  const seconds =
    steps * (cost.params.cpuOverheadS + arPerStep) + tokens * arPerToken + Math.sqrt(memS * memS + computeS * computeS);
  return { seconds, steps, outputTokens, outputTokensPerS: seconds > 0 ? outputTokens / seconds : 0 };
}
