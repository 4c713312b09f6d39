// A small argument parser: positionals, `--flag`, `--key value` and `--key=value`, with typed errors.

/** Parsed command-line arguments. */
export interface Args {
  positional: string[];
  flags: Map<string, string | true>;
}

/** Parses argv; `valued` lists options that take a value. */
export function parseArgs(argv: readonly string[], valued: readonly string[]): Args {
  const positional: string[] = [];
  const flags = new Map<string, string | true>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith('--')) {
      positional.push(a);
      continue;
    }
    const eq = a.indexOf('=');
    const key = eq > 0 ? a.slice(2, eq) : a.slice(2);
    if (eq > 0) flags.set(key, a.slice(eq + 1));
    else if (valued.includes(key)) {
      const v = argv[i + 1];
      if (v === undefined) throw new Error(`--${key} needs a value`);
      flags.set(key, v);
      i++;
    } else flags.set(key, true);
  }
  return { positional, flags };
}

/** Reads an integer option, or the default; throws naming the option when it is not an integer. */
export function intFlag(args: Args, key: string, dflt: number): number {
  const v = args.flags.get(key);
  if (v === undefined) return dflt;
  const n = Number(v);
  if (v === true || !Number.isInteger(n)) throw new Error(`--${key} must be an integer`);
  return n;
}
