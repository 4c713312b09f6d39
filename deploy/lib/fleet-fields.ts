// The fleet file's reading primitives: each value checked where it is read, an error naming its field.

/** Each pod is one node of this many GPUs; a pool's mode decides how they are split among its models. */
export const GPUS_PER_NODE = 8;

/** A fleet file error; `path` names the offending field. */
export class FleetError extends Error {
  constructor(
    readonly path: string,
    message: string,
  ) {
    super(`${path}: ${message}`);
    this.name = 'FleetError';
  }
}

/** A mapping as read from the fleet file. */
export type Raw = Record<string, unknown>;

/** The value as a mapping, or a FleetError. */
export function record(v: unknown, path: string): Raw {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new FleetError(path, 'must be a mapping');
  return v as Raw;
}

/** A non-empty string of bounded length, matching `pattern` when given. */
export function text(v: unknown, path: string, pattern?: RegExp, max = 253): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > max) {
    throw new FleetError(path, `must be a non-empty string of at most ${max} characters`);
  }
  if (pattern && !pattern.test(v)) throw new FleetError(path, `"${v}" does not match ${String(pattern)}`);
  return v;
}

/** An integer from `min` to `max`. */
export function integer(v: unknown, path: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new FleetError(path, `must be an integer from ${min} to ${max}`);
  }
  return v;
}

/** A mapping of label names to short strings. */
export function labels(v: unknown, path: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(record(v, path))) out[k] = text(val, `${path}.${k}`, undefined, 63);
  return out;
}

/** A bounded list, each entry read by `item`. */
export function list<T>(v: unknown, path: string, item: (x: unknown, p: string) => T, max = 64): T[] {
  if (!Array.isArray(v) || v.length > max) throw new FleetError(path, `must be a list of at most ${max} entries`);
  return v.map((x, i) => item(x, `${path}[${i}]`));
}

/** `raw[key]` read by `read`, or `fallback` when absent. */
export function optional<T>(raw: Raw, key: string, path: string, read: (v: unknown, p: string) => T, fallback: T): T {
  return raw[key] === undefined ? fallback : read(raw[key], `${path}.${key}`);
}
