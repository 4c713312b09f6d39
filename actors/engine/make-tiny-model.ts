// CLI: writes a seeded generated GGUF model: make-tiny-model <out.gguf> [--seed N] [--size tiny|bench].
import { ensureTinyModel, TINY_MODEL_SIZES, type TinyModelOptions } from './tiny-model.ts';

/** Parses the CLI arguments into an output path and generator options; throws a usage error on bad input. */
export function parseMakeTinyModelArgs(argv: readonly string[]): { out: string; opts: TinyModelOptions } {
  const usage = 'usage: make-tiny-model <out.gguf> [--seed N] [--size tiny|bench]';
  let out: string | undefined;
  const opts: TinyModelOptions = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--seed') {
      const seed = Number(argv[++i]);
      if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new Error(`--seed must be a u32; ${usage}`);
      opts.seed = seed;
    } else if (arg === '--size') {
      const size = argv[++i];
      if (size !== 'tiny' && size !== 'bench') throw new Error(`--size must be one of tiny, bench; ${usage}`);
      opts.size = size;
    } else if (!arg.startsWith('--') && out === undefined) {
      out = arg;
    } else {
      throw new Error(`unexpected argument '${arg}'; ${usage}`);
    }
  }
  if (out === undefined) throw new Error(usage);
  return { out, opts };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  try {
    const { out, opts } = parseMakeTinyModelArgs(process.argv.slice(2));
    const result = await ensureTinyModel(out, opts);
    const spec = TINY_MODEL_SIZES[opts.size ?? 'tiny'];
    const verb = result.written ? 'wrote' : 'kept identical';
    console.log(`${verb} ${result.path} (${spec.name}, ${result.bytes} bytes, sha256 ${result.sha256})`);
  } catch (err) {
    console.error((err as Error).message);
    process.exitCode = 2;
  }
}
