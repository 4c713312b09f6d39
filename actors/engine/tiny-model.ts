// Generates llama-architecture GGUF models with seeded random weights and a byte-level vocabulary: tiny ones for
// tests, and larger ones of a requested shape for measuring speed where no weights can be downloaded.
import { createHash } from 'node:crypto';
import { mkdir, readFile } from 'node:fs/promises';
import { writeFileAtomic } from '../../runtime/atomic-file.ts';
import { dirname } from 'node:path';
import { writeGguf, type GgufKv, type GgufTensor, type GgufTensorType } from './gguf-writer.ts';

/** The shape of a generated model. */
export interface TinyModelSpec {
  name: string;
  embedding: number;
  layers: number;
  heads: number;
  kvHeads: number;
  feedForward: number;
  contextLength: number;
  /** Element type of the weight matrices (norms stay f32). */
  dtype: GgufTensorType;
  /** Tokens in the vocabulary: the 256 bytes, the specials and the merges, then filler tokens up to this size
   * (absent: no filler). Filler tokens are never produced by the tokenizer, only by sampling. */
  vocab?: number;
}

/** The named sizes a config's `generate:` and the CLI's `--size` accept. */
export type GeneratedSize = 'tiny' | 'bench' | 'm100';

/** Named sizes: `tiny` (~0.5 MB, ~1 ms a step on one core), `bench` (~13M params, several ms a step) and `m100`
 * (~100M params in q8_0, ~107 MB: steps of tens of milliseconds on a CPU core, a small real model's cost). */
export const TINY_MODEL_SIZES: ReadonlyMap<GeneratedSize, Readonly<TinyModelSpec>> = new Map<
  GeneratedSize,
  Readonly<TinyModelSpec>
>([
  [
    'tiny',
    Object.freeze({
      name: 'switchyard-tiny',
      embedding: 64,
      layers: 2,
      heads: 4,
      kvHeads: 2,
      feedForward: 192,
      contextLength: 4096,
      dtype: 'f32' as const,
    }),
  ],
  [
    'bench',
    Object.freeze({
      name: 'switchyard-bench',
      embedding: 384,
      layers: 6,
      heads: 6,
      kvHeads: 2,
      feedForward: 1536,
      contextLength: 4096,
      dtype: 'f16' as const,
    }),
  ],
  [
    'm100',
    Object.freeze({
      name: 'switchyard-m100',
      embedding: 768,
      layers: 12,
      heads: 12,
      kvHeads: 4,
      feedForward: 2048,
      contextLength: 4096,
      dtype: 'q8_0' as const,
      vocab: 16384,
    }),
  ],
]);

/** Options of a generated model: the PRNG seed, and a named size or a whole shape (`spec` wins). */
export interface TinyModelOptions {
  seed?: number;
  size?: GeneratedSize;
  spec?: TinyModelSpec;
}

/** The shape `opts` asks for (a named size's, `tiny` by default). */
export function specOf(opts: TinyModelOptions): Readonly<TinyModelSpec> {
  return opts.spec ?? TINY_MODEL_SIZES.get(opts.size ?? 'tiny')!;
}

/** Why a shape cannot be built (a message naming the field), or null. */
export function specProblem(s: TinyModelSpec): string | null {
  const whole = (n: number, lo: number, hi: number): boolean => Number.isInteger(n) && n >= lo && n <= hi;
  if (!whole(s.layers, 1, 256)) return `layers must be an integer in [1, 256]; got ${s.layers}`;
  if (!whole(s.heads, 1, 256)) return `heads must be an integer in [1, 256]; got ${s.heads}`;
  if (!whole(s.kvHeads, 1, s.heads) || s.heads % s.kvHeads !== 0)
    return `kvHeads must divide heads (${s.heads}); got ${s.kvHeads}`;
  if (!whole(s.embedding, 8, 16384) || s.embedding % s.heads !== 0 || (s.embedding / s.heads) % 2 !== 0)
    return `embedding must be in [8, 16384], a multiple of heads with an even head size; got ${s.embedding}`;
  if (!whole(s.feedForward, 8, 65536)) return `feedForward must be an integer in [8, 65536]; got ${s.feedForward}`;
  if (!whole(s.contextLength, 16, 1 << 20)) return `contextLength must be in [16, 1048576]; got ${s.contextLength}`;
  const base = 256 + 2 + MERGES.length;
  if (s.vocab !== undefined && !whole(s.vocab, base, 262_144))
    return `vocab must be an integer in [${base}, 262144]; got ${s.vocab}`;
  if (s.dtype === 'q8_0' && (s.embedding % 32 !== 0 || s.feedForward % 32 !== 0))
    return `q8_0 needs embedding and feedForward to be multiples of 32`;
  return null;
}

/** Token ids of the generated vocabulary: 0-255 are the bytes, then the specials, then the merged tokens. */
export const TINY_VOCAB = Object.freeze({ bos: 256, eos: 257, firstMerge: 258 });

/** BPE merges (in GPT-2's byte-to-unicode alphabet, where "Ġ" is a space) that make a few multi-byte tokens. */
const MERGES = ['Ġ t', 'h e', 'Ġt he', 'i n'] as const;

/** GPT-2's reversible byte -> printable unicode character mapping that byte-level BPE vocabularies are written in. */
export function byteToUnicode(): string[] {
  const direct: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) direct.push(b);
  for (let b = 0xa1; b <= 0xac; b++) direct.push(b);
  for (let b = 0xae; b <= 0xff; b++) direct.push(b);
  const table: string[] = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    table[b] = String.fromCodePoint(direct.includes(b) ? b : 256 + extra++);
  }
  return table;
}

/** A small deterministic PRNG (mulberry32): uniform floats in [0, 1) from a 32-bit seed. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Filler token `i`: two or more letters (in the byte alphabet, so its text is plain ASCII), none a merge's. */
const fillerToken = (i: number, letters: readonly string[]): string => {
  let s = '';
  let n = i + letters.length; // at least two letters
  do {
    s = letters[n % letters.length]! + s;
    n = Math.floor(n / letters.length);
  } while (n > 0);
  return s;
};

const vocabulary = (size?: number): { tokens: string[]; types: number[] } => {
  const tokens = byteToUnicode();
  const types = tokens.map(() => 1); // LLAMA_TOKEN_TYPE_NORMAL
  tokens.push('<|startoftext|>', '<|endoftext|>');
  types.push(3, 3); // LLAMA_TOKEN_TYPE_CONTROL
  for (const merge of MERGES) {
    tokens.push(merge.replace(' ', ''));
    types.push(1);
  }
  const seen = new Set(tokens);
  const letters = 'abcdefghijklmnopqrstuvwxyz'.split('');
  for (let i = 0; size !== undefined && tokens.length < size; i++) {
    const t = fillerToken(i, letters);
    if (seen.has(t)) continue;
    seen.add(t);
    tokens.push(t);
    types.push(1);
  }
  return { tokens, types };
};

const isPrintableAscii = (id: number): boolean => id >= 0x20 && id <= 0x7e;

/** How strongly the LM head favours each token: readable ASCII first, so greedy output is mostly legible text. */
const outputRowScale = (id: number): number => {
  if (id === TINY_VOCAB.bos || id === TINY_VOCAB.eos) return 0.05;
  if (id >= TINY_VOCAB.firstMerge || isPrintableAscii(id) || id === 0x0a) return 1;
  return 0.2;
};

/** The generated models' chat template (ChatML, in Jinja as GGUF files carry it): chat requests are rendered by it. */
export const CHAT_TEMPLATE =
  '{{ bos_token }}{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n' +
  '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';

/** llama_ftype of a model whose matrices are all of one type. */
const FILE_TYPE: ReadonlyMap<GgufTensorType, number> = new Map([
  ['f32', 0],
  ['f16', 1],
  ['q8_0', 7],
]);

const metadata = (spec: TinyModelSpec, vocab: { tokens: string[]; types: number[] }): GgufKv[] => {
  const headDim = spec.embedding / spec.heads;
  return [
    { key: 'general.architecture', type: 'string', value: 'llama' },
    { key: 'general.name', type: 'string', value: spec.name },
    { key: 'general.alignment', type: 'u32', value: 32 },
    { key: 'general.file_type', type: 'u32', value: FILE_TYPE.get(spec.dtype)! },
    { key: 'llama.context_length', type: 'u32', value: spec.contextLength },
    { key: 'llama.embedding_length', type: 'u32', value: spec.embedding },
    { key: 'llama.block_count', type: 'u32', value: spec.layers },
    { key: 'llama.feed_forward_length', type: 'u32', value: spec.feedForward },
    { key: 'llama.attention.head_count', type: 'u32', value: spec.heads },
    { key: 'llama.attention.head_count_kv', type: 'u32', value: spec.kvHeads },
    { key: 'llama.rope.dimension_count', type: 'u32', value: headDim },
    { key: 'llama.rope.freq_base', type: 'f32', value: 10000 },
    { key: 'llama.attention.layer_norm_rms_epsilon', type: 'f32', value: 1e-5 },
    { key: 'llama.vocab_size', type: 'u32', value: vocab.tokens.length },
    { key: 'tokenizer.ggml.model', type: 'string', value: 'gpt2' },
    { key: 'tokenizer.ggml.pre', type: 'string', value: 'default' },
    { key: 'tokenizer.ggml.tokens', type: 'array', itemType: 'string', value: vocab.tokens },
    { key: 'tokenizer.ggml.scores', type: 'array', itemType: 'f32', value: new Float32Array(vocab.tokens.length) },
    { key: 'tokenizer.ggml.token_type', type: 'array', itemType: 'i32', value: vocab.types },
    { key: 'tokenizer.ggml.merges', type: 'array', itemType: 'string', value: [...MERGES] },
    { key: 'tokenizer.ggml.bos_token_id', type: 'u32', value: TINY_VOCAB.bos },
    { key: 'tokenizer.ggml.eos_token_id', type: 'u32', value: TINY_VOCAB.eos },
    { key: 'tokenizer.ggml.add_bos_token', type: 'bool', value: true },
    { key: 'tokenizer.ggml.add_eos_token', type: 'bool', value: false },
    { key: 'tokenizer.chat_template', type: 'string', value: CHAT_TEMPLATE },
  ];
};

const tensorsOf = (spec: TinyModelSpec, vocabSize: number, rand: () => number): GgufTensor[] => {
  const { embedding: e, feedForward: ff, dtype } = spec;
  const kvWidth = (e / spec.heads) * spec.kvHeads;
  // Uniform in [-a, a] with a = sqrt(3 / fanIn): unit-variance outputs for unit-variance inputs.
  const random = (name: string, dims: number[], rowScale?: (row: number) => number): GgufTensor => {
    const [fanIn = 1, rows = 1] = dims;
    const data = new Float32Array(fanIn * rows);
    const a = Math.sqrt(3 / fanIn);
    for (let r = 0; r < rows; r++) {
      const s = rowScale ? rowScale(r) : 1;
      for (let i = 0; i < fanIn; i++) data[r * fanIn + i] = (2 * rand() - 1) * a * s;
    }
    return { name, dims, type: dtype, data };
  };
  const ones = (name: string): GgufTensor => ({ name, dims: [e], type: 'f32', data: new Float32Array(e).fill(1) });
  const tensors: GgufTensor[] = [
    random('token_embd.weight', [e, vocabSize]),
    ones('output_norm.weight'),
    random('output.weight', [e, vocabSize], outputRowScale),
  ];
  for (let l = 0; l < spec.layers; l++) {
    const p = `blk.${l}.`;
    tensors.push(
      ones(`${p}attn_norm.weight`),
      random(`${p}attn_q.weight`, [e, e]),
      random(`${p}attn_k.weight`, [e, kvWidth]),
      random(`${p}attn_v.weight`, [e, kvWidth]),
      random(`${p}attn_output.weight`, [e, e]),
      ones(`${p}ffn_norm.weight`),
      random(`${p}ffn_gate.weight`, [e, ff]),
      random(`${p}ffn_up.weight`, [e, ff]),
      random(`${p}ffn_down.weight`, [ff, e]),
    );
  }
  return tensors;
};

/** Builds the GGUF image of a generated model; the same seed and size always give the same bytes. */
export function buildTinyModel(opts: TinyModelOptions = {}): Uint8Array {
  const spec = specOf(opts);
  const problem = specProblem(spec);
  if (problem) throw new RangeError(`model shape: ${problem}`);
  const vocab = vocabulary(spec.vocab);
  const rand = mulberry32(opts.seed ?? 1);
  return writeGguf(metadata(spec, vocab), tensorsOf(spec, vocab.tokens.length, rand));
}

/** What ensureTinyModel found or did. */
export interface EnsuredModel {
  path: string;
  /** True when the file was (re)written, false when an identical file was already there. */
  written: boolean;
  sha256: string;
  bytes: number;
}

const sha256 = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

/** Writes the generated model to `path` unless a byte-identical file is already there (atomic rename). */
export async function ensureTinyModel(path: string, opts: TinyModelOptions = {}): Promise<EnsuredModel> {
  const image = buildTinyModel(opts);
  const digest = sha256(image);
  const existing = await readFile(path).catch(() => undefined);
  if (existing && existing.length === image.length && sha256(existing) === digest) {
    return { path, written: false, sha256: digest, bytes: image.length };
  }
  await mkdir(dirname(path), { recursive: true });
  writeFileAtomic(path, image, { mode: 0o644 });
  return { path, written: true, sha256: digest, bytes: image.length };
}
