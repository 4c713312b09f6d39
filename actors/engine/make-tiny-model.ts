// CLI: writes a seeded generated GGUF model of a named size or of a shape given field by field:
// make-tiny-model <out.gguf> [--seed N] [--size tiny|bench|m100] [--layers N] [--embedding N] [--heads N]
//   [--kv-heads N] [--feed-forward N] [--vocab N] [--context N] [--dtype f32|f16|q8_0]
import type { GgufTensorType } from './gguf-writer.ts';
import {
  ensureTinyModel,
  specOf,
  specProblem,
  TINY_MODEL_SIZES,
  type GeneratedSize,
  type TinyModelOptions,
  type TinyModelSpec,
} from './tiny-model.ts';

const USAGE =
  'usage: make-tiny-model <out.gguf> [--seed N] [--size tiny|bench|m100] [--layers N] [--embedding N] [--heads N] ' +
  '[--kv-heads N] [--feed-forward N] [--vocab N] [--context N] [--dtype f32|f16|q8_0]';

/** The shape flags and the spec field each sets. */
const SHAPE_FLAGS: ReadonlyMap<
  string,
  'layers' | 'embedding' | 'heads' | 'kvHeads' | 'feedForward' | 'vocab' | 'contextLength'
> = new Map([
  ['--layers', 'layers'],
  ['--embedding', 'embedding'],
  ['--heads', 'heads'],
  ['--kv-heads', 'kvHeads'],
  ['--feed-forward', 'feedForward'],
  ['--vocab', 'vocab'],
  ['--context', 'contextLength'],
]);
const DTYPES: readonly GgufTensorType[] = ['f32', 'f16', 'q8_0'];

/** Parses the CLI arguments into an output path and generator options; throws a usage error on bad input. */
export function parseMakeTinyModelArgs(argv: readonly string[]): { out: string; opts: TinyModelOptions } {
  const usage = USAGE;
  let out: string | undefined;
  const opts: TinyModelOptions = {};
  const shape: Partial<TinyModelSpec> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const field = SHAPE_FLAGS.get(arg);
    if (arg === '--seed') {
      const seed = Number(argv[++i]);
      if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new Error(`--seed must be a u32; ${usage}`);
      opts.seed = seed;
    } else if (arg === '--size') {
      const size = argv[++i] as GeneratedSize;
      if (!TINY_MODEL_SIZES.has(size))
        throw new Error(`--size must be one of ${[...TINY_MODEL_SIZES.keys()].join(', ')}; ${usage}`);
      opts.size = size;
    } else if (field !== undefined) {
      const n = Number(argv[++i]);
      if (!Number.isSafeInteger(n) || n <= 0) throw new Error(`${arg} must be a positive integer; ${usage}`);
      shape[field] = n;
    } else if (arg === '--dtype') {
      const d = argv[++i] as GgufTensorType;
      if (!DTYPES.includes(d)) throw new Error(`--dtype must be one of ${DTYPES.join(', ')}; ${usage}`);
      shape.dtype = d;
    } else if (!arg.startsWith('--') && out === undefined) {
      out = arg;
    } else {
      throw new Error(`unexpected argument '${arg}'; ${usage}`);
    }
  }
  if (out === undefined) throw new Error(usage);
  if (Object.keys(shape).length > 0) {
    const base = specOf(opts);
    opts.spec = {
      ...base,
      ...shape,
      name: `switchyard-${shape.layers ?? base.layers}l-${shape.embedding ?? base.embedding}`,
    };
    const problem = specProblem(opts.spec);
    if (problem) throw new Error(`${problem}; ${usage}`);
  }
  return { out, opts };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  try {
    const { out, opts } = parseMakeTinyModelArgs(process.argv.slice(2));
    const result = await ensureTinyModel(out, opts);
    const spec = specOf(opts);
    const verb = result.written ? 'wrote' : 'kept identical';
    console.log(`${verb} ${result.path} (${spec.name}, ${result.bytes} bytes, sha256 ${result.sha256})`);
  } catch (err) {
    console.error((err as Error).message);
    process.exitCode = 2;
  }
}
