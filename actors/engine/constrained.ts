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
// (node-llama-cpp's JSON-schema-to-GBNF conversion), asked token by token through node-llama-cpp's binding; it is
// complete, and the sequence ends with `stop`, once the end-of-generation token is allowed.
import {
  LlamaGrammarEvaluationState,
  type Llama,
  type LlamaGrammar,
  type LlamaModel,
  type Token,
} from 'node-llama-cpp';
import { EngineError, type JsonFormat, type TokenLogprob } from './engine.ts';

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

/** Keywords of the JSON Schema subset llama.cpp's grammar conversion honours (node-llama-cpp's GbnfJsonSchema). */
const SCHEMA_KEYS: ReadonlySet<string> = new Set([
  'type',
  'properties',
  'required',
  'additionalProperties',
  'items',
  'prefixItems',
  'minItems',
  'maxItems',
  'enum',
  'const',
  'oneOf',
  'anyOf',
  '$defs',
  '$ref',
  'format',
  'minLength',
  'maxLength',
  'description',
  'title',
  'minProperties',
  'maxProperties',
]);
const SCHEMA_TYPES: ReadonlySet<string> = new Set([
  'string',
  'number',
  'integer',
  'boolean',
  'null',
  'object',
  'array',
]);
/** Bounds of a schema a request may carry. */
export const SCHEMA_BOUNDS = Object.freeze({ depth: 16, nodes: 2000 });

/** Why `schema` is not a JSON schema the grammar honours exactly (null: it is). node-llama-cpp turns what it does not
 * know into "any", which would be a format silently ignored: such a schema is refused instead. */
export function jsonSchemaProblem(schema: unknown): string | null {
  let nodes = 0;
  const walk = (x: unknown, path: string, depth: number): string | null => {
    if (++nodes > SCHEMA_BOUNDS.nodes) return `has more than ${SCHEMA_BOUNDS.nodes} parts`;
    if (depth > SCHEMA_BOUNDS.depth) return `nests deeper than ${SCHEMA_BOUNDS.depth} at ${path}`;
    if (x === true || x === false) return null;
    if (x === null || typeof x !== 'object' || Array.isArray(x)) return `${path} is not a schema object`;
    const o = x as Record<string, unknown>;
    for (const k of Object.keys(o)) if (!SCHEMA_KEYS.has(k)) return `${path} uses "${k}", which is not supported`;
    const types = Array.isArray(o['type']) ? o['type'] : o['type'] === undefined ? [] : [o['type']];
    for (const t of types) if (typeof t !== 'string' || !SCHEMA_TYPES.has(t)) return `${path}.type is not a JSON type`;
    if (typeof o['$ref'] === 'string' && !o['$ref'].startsWith('#/$defs/'))
      return `${path}.$ref must point into #/$defs/`;
    for (const k of ['properties', '$defs'] as const) {
      const m = o[k];
      if (m === undefined) continue;
      if (m === null || typeof m !== 'object' || Array.isArray(m)) return `${path}.${k} is not an object`;
      for (const [name, sub] of Object.entries(m)) {
        const bad = walk(sub, `${path}.${k}.${name}`, depth + 1);
        if (bad) return bad;
      }
    }
    for (const k of ['items', 'additionalProperties'] as const)
      if (o[k] !== undefined) {
        const bad = walk(o[k], `${path}.${k}`, depth + 1);
        if (bad) return bad;
      }
    for (const k of ['oneOf', 'anyOf', 'prefixItems'] as const) {
      const list = o[k];
      if (list === undefined) continue;
      if (!Array.isArray(list)) return `${path}.${k} is not an array`;
      for (const [i, sub] of list.entries()) {
        const bad = walk(sub, `${path}.${k}[${i}]`, depth + 1);
        if (bad) return bad;
      }
    }
    if (o['enum'] !== undefined && !Array.isArray(o['enum'])) return `${path}.enum is not an array`;
    if (
      o['required'] !== undefined &&
      !(Array.isArray(o['required']) && o['required'].every((r) => typeof r === 'string'))
    )
      return `${path}.required is not a list of names`;
    return null;
  };
  return walk(schema, 'schema', 0);
}

/** Compiles JSON formats once per schema (bounded: a client cannot fill memory with schemas). */
export function createGrammars(llama: Llama, model: LlamaModel, max = 64) {
  const cache = new Map<string, Promise<LlamaGrammar>>();
  const binding = grammarBinding(llama);
  const eog = [model.tokens.eos, model.tokens.eot].filter((t): t is Token => t != null);
  const grammarOf = (f: JsonFormat): Promise<LlamaGrammar> => {
    const key = f.schema === undefined ? '' : JSON.stringify(f.schema);
    let g = cache.get(key);
    if (!g) {
      const problem = f.schema === undefined ? null : jsonSchemaProblem(f.schema);
      if (problem) return Promise.reject(new EngineError('invalid_request', `response_format: the JSON ${problem}`));
      g = (
        f.schema === undefined
          ? llama.getGrammarFor('json')
          : llama.createGrammarForJsonSchema(f.schema as Parameters<Llama['createGrammarForJsonSchema']>[0])
      ).catch((err: unknown) => {
        cache.delete(key);
        throw new EngineError('invalid_request', `response_format: the JSON schema is not supported: ${String(err)}`);
      });
      if (cache.size >= max) cache.delete(cache.keys().next().value!);
      cache.set(key, g);
    }
    return g;
  };
  return {
    /** A fresh grammar state for a sequence; `replay` are tokens it already produced (a recompute). */
    constraint: async (f: JsonFormat, replay: readonly number[] = []): Promise<Constraint> => {
      const grammar = await grammarOf(f);
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
export function logprobOf(logits: ReadonlyMap<number, number>, token: number, top: number): TokenLogprob {
  const z = logSumExp(logits);
  const best: { token: number; lp: number }[] = [];
  if (top > 0) {
    // node-llama-cpp hands the logits sorted, most likely first.
    for (const [t, v] of logits) {
      best.push({ token: t, lp: v - z });
      if (best.length >= top) break;
    }
  }
  return { lp: (logits.get(token) ?? -Infinity) - z, top: best };
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
