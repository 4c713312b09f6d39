// Command-line flags: node:util parseArgs in strict mode (an unknown flag is an error naming it), every value then
// checked and converted by its schema (transport/schema.ts), with its default, so each command's options are typed.
import { parseArgs as parseArgv } from 'node:util';
import {
  arr,
  bool,
  dflt,
  oneOf,
  optional,
  refine,
  str,
  validate,
  type Infer,
  type Schema,
} from '../transport/schema.ts';

/** One flag: how node:util reads it and the schema that checks (and converts) what it read. */
export interface Flag<T> {
  readonly type: 'string' | 'boolean';
  readonly multiple?: boolean;
  readonly schema: Schema<T>;
}

/** The flags of a command. */
export type Flags = Readonly<Record<string, Flag<unknown>>>;

/** The typed values of a command's flags. */
export type FlagValues<F extends Flags> = { [K in keyof F]: Infer<F[K]['schema']> };

/** A command line that cannot be used: the message names the flag; the command prints it with its usage, exit 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

const text = str({ min: 1, max: 4096 });

const numberOf = (what: 'integer' | 'number', o: { min?: number; max?: number }): Schema<number> =>
  refine(str({ min: 1, max: 32 }), (s, refuse) => {
    const n = Number(s);
    const { min = -Infinity, max = Infinity } = o;
    const okType = what === 'integer' ? Number.isSafeInteger(n) : Number.isFinite(n);
    if (!okType || n < min || n > max) {
      const range = `${o.min !== undefined ? ` >= ${o.min}` : ''}${o.max !== undefined ? ` <= ${o.max}` : ''}`;
      refuse('', `expected ${what === 'integer' ? 'an integer' : 'a number'}${range}, got "${s}"`);
    }
    return n;
  });

/** Flag constructors. */
export const flag = {
  /** A string, absent when not given. */
  str: (): Flag<string | undefined> => ({ type: 'string', schema: optional(text) }),
  /** A string with a default. */
  strOr: (d: string): Flag<string> => ({ type: 'string', schema: dflt(text, d) }),
  /** One of a fixed set of strings, with a default. */
  oneOf: <const L extends readonly [string, ...string[]]>(d: L[number], ...values: L): Flag<L[number]> => ({
    type: 'string',
    schema: dflt(oneOf(...values), d as never),
  }),
  /** An integer, absent when not given. */
  int: (o: { min?: number; max?: number } = {}): Flag<number | undefined> => ({
    type: 'string',
    schema: optional(numberOf('integer', o)),
  }),
  /** An integer with a default. */
  intOr: (d: number, o: { min?: number; max?: number } = {}): Flag<number> => ({
    type: 'string',
    schema: dflt(numberOf('integer', o), String(d) as never),
  }),
  /** A finite number with a default. */
  numOr: (d: number, o: { min?: number; max?: number } = {}): Flag<number> => ({
    type: 'string',
    schema: dflt(numberOf('number', o), String(d) as never),
  }),
  /** A switch: true when given. */
  bool: (): Flag<boolean> => ({ type: 'boolean', schema: dflt(bool(), false) }),
  /** A flag that may be repeated (and whose values may be comma-separated). */
  list: (): Flag<string[]> => ({ type: 'string', multiple: true, schema: dflt(arr(text, { max: 64 }), []) }),
} as const;

/** The parsed command line: typed flag values and the positionals. */
export interface Parsed<F extends Flags> {
  values: FlagValues<F>;
  positionals: string[];
}

/** Parses `argv` against `flags` (plus --help); throws UsageError naming the flag on anything it cannot use. */
export function parseCommand<const F extends Flags>(
  argv: readonly string[],
  flags: F,
  opts: { maxPositionals?: number } = {},
): Parsed<F> & { help: boolean } {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean }> = { help: { type: 'boolean' } };
  for (const [k, f] of Object.entries(flags)) options[k] = { type: f.type, ...(f.multiple ? { multiple: true } : {}) };
  let raw: { values: Record<string, unknown>; positionals: string[] };
  try {
    raw = parseArgv({ args: [...argv], options, strict: true, allowPositionals: true }) as typeof raw;
  } catch (e) {
    throw new UsageError((e as Error).message.split('\n')[0]!.replace(/\. To specify a positional.*$/, ''));
  }
  const max = opts.maxPositionals ?? Infinity;
  if (raw.positionals.length > max)
    throw new UsageError(`unexpected argument "${raw.positionals[max]}" (at most ${max} expected)`);
  const values: Record<string, unknown> = {};
  for (const [k, f] of Object.entries(flags)) {
    let given = raw.values[k];
    if (f.multiple && Array.isArray(given)) given = given.flatMap((s: string) => s.split(',')).map((s) => s.trim());
    if (Array.isArray(given)) given = given.filter((s) => s !== '');
    const v = validate(f.schema, given);
    if (!v.ok) {
      const where = v.error.path === '$' ? '' : v.error.path.slice(1);
      throw new UsageError(`--${k}${where}: ${v.error.message}`);
    }
    values[k] = v.value;
  }
  return { values: values as FlagValues<F>, positionals: raw.positionals, help: raw.values['help'] === true };
}

/** Runs `parseCommand`, or prints the error and the usage to stderr and returns null (the caller exits 2). */
export function parseOrUsage<const F extends Flags>(
  command: string,
  usage: string,
  argv: readonly string[],
  flags: F,
  opts: { maxPositionals?: number } = {},
): (Parsed<F> & { help: boolean }) | null {
  try {
    return parseCommand(argv, flags, opts);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`switchyard ${command}: ${e.message}\n${usage}`);
    return null;
  }
}
