// What a sequence may ask of sampling beyond temperature and top-p: the log-probability of each token it gets (with
// the most likely alternatives), and JSON output (any JSON object, or one that validates against a JSON schema)
// through a grammar that decides which tokens may come next.
//
// Both read the step's logits: llama.cpp returns the raw logits of the position sampled from (every token's, when
// asked), so a token's log-probability is its logit minus the log of the sum of every exponentiated logit. A
// constrained sequence is sampled here rather than by llama.cpp's sampler, because node-llama-cpp's controlled
// evaluation (the one switchyard's steps use) takes no grammar: the next token is the most likely one the grammar
// allows (greedy), or one drawn from the allowed ones by their probabilities at the temperature, with a generator
// seeded from the request's seed and the position, so a recompute draws the same. The grammar is llama.cpp's own
// (node-llama-cpp's JSON-schema-to-GBNF conversion; `{"type": "object"}` is OpenAI's JSON mode), asked token by token through node-llama-cpp's binding; it is
// complete, and the sequence ends with `stop`, once the end-of-generation token is allowed.
import {
  LlamaGrammarEvaluationState,
  type Llama,
  type LlamaGrammar,
  type LlamaModel,
  type Token,
} from 'node-llama-cpp';
import { LOGPROB_FLOOR } from '../../machines/core-messages.ts';
import { EngineError, type TokenLogprob } from './engine.ts';
import { jsonSchemaProblem } from './json-schema.ts';

/** Most alternatives a request may ask for (OpenAI's bound on `top_logprobs`). */
export const MAX_TOP_LOGPROBS = 20;

/** A grammar's state for one sequence. */
export interface Constraint {
  allowed(token: number): boolean;
  accept(token: number): void;
  /** True once the output is complete (the end-of-generation token is allowed). */
  complete(): boolean;
}

interface GrammarBinding {
  canBeNextTokenForGrammarEvaluationState(state: unknown, token: number): boolean;
  acceptGrammarEvaluationStateToken(state: unknown, token: number): void;
}

/** node-llama-cpp's grammar calls (internal in 3.22: its own chat and speculative decoding use them the same way). */
function grammarBinding(llama: Llama): GrammarBinding {
  const b = (llama as unknown as { _bindings?: { AddonSampler?: GrammarBinding } })._bindings?.AddonSampler;
  if (!b || typeof b.canBeNextTokenForGrammarEvaluationState !== 'function')
    throw new EngineError('engine_failed', 'this node-llama-cpp build offers no grammar evaluation', false);
  return b;
}

/** Compiles JSON formats once per schema (bounded: a client cannot fill memory with schemas). */
export function createGrammars(llama: Llama, model: LlamaModel, max = 64) {
  const cache = new Map<string, Promise<LlamaGrammar>>();
  const binding = grammarBinding(llama);
  const eog = [model.tokens.eos, model.tokens.eot].filter((t): t is Token => t != null);
  const grammarOf = (text: string): Promise<LlamaGrammar> => {
    let g = cache.get(text);
    if (!g) {
      let schema: unknown;
      try {
        schema = JSON.parse(text);
      } catch {
        return Promise.reject(new EngineError('invalid_request', 'response_format: the JSON schema is not JSON'));
      }
      const problem = jsonSchemaProblem(schema);
      if (problem) return Promise.reject(new EngineError('invalid_request', `response_format: the JSON ${problem}`));
      g = llama
        .createGrammarForJsonSchema(schema as Parameters<Llama['createGrammarForJsonSchema']>[0])
        .catch((err: unknown) => {
          cache.delete(text);
          throw new EngineError('invalid_request', `response_format: the JSON schema is not supported: ${String(err)}`);
        });
      if (cache.size >= max) cache.delete(cache.keys().next().value!);
      cache.set(text, g);
    }
    return g;
  };
  return {
    /** A fresh grammar state for a sequence; `replay` are tokens it already produced (a recompute). */
    constraint: async (schema: string, replay: readonly number[] = []): Promise<Constraint> => {
      const grammar = await grammarOf(schema);
      const state = new LlamaGrammarEvaluationState({ model, grammar });
      const raw = (state as unknown as { _state: unknown })._state;
      const c: Constraint = {
        allowed: (t) => binding.canBeNextTokenForGrammarEvaluationState(raw, t),
        accept: (t) => binding.acceptGrammarEvaluationStateToken(raw, t),
        complete: () => eog.some((t) => c.allowed(t)),
      };
      for (const t of replay) c.accept(t);
      return c;
    },
    eog,
  };
}

/** log(sum(exp(logit))) over every logit, stably. */
function logSumExp(logits: ReadonlyMap<number, number>): number {
  let max = -Infinity;
  for (const v of logits.values()) if (v > max) max = v;
  let sum = 0;
  for (const v of logits.values()) sum += Math.exp(v - max);
  return max + Math.log(sum);
}

/** The chosen token's log-probability and the `top` most likely tokens', from every logit of its position. */
export function logprobOf(
  logits: ReadonlyMap<number, number>,
  token: number,
  top: number,
  textOf: (token: number) => string,
): TokenLogprob {
  const z = logSumExp(logits);
  const lpOf = (v: number | undefined): number => Math.max(LOGPROB_FLOOR, (v ?? -Infinity) - z);
  const best: TokenLogprob['top'] = [];
  if (top > 0) {
    // node-llama-cpp hands the logits sorted, most likely first.
    for (const [t, v] of logits) {
      best.push({ token: t, text: textOf(t), lp: lpOf(v) });
      if (best.length >= top) break;
    }
  }
  return { lp: lpOf(logits.get(token)), text: textOf(token), top: best };
}

/** A small seeded generator (mulberry32) for a constrained draw. */
function uniform(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The next token of a constrained sequence from its position's logits (sorted, most likely first), or null when
 * the grammar allows none of them. */
export function chooseConstrained(
  logits: ReadonlyMap<number, number>,
  c: Constraint,
  temperature: number,
  seed: number,
): number | null {
  if (temperature <= 0) {
    for (const t of logits.keys()) if (c.allowed(t)) return t;
    return null;
  }
  const allowed: [number, number][] = [];
  let max = -Infinity;
  for (const [t, v] of logits)
    if (c.allowed(t)) {
      allowed.push([t, v]);
      if (v > max) max = v;
    }
  if (allowed.length === 0) return null;
  let sum = 0;
  const weights = allowed.map(([, v]) => (sum += Math.exp((v - max) / temperature)));
  const x = uniform(seed)() * sum;
  const i = weights.findIndex((w) => w > x);
  return allowed[i < 0 ? allowed.length - 1 : i]![0];
}
