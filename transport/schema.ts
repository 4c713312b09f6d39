// Dependency-free schema combinators for every edge (wire messages, config files, HTTP bodies, CLI flags): checks
// allocate nothing on success; defaults (dflt) and cross-field rules (refine) fill the value only after it conforms.

// What a failed check reports: the expectation, a description of the value, path segments leaf-first.
export interface ValidationFailure {
  expected: string;
  got: string;
  segs: string[];
  /** A whole message that replaces "expected …, got …" (rules written with refine()). */
  message?: string;
}

// Turns a conforming input into the value handed to callers (defaults filled, rules applied); may throw FillFailure.
type Filler = (v: unknown) => unknown;

// Thrown by a filler (a refine() rule); enclosing fillers add their path segment on the way up.
class FillFailure {
  constructor(readonly f: ValidationFailure) {}
}

// A compiled check: null when the value conforms, otherwise the first failure found.
export type Validator = (v: unknown) => ValidationFailure | null;

// The error handed to callers when a message does not conform to its schema.
export interface SchemaError {
  code: 'invalid_message';
  path: string;
  message: string;
}

// Outcome of validate(): the value typed as T, or the first mismatch with its path.
export type ValidateResult<T> = { ok: true; value: T } | { ok: false; error: SchemaError };

// A schema for values of type T; T is carried only at the type level (see Infer).
export interface Schema<T> {
  readonly kind: string;
  readonly check: Validator;
  readonly isOptional: boolean;
  readonly fields: Fields | null;
  readonly strict: boolean;
  /** Builds the output value from a conforming input; null when the input is the output (no defaults below). */
  readonly fill: Filler | null;
  readonly hasDefault: boolean;
  /** What the schema accepts, for references written from it (docs/configuration.md): its expectation in words, the
   * schema it wraps (optional, default, nullable, array item, record value) and a default's value. */
  readonly doc?: SchemaDoc;
  readonly __type?: T;
}

/** A schema's description (see Schema.doc). */
export interface SchemaDoc {
  readonly expected?: string;
  readonly inner?: Schema<unknown>;
  readonly defaultValue?: unknown;
}

// A schema whose field may be absent in an enclosing obj(); produced by optional().
export interface OptionalSchema<T> extends Schema<T | undefined> {
  readonly isOptional: true;
  readonly hasDefault: false;
}

// A schema whose field may be absent and then takes a default: the output type keeps the field required.
export interface DefaultSchema<T> extends Schema<T> {
  readonly isOptional: true;
  readonly hasDefault: true;
}

// The field map accepted by obj().
export type Fields = { readonly [key: string]: Schema<unknown> };

// A schema built by obj(); union() needs its fields to add the discriminant.
export interface ObjSchema<F extends Fields> extends Schema<ObjType<F>> {
  readonly fields: F;
}

// The static type a schema validates.
export type Infer<S> = S extends Schema<infer T> ? T : never;

type Simplify<T> = { [K in keyof T]: T[K] } & {};
type OptKeys<F> = {
  [K in keyof F]: F[K] extends { readonly hasDefault: true }
    ? never
    : F[K] extends { readonly isOptional: true }
      ? K
      : never;
}[keyof F];
type ReqKeys<F> = Exclude<keyof F, OptKeys<F>>;

// The static type of obj(F): optional() fields become optional properties.
export type ObjType<F> = Simplify<{ [K in ReqKeys<F>]: Infer<F[K]> } & { [K in OptKeys<F>]?: Infer<F[K]> }>;

type Literal = string | number | boolean | null;
type UnionType<Tag extends string, V> = {
  [K in keyof V & string]: Simplify<{ [P in Tag]: K } & Infer<V[K]>>;
}[keyof V & string];

// Own keys refused on every object, whatever the schema says.
const FORBIDDEN_KEYS: readonly string[] = ['__proto__', 'constructor', 'prototype'];
const IDENT = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
const MAX_KEY_SHOWN = 64;
const hasOwn = Object.hasOwn;

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return `array of length ${v.length}`;
  if (v instanceof Uint8Array) return `bytes of length ${v.byteLength}`;
  if (typeof v === 'object' && !isPlainObject(v)) return 'non-plain object';
  if (typeof v === 'number') return Number.isInteger(v) ? `integer ${v}` : `number ${v}`;
  if (typeof v === 'string') return `string of length ${v.length}`;
  return typeof v;
}

function fail(expected: string, v: unknown): ValidationFailure {
  return { expected, got: describe(v), segs: [] };
}

function keySeg(key: string): string {
  if (IDENT.test(key)) return `.${key}`;
  const shown = key.length > MAX_KEY_SHOWN ? `${key.slice(0, MAX_KEY_SHOWN)}…` : key;
  return `[${JSON.stringify(shown)}]`;
}

/** A path as written in docs and errors: `$.models[0].tp`. */
function toPath(segs: readonly string[]): string {
  let path = '$';
  for (let i = segs.length - 1; i >= 0; i--) path += segs[i];
  return path;
}

function make<T>(
  kind: string,
  check: Validator,
  fields: Fields | null = null,
  strict = false,
  fill: Filler | null = null,
  doc?: SchemaDoc,
): Schema<T> {
  return { kind, check, isOptional: false, fields, strict, fill, hasDefault: false, ...(doc ? { doc } : {}) };
}

// Runs a child filler, adding `seg` to the path of a failure on its way up.
function fillAt(fill: Filler, v: unknown, seg: string): unknown {
  try {
    return fill(v);
  } catch (e) {
    if (e instanceof FillFailure) e.f.segs.push(seg);
    throw e;
  }
}

// Wire objects are plain: their prototype is Object.prototype (as decoded) or null.
function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null) return false;
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

function isForbiddenKey(k: string): boolean {
  return k === '__proto__' || k === 'constructor' || k === 'prototype';
}

function forbiddenOwnKey(o: object): string | null {
  if (hasOwn(o, '__proto__')) return '__proto__';
  if (hasOwn(o, 'constructor')) return 'constructor';
  if (hasOwn(o, 'prototype')) return 'prototype';
  return null;
}

// The slow path of a strict obj() check, taken only when the key count differs from the fields seen.
function undeclaredKey(o: Record<string, unknown>, known: ReadonlySet<string>): ValidationFailure | null {
  for (const k in o) {
    if (isForbiddenKey(k)) return forbiddenKeyFailure(k);
    if (!known.has(k)) return { expected: 'a declared key', got: 'an undeclared key', segs: [keySeg(k)] };
  }
  return null;
}

function forbiddenKeyFailure(key: string): ValidationFailure {
  return { expected: 'no key named __proto__, constructor or prototype', got: 'a forbidden key', segs: [keySeg(key)] };
}

function bounds(min: number | undefined, max: number | undefined): string {
  if (min !== undefined && max !== undefined) return ` in [${min}, ${max}]`;
  if (min !== undefined) return ` >= ${min}`;
  if (max !== undefined) return ` <= ${max}`;
  return '';
}

function lengthBounds(min: number | undefined, max: number | undefined): string {
  const b = bounds(min, max);
  return b === '' ? '' : ` with length${b}`;
}

// Validates a value against a schema; never throws, whatever the value (getters and proxies included).
export function validate<T>(schema: Schema<T>, value: unknown): ValidateResult<T> {
  let f: ValidationFailure | null;
  try {
    f = schema.check(value);
  } catch (e) {
    return {
      ok: false,
      error: {
        code: 'invalid_message',
        path: '$',
        message: `value could not be inspected: ${e instanceof Error ? e.name : typeof e}`,
      },
    };
  }
  if (f === null && schema.fill === null) return { ok: true, value: value as T };
  if (f === null) {
    try {
      return { ok: true, value: schema.fill!(value) as T };
    } catch (e) {
      if (!(e instanceof FillFailure)) throw e;
      f = e.f;
    }
  }
  return {
    ok: false,
    error: {
      code: 'invalid_message',
      path: toPath(f.segs),
      message: f.message ?? `expected ${f.expected}, got ${f.got}`,
    },
  };
}

/** A path such as `$.models[0].tp` without the leading `$.` (`(root)` for the root), as config errors show it. */
export function fieldPath(path: string): string {
  return path.replace(/^\$\.?/, '') || '(root)';
}

// A string, optionally bounded in UTF-16 length and matched against a pattern (flags g and y refused).
export function str(opts: { min?: number; max?: number; pattern?: RegExp } = {}): Schema<string> {
  const { min = 0, max = Infinity, pattern } = opts;
  if (pattern !== undefined && (pattern.global || pattern.sticky))
    throw new TypeError('str(): pattern must not use the g or y flag');
  const expected = `string${lengthBounds(opts.min, opts.max)}`;
  const expectedPattern = pattern === undefined ? expected : `${expected} matching ${String(pattern)}`;
  return make(
    'str',
    (v) => {
      if (typeof v !== 'string' || v.length < min || v.length > max) return fail(expected, v);
      if (pattern !== undefined && !pattern.test(v)) return fail(expectedPattern, v);
      return null;
    },
    null,
    false,
    null,
    { expected: expectedPattern },
  );
}

// A safe integer (Number.isSafeInteger), optionally bounded.
export function int(opts: { min?: number; max?: number } = {}): Schema<number> {
  const { min = -Infinity, max = Infinity } = opts;
  const expected = `safe integer${bounds(opts.min, opts.max)}`;
  return make(
    'int',
    (v) => (Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max ? null : fail(expected, v)),
    null,
    false,
    null,
    { expected },
  );
}

// A finite number (NaN and ±Infinity refused), optionally bounded.
export function num(opts: { min?: number; max?: number } = {}): Schema<number> {
  const { min = -Infinity, max = Infinity } = opts;
  const expected = `finite number${bounds(opts.min, opts.max)}`;
  return make(
    'num',
    (v) => (typeof v === 'number' && Number.isFinite(v) && v >= min && v <= max ? null : fail(expected, v)),
    null,
    false,
    null,
    { expected },
  );
}

// true or false.
export function bool(): Schema<boolean> {
  return make('bool', (v) => (v === true || v === false ? null : fail('boolean', v)), null, false, null, {
    expected: 'boolean',
  });
}

// Exactly one literal value (compared with ===).
export function lit<const L extends Literal>(value: L): Schema<L> {
  const expected = JSON.stringify(value);
  return make('lit', (v) => (v === value ? null : fail(expected, v)));
}

// One of a fixed set of string or number literals.
export function oneOf<const L extends readonly (string | number)[]>(...values: L): Schema<L[number]> {
  if (values.length === 0) throw new TypeError('oneOf(): needs at least one value');
  const expected = `one of ${values.map((x) => JSON.stringify(x)).join(' | ')}`;
  const set = new Set<unknown>(values);
  return make('oneOf', (v) => (set.has(v) ? null : fail(expected, v)), null, false, null, { expected });
}

// An array whose items all match the item schema, with optional length bounds.
export function arr<T>(item: Schema<T>, opts: { min?: number; max?: number } = {}): Schema<T[]> {
  const { min = 0, max = Infinity } = opts;
  const itemCheck = item.check;
  const expected = `array${lengthBounds(opts.min, opts.max)}`;
  const itemFill = item.fill;
  const fill: Filler | null =
    itemFill === null ? null : (v) => (v as unknown[]).map((x, i) => fillAt(itemFill, x, `[${i}]`));
  const check: Validator = (v) => {
    if (!Array.isArray(v) || v.length < min || v.length > max) return fail(expected, v);
    for (let i = 0; i < v.length; i++) {
      const f = itemCheck(v[i]);
      if (f !== null) {
        f.segs.push(`[${i}]`);
        return f;
      }
    }
    return null;
  };
  return make('arr', check, null, false, fill, { expected, inner: item as Schema<unknown> });
}

// A plain object with the given fields; strict (the default) refuses undeclared keys. Own keys
// '__proto__', 'constructor' and 'prototype' are always refused and cannot be declared. Keys are
// own enumerable keys, the only kind a decoded object has.
export function obj<const F extends Fields>(fields: F, opts: { strict?: boolean } = {}): ObjSchema<F> {
  const strict = opts.strict ?? true;
  const keys = Object.keys(fields);
  for (const k of keys) if (FORBIDDEN_KEYS.includes(k)) throw new TypeError(`obj(): field name ${k} is forbidden`);
  const checks = keys.map((k) => (fields[k] as Schema<unknown>).check);
  const inherited = keys.map((k) => k in Object.prototype);
  const known = new Set(keys);
  const n = keys.length;
  // Strict mode counts the fields it saw against the object's enumerable keys and only looks for
  // the culprit on a mismatch; forbidden keys are never declared, so they always cause one.
  const check: Validator = (v) => {
    if (!isPlainObject(v)) return fail('plain object', v);
    if (!strict) {
      const bad = forbiddenOwnKey(v);
      if (bad !== null) return forbiddenKeyFailure(bad);
    }
    let present = 0;
    for (let i = 0; i < n; i++) {
      const k = keys[i] as string;
      const value = inherited[i] === true && !hasOwn(v, k) ? undefined : v[k];
      if (value !== undefined) present++;
      const f = (checks[i] as Validator)(value);
      if (f !== null) {
        f.segs.push(keySeg(k));
        return f;
      }
    }
    if (strict) {
      let count = 0;
      for (const _key in v) count++;
      if (count !== present) return undeclaredKey(v, known);
    }
    return null;
  };
  return make('obj', check, fields, strict, objFiller(fields, keys, strict)) as ObjSchema<F>;
}

// The filler of obj(fields): null when no field has a default or a filler of its own; otherwise a copy in field
// order (undeclared keys of a non-strict object kept) with defaults filled and absent optional fields left out.
function objFiller(fields: Fields, keys: readonly string[], strict: boolean): Filler | null {
  const schemas = keys.map((k) => fields[k] as Schema<unknown>);
  if (schemas.every((s) => s.fill === null)) return null;
  return (v) => {
    const o = v as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i] as string;
      const s = schemas[i] as Schema<unknown>;
      const given = hasOwn(o, k) ? o[k] : undefined;
      const value = s.fill === null ? given : fillAt(s.fill, given, keySeg(k));
      if (value !== undefined) out[k] = value;
    }
    if (!strict) for (const k of Object.keys(o)) if (!hasOwn(fields, k)) out[k] = o[k];
    return out;
  };
}

// Also accepts undefined; as an obj() field, the key may be absent.
export function optional<T>(schema: Schema<T>): OptionalSchema<T> {
  const inner = schema.check;
  const innerFill = schema.fill;
  return {
    kind: 'optional',
    check: (v) => (v === undefined ? null : inner(v)),
    isOptional: true,
    fields: null,
    strict: false,
    fill: innerFill === null ? null : (v) => (v === undefined ? undefined : innerFill(v)),
    hasDefault: false,
    doc: { inner: schema as Schema<unknown> },
  };
}

/** The default of a dflt() field, written as input: nested objects may leave out fields that have defaults. */
export type DefaultInput<T> = T extends readonly unknown[]
  ? T
  : T extends object
    ? { [K in keyof T]?: DefaultInput<T[K]> }
    : T;

// Also accepts undefined, and then yields `value` (filled by the schema, so `{}` gives an object of defaults).
// The default is checked when the schema is built and copied on every use.
export function dflt<T>(schema: Schema<T>, value: DefaultInput<T>): DefaultSchema<T> {
  const inner = schema.check;
  const bad = inner(value);
  if (bad !== null) throw new TypeError(`dflt(): the default does not conform: expected ${bad.expected}`);
  const innerFill = schema.fill;
  const fresh = (): unknown => (typeof value === 'object' && value !== null ? structuredClone(value) : value);
  return {
    kind: 'default',
    check: (v) => (v === undefined ? null : inner(v)),
    isOptional: true,
    hasDefault: true,
    fields: null,
    strict: false,
    fill: (v) => {
      const given = v === undefined ? fresh() : v;
      return innerFill === null ? given : innerFill(given);
    },
    doc: { inner: schema as Schema<unknown>, defaultValue: fresh() },
  };
}

/** How a refine() rule refuses a value: the field (relative, e.g. `tp` or `batching.buckets`) and why. */
export type Refuse = (field: string, message: string) => never;

// A rule across fields: `rule` gets the conforming (filled) value and returns the output, or refuses naming a field
// below this one; the failure's path continues upwards as any other.
export function refine<T, U>(schema: Schema<T>, rule: (value: T, refuse: Refuse) => U): Schema<U> {
  const innerFill = schema.fill;
  const refuse: Refuse = (field, message) => {
    const segs =
      field === ''
        ? []
        : field
            .split('.')
            .reverse()
            .map((p) => (p.includes('[') ? `.${p}` : keySeg(p)));
    throw new FillFailure({ expected: '', got: '', segs, message });
  };
  const out: Schema<U> = {
    kind: 'refine',
    check: schema.check,
    isOptional: false,
    fields: schema.fields,
    strict: schema.strict,
    fill: (v) => rule((innerFill === null ? v : innerFill(v)) as T, refuse),
    hasDefault: false,
    ...(schema.doc ? { doc: schema.doc } : {}),
  };
  return out;
}

// Also accepts null.
export function nullable<T>(schema: Schema<T>): Schema<T | null> {
  const inner = schema.check;
  const innerFill = schema.fill;
  return make(
    'nullable',
    (v) => (v === null ? null : inner(v)),
    null,
    false,
    innerFill === null ? null : (v) => (v === null ? null : innerFill(v)),
    { inner: schema as Schema<unknown> },
  );
}

// The first of several schemas that the value conforms to (for values that are a string or an array, say).
export function anyOf<const S extends readonly Schema<unknown>[]>(...schemas: S): Schema<Infer<S[number]>> {
  if (schemas.length === 0) throw new TypeError('anyOf(): needs at least one schema');
  const expected = schemas.map((s) => s.kind).join(' or ');
  const pick = (v: unknown): Schema<unknown> | null => {
    for (const s of schemas) if (s.check(v) === null) return s;
    return null;
  };
  const fills = schemas.some((s) => s.fill !== null);
  return make(
    'anyOf',
    (v) => {
      if (pick(v) !== null) return null;
      // Report the failure of the schema of the same JSON type when there is one (a deeper, more useful path).
      for (const s of schemas) {
        const f = s.check(v);
        if (f !== null && f.segs.length > 0) return f;
      }
      return fail(expected, v);
    },
    null,
    false,
    fills ? (v) => (pick(v)!.fill ?? ((x: unknown) => x))(v) : null,
  );
}

type RecordOpts = { max?: number };

// A string-keyed map of values; an optional key schema constrains keys; max bounds the entry count.
export function record<V>(value: Schema<V>, opts?: RecordOpts): Schema<{ [key: string]: V }>;
export function record<K extends string, V>(
  key: Schema<K>,
  value: Schema<V>,
  opts?: RecordOpts,
): Schema<Partial<Record<K, V>>>;
export function record(a: Schema<unknown>, b?: Schema<unknown> | RecordOpts, c?: RecordOpts): Schema<unknown> {
  const hasKeySchema = b !== undefined && 'check' in b;
  const keyCheck = hasKeySchema ? a.check : null;
  const valueCheck = hasKeySchema ? (b as Schema<unknown>).check : a.check;
  const opts = (hasKeySchema ? c : (b as RecordOpts | undefined)) ?? {};
  const max = opts.max ?? Infinity;
  const expected = opts.max === undefined ? 'plain object' : `plain object with at most ${opts.max} keys`;
  const valueFill = (hasKeySchema ? (b as Schema<unknown>) : a).fill;
  const fill: Filler | null =
    valueFill === null
      ? null
      : (v) => {
          const out: Record<string, unknown> = {};
          for (const k of Object.keys(v as object))
            out[k] = fillAt(valueFill, (v as Record<string, unknown>)[k], keySeg(k));
          return out;
        };
  const check: Validator = (v) => {
    if (!isPlainObject(v)) return fail(expected, v);
    let count = 0;
    for (const k in v) {
      if (!hasOwn(v, k)) continue;
      if (isForbiddenKey(k)) return forbiddenKeyFailure(k);
      if (++count > max) return { expected, got: `more than ${max} keys`, segs: [] };
      if (keyCheck !== null) {
        const kf = keyCheck(k);
        if (kf !== null) {
          kf.expected = `key ${kf.expected}`;
          kf.segs.push(keySeg(k));
          return kf;
        }
      }
      const f = valueCheck(v[k]);
      if (f !== null) {
        f.segs.push(keySeg(k));
        return f;
      }
    }
    return null;
  };
  const valueSchema = (hasKeySchema ? b : a) as Schema<unknown>;
  return make('record', check, null, false, fill, { expected, inner: valueSchema });
}

// A discriminated union: field `tag` names the variant; each variant is an obj() and gains `tag: lit(name)`.
export function union<const Tag extends string, const V extends { readonly [name: string]: ObjSchema<Fields> }>(
  tag: Tag,
  variants: V,
): Schema<UnionType<Tag, V>> {
  const names = Object.keys(variants);
  if (names.length === 0) throw new TypeError('union(): needs at least one variant');
  const checks = new Map<string, Validator>();
  const fills = new Map<string, Filler | null>();
  for (const name of names) {
    const variant = variants[name] as ObjSchema<Fields>;
    if (variant.kind !== 'obj') throw new TypeError(`union(): variant ${name} must be an obj() schema`);
    if (hasOwn(variant.fields, tag))
      throw new TypeError(`union(): variant ${name} must not declare the tag field ${tag}`);
    const full = obj({ ...variant.fields, [tag]: lit(name) }, { strict: variant.strict });
    checks.set(name, full.check);
    fills.set(name, full.fill);
  }
  const anyFill = [...fills.values()].some((f) => f !== null);
  const expectedTag = `one of ${names.map((x) => JSON.stringify(x)).join(' | ')}`;
  const tagSeg = keySeg(tag);
  const check: Validator = (v) => {
    if (!isPlainObject(v)) return fail('plain object', v);
    const t = hasOwn(v, tag) ? v[tag] : undefined;
    const variantCheck = typeof t === 'string' ? checks.get(t) : undefined;
    if (variantCheck === undefined) {
      const f = fail(expectedTag, t);
      f.segs.push(tagSeg);
      return f;
    }
    return variantCheck(v);
  };
  const fill: Filler | null = anyFill
    ? (v) => {
        const f = fills.get((v as Record<string, string>)[tag] as string) ?? null;
        return f === null ? v : f(v);
      }
    : null;
  return make('union', check, null, false, fill);
}

// A Uint8Array (Buffer included), optionally bounded in byte length.
export function bytes(opts: { min?: number; max?: number } = {}): Schema<Uint8Array> {
  const { min = 0, max = Infinity } = opts;
  const expected = `bytes${lengthBounds(opts.min, opts.max)}`;
  return make('bytes', (v) =>
    v instanceof Uint8Array && v.byteLength >= min && v.byteLength <= max ? null : fail(expected, v),
  );
}
