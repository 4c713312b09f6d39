// The simulated model's text: the core counts tokens, the serving layer turns token i of a request into a word chosen
// by a hash of the request's seed (model and prompt) and i, so the same prompt always streams the same text.

const WORDS = [
  'the',
  'switch',
  'yard',
  'routes',
  'tokens',
  'across',
  'eight',
  'gpus',
  'while',
  'batches',
  'form',
  'and',
  'drain',
  'in',
  'order',
  'a',
  'replica',
  'loads',
  'its',
  'weights',
  'then',
  'serves',
  'every',
  'request',
  'with',
  'one',
  'terminal',
  'outcome',
  'queues',
  'stay',
  'bounded',
  'so',
  'latency',
  'holds',
  'under',
  'load',
  'cache',
  'blocks',
  'fill',
  'slowly',
  'as',
  'context',
  'grows',
  'through',
  'each',
  'step',
  'of',
  'decoding',
  'placement',
  'chooses',
  'where',
  'models',
  'live',
  'simulated',
  'text',
  'flows',
  'from',
  'cost',
  'model',
  'time',
  'steady',
  'calm',
  'quick',
  'bright',
] as const;

/** FNV-1a of a string: the per-request seed of its pseudo-text. */
export function textSeed(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

/** Token `i` of the stream seeded by `seed`, with its leading space (a word-level tokenizer). */
export function tokenText(seed: number, i: number): string {
  let h = Math.imul(seed ^ Math.imul(i + 1, 0x9e3779b1), 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return ` ${WORDS[(h >>> 0) % WORDS.length]!}`;
}

/** Tokens `from .. from+n-1` of the stream as one string. */
export function textRange(seed: number, from: number, n: number): string {
  let s = '';
  for (let i = from; i < from + n; i++) s += tokenText(seed, i);
  return s;
}

/** Estimated prompt tokens of a text: one per four characters (at least one), the usual rule of thumb for English BPE. */
export function estimateTokens(text: string): number {
  return Math.max(1, Math.ceil(text.length / 4));
}
