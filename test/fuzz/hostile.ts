// The hostile-value dictionary of the structure-aware fuzzers, and the mutator that puts its values into a message's
// known fields: names on Object.prototype and Function.prototype, empty, huge, negative, fractional and NaN-like
// values, Unicode edge cases, strings around and past each length limit, and wrong types. Seeded by runtime/rng.ts.
import type { Rng } from '../../runtime/rng.ts';

/** A field's place in a message: keys and array indices from the top. */
export type FieldPath = readonly (string | number)[];

/** A field the server reads, with values near its valid ones (the dictionary supplies the hostile rest). */
export interface FieldSpec {
  readonly path: FieldPath;
  /** Values of the right type that may or may not be accepted (limits, other names, case changes). */
  readonly near: readonly unknown[];
}

/** Names every plain object and function inherits: a lookup by one of them finds something that is not data. */
export const PROTO_NAMES: readonly string[] = [
  'toString',
  'constructor',
  '__proto__',
  'valueOf',
  'hasOwnProperty',
  'isPrototypeOf',
  'propertyIsEnumerable',
  'toLocaleString',
  '__defineGetter__',
  '__lookupSetter__',
  'prototype',
  'call',
  'apply',
  'bind',
  'length',
  'name',
  'arguments',
  'caller',
];

const UNICODE: readonly string[] = [
  '',
  ' ',
  '\uD800',
  '\uDC00',
  'a\uD83D',
  '\u202Eevil\u202C',
  '\u0000',
  'a\u0000b',
  'e\u0301\u0301\u0301\u0301',
  '\u{1F469}\u200D\u{1F469}\u200D\u{1F467}',
  '\uFEFF',
  '\u200B',
  '\uFFFF',
  '\u0130',
  '\r\n',
  '"\\',
  '<script>',
  '%00',
  '../../etc/passwd',
];

const NAN_LIKE: readonly string[] = [
  'NaN',
  'Infinity',
  '-Infinity',
  '-0',
  '1e999',
  '0x10',
  '1_000',
  ' 1',
  'null',
  '[]',
];

const NUMBERS: readonly unknown[] = [
  0,
  -0,
  -1,
  1,
  0.5,
  -0.5,
  1.5,
  2 ** 31 - 1,
  2 ** 31,
  2 ** 32,
  2 ** 53,
  2 ** 53 + 2,
  -(2 ** 53),
  1e308,
  -1e308,
  5e-324,
  NaN,
  Infinity,
  -Infinity,
  1_000_000,
  1_000_001,
  10_000_001,
  2n ** 64n - 1n,
];

/** Strings at and past the limits the schemas use (50, 64, 100, 128, 1024 characters, the prompt limits). */
const LONG: readonly string[] = [49, 50, 51, 63, 64, 65, 99, 100, 101, 127, 128, 129, 1024, 1025, 4096, 262_145].map(
  (n) => 'a'.repeat(n),
);

/** An object whose own key is `key` (assigning `__proto__` would set the prototype instead). */
export function withKey(key: string, value: unknown, into: Record<string, unknown> = {}): Record<string, unknown> {
  Object.defineProperty(into, key, { value, enumerable: true, writable: true, configurable: true });
  return into;
}

const nest = (depth: number): unknown => (depth === 0 ? 1 : [nest(depth - 1)]);

const WRONG_TYPES: readonly unknown[] = [
  null,
  true,
  false,
  [],
  [null],
  ['toString'],
  [[]],
  {},
  { a: 1 },
  withKey('__proto__', { polluted: true }),
  withKey('toString', 1),
  withKey('constructor', { prototype: { polluted: true } }),
  nest(5),
  nest(12),
];

/** Every value of the dictionary, one list. */
export const HOSTILE: readonly unknown[] = [
  ...PROTO_NAMES,
  ...UNICODE,
  ...NAN_LIKE,
  ...NUMBERS,
  ...LONG,
  ...WRONG_TYPES,
  undefined,
];

/** A hostile value for a field (a copy: a later change inside it must not reach the dictionary): mostly from the
 * dictionary, sometimes one of the field's near values. */
export function hostileFor(spec: FieldSpec, r: Rng): unknown {
  if (spec.near.length > 0 && r.int(4) === 0) return copy(spec.near[r.int(spec.near.length)]);
  return copy(HOSTILE[r.int(HOSTILE.length)]);
}

/** A copy of plain data (arrays and plain objects copied, everything else shared), own keys kept as own keys. */
export function copy<T>(v: T): T {
  if (Array.isArray(v)) return v.map(copy) as T;
  if (v !== null && typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype) {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v)) withKey(k, copy((v as Record<string, unknown>)[k]), out);
    return out as T;
  }
  return v;
}

/** Sets (or, for undefined, deletes) the field at `path`, creating plain containers on the way. */
export function setAt(root: Record<string, unknown>, path: FieldPath, value: unknown): void {
  let at: Record<string | number, unknown> = root;
  for (let i = 0; i < path.length - 1; i++) {
    const k = path[i]!;
    let next = Object.hasOwn(at, k) ? at[k] : undefined;
    if (next === null || typeof next !== 'object') {
      next = typeof path[i + 1] === 'number' ? [] : {};
      withKey(String(k), next, at as Record<string, unknown>);
    }
    at = next as Record<string | number, unknown>;
  }
  const last = path[path.length - 1]!;
  if (value === undefined) delete at[last];
  else if (Array.isArray(at) && typeof last === 'number') at[last] = value;
  else withKey(String(last), value, at as Record<string, unknown>);
}

/** What a mutation did, for reports. */
export interface Mutation {
  value: Record<string, unknown>;
  /** `path=value` of each change, short. */
  changes: string[];
}

/** Describes a value briefly (bigint, NaN, -0 and long strings readable). */
export function brief(v: unknown): string {
  if (typeof v === 'bigint') return `${v}n`;
  if (typeof v === 'number') return Object.is(v, -0) ? '-0' : String(v);
  if (typeof v === 'string') return v.length > 40 ? `"${v.slice(0, 8)}…"(${v.length})` : JSON.stringify(v);
  if (v === undefined) return 'absent';
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 60 ? `${s.slice(0, 40)}…` : s;
}

/**
 * Replaces one field of `base` (often), two or three (sometimes) with hostile values, or adds an undeclared field named
 * after a prototype member; `base` itself is not changed.
 */
export function mutate(base: Record<string, unknown>, specs: readonly FieldSpec[], r: Rng): Mutation {
  const value = copy(base);
  const changes: string[] = [];
  const roll = r.int(20);
  const n = roll < 13 ? 1 : roll < 17 ? 2 : 3;
  for (let i = 0; i < n; i++) {
    if (r.int(12) === 0) {
      const key = PROTO_NAMES[r.int(PROTO_NAMES.length)]!;
      const v = copy(HOSTILE[r.int(HOSTILE.length)]);
      if (v === undefined) continue;
      withKey(key, v, value);
      changes.push(`+${key}=${brief(v)}`);
      continue;
    }
    const spec = specs[r.int(specs.length)]!;
    const v = hostileFor(spec, r);
    setAt(value, spec.path, v);
    changes.push(`${spec.path.join('.')}=${brief(v)}`);
  }
  return { value, changes };
}

/**
 * JSON text of a value, hostile numbers included as JSON can carry them: Infinity as 1e999 (which parses back to
 * Infinity), -0 as -0, bigints as digits, NaN as the bare word NaN (not JSON: the frame must be refused).
 */
export function jsonText(v: unknown): string {
  if (typeof v === 'number') {
    if (Number.isNaN(v)) return 'NaN';
    if (v === Infinity) return '1e999';
    if (v === -Infinity) return '-1e999';
    if (Object.is(v, -0)) return '-0';
    return String(v);
  }
  if (typeof v === 'bigint') return v.toString();
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? 'null' : jsonText(x))).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    const parts: string[] = [];
    for (const k of Object.keys(v)) {
      const x = (v as Record<string, unknown>)[k];
      if (x !== undefined) parts.push(`${JSON.stringify(k)}:${jsonText(x)}`);
    }
    return `{${parts.join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}
