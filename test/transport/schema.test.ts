import fc from 'fast-check';
import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  arr,
  bool,
  bytes,
  int,
  lit,
  nullable,
  num,
  obj,
  oneOf,
  optional,
  record,
  str,
  union,
  validate,
  type Infer,
  type Schema,
} from '../../transport/schema.ts';

const Gpu = obj({ id: int({ min: 0, max: 7 }), epoch: int({ min: 0 }), model: optional(str({ max: 64 })) });
const Status = obj({ node: str({ min: 1, max: 32 }), gpus: arr(Gpu, { max: 8 }), load: num({ min: 0, max: 1 }) });
const Msg = union('type', {
  status: Status,
  ping: obj({ seq: int({ min: 0 }) }),
  release: obj({ gpu: int({ min: 0, max: 7 }), reason: nullable(oneOf('done', 'evicted')) }),
});

function errorOf<T>(schema: Schema<T>, value: unknown): { path: string; message: string } {
  const r = validate(schema, value);
  if (r.ok) throw new Error('expected a validation failure');
  expect(r.error.code).toBe('invalid_message');
  return { path: r.error.path, message: r.error.message };
}

describe('schema combinators', () => {
  it('accepts a conforming message and returns the same value', () => {
    const m = {
      type: 'status',
      node: 'n1',
      gpus: [
        { id: 0, epoch: 3 },
        { id: 1, epoch: 4, model: 'llama' },
      ],
      load: 0.5,
    };
    const r = validate(Msg, m);
    expect(r).toEqual({ ok: true, value: m });
    expect(r.ok && r.value).toBe(m);
  });

  it('names the path of a nested failure and what was expected', () => {
    const gpus = [0, 1, 2, 3].map((id) => ({ id, epoch: id === 3 ? -1 : 1 }));
    const e = errorOf(Msg, { type: 'status', node: 'n1', gpus, load: 0 });
    expect(e.path).toBe('$.gpus[3].epoch');
    expect(e.message).toBe('expected safe integer >= 0, got integer -1');
  });

  it('quotes keys that are not identifiers in paths', () => {
    const e = errorOf(record(int()), { 'a b': 'x' });
    expect(e.path).toBe('$["a b"]');
  });

  it('refuses strings outside their length bounds or pattern', () => {
    const s = str({ min: 2, max: 4, pattern: /^[a-z]+$/ });
    expect(validate(s, 'abc').ok).toBe(true);
    expect(errorOf(s, 'a').message).toBe('expected string with length in [2, 4], got string of length 1');
    expect(errorOf(s, 'abcde').message).toContain('length in [2, 4]');
    expect(errorOf(s, 'AB').message).toContain('matching /^[a-z]+$/');
    expect(errorOf(s, 3).message).toBe('expected string with length in [2, 4], got integer 3');
  });

  it('refuses a pattern with the g or y flag at construction', () => {
    expect(() => str({ pattern: /a/g })).toThrow(TypeError);
    expect(() => str({ pattern: /a/y })).toThrow(TypeError);
  });

  it('accepts only safe integers within bounds for int', () => {
    const i = int({ min: -5, max: 5 });
    expect(validate(i, 5).ok).toBe(true);
    expect(validate(i, -5).ok).toBe(true);
    for (const bad of [6, -6, 1.5, NaN, Infinity, '1', null]) expect(validate(i, bad).ok).toBe(false);
    expect(validate(int(), Number.MAX_SAFE_INTEGER).ok).toBe(true);
    expect(validate(int(), Number.MAX_SAFE_INTEGER + 1).ok).toBe(false);
    expect(validate(int(), 2 ** 60).ok).toBe(false);
  });

  it('accepts only finite numbers within bounds for num', () => {
    const n = num({ min: 0, max: 1 });
    expect(validate(n, 0.25).ok).toBe(true);
    for (const bad of [NaN, Infinity, -Infinity, 1.01, -0.01, '0.5']) expect(validate(n, bad).ok).toBe(false);
    expect(validate(num(), NaN).ok).toBe(false);
    expect(validate(num(), -Infinity).ok).toBe(false);
  });

  it('checks booleans, literals and fixed sets', () => {
    expect(validate(bool(), false).ok).toBe(true);
    expect(validate(bool(), 0).ok).toBe(false);
    expect(validate(lit('a'), 'a').ok).toBe(true);
    expect(validate(lit(3), 3).ok).toBe(true);
    expect(validate(lit(null), null).ok).toBe(true);
    expect(errorOf(lit('a'), 'b').message).toBe('expected "a", got string of length 1');
    expect(validate(oneOf('x', 'y', 2), 2).ok).toBe(true);
    expect(errorOf(oneOf('x', 'y'), 'z').message).toBe('expected one of "x" | "y", got string of length 1');
  });

  it('bounds array length and checks every item', () => {
    const a = arr(int(), { max: 3 });
    expect(validate(a, [1, 2, 3]).ok).toBe(true);
    expect(errorOf(a, [1, 2, 3, 4]).message).toBe('expected array with length <= 3, got array of length 4');
    expect(errorOf(a, [1, 'x']).path).toBe('$[1]');
    expect(validate(a, { length: 0 }).ok).toBe(false);
    expect(errorOf(arr(int()), [1, , 3]).path).toBe('$[1]');
  });

  it('refuses unknown keys on strict objects and ignores them on loose ones', () => {
    const strict = obj({ a: int() });
    const loose = obj({ a: int() }, { strict: false });
    expect(errorOf(strict, { a: 1, b: 2 })).toEqual({
      path: '$.b',
      message: 'expected a declared key, got an undeclared key',
    });
    expect(validate(loose, { a: 1, b: 2 }).ok).toBe(true);
    expect(errorOf(strict, { a: 1, b: undefined }).path).toBe('$.b');
    expect(validate(obj({ a: optional(int()) }), { a: undefined }).ok).toBe(true);
    expect(errorOf(obj({ a: optional(int()) }), { b: 1 }).path).toBe('$.b');
  });

  it('refuses own __proto__, constructor and prototype keys even on loose objects and records', () => {
    const loose = obj({ a: int() }, { strict: false });
    for (const key of ['__proto__', 'constructor', 'prototype']) {
      const hostile = JSON.parse(`{"a":1,"${key}":{"polluted":true}}`) as unknown;
      expect(errorOf(loose, hostile).path).toBe(`$.${key}`);
      expect(errorOf(record(int()), hostile).path).toBe(`$.${key}`);
      expect(errorOf(obj({ a: int() }), hostile).path).toBe(`$.${key}`);
    }
    expect(({} as { polluted?: boolean }).polluted).toBeUndefined();
  });

  it('refuses forbidden field names at construction', () => {
    expect(() => obj({ constructor: int() })).toThrow(TypeError);
    expect(() => obj({ prototype: int() })).toThrow(TypeError);
  });

  it('does not read fields from the prototype chain', () => {
    const s = obj({ toString: optional(str()), valueOf: int() });
    expect(validate(s, { valueOf: 1 }).ok).toBe(true);
    expect(errorOf(s, {}).path).toBe('$.valueOf');
  });

  it('lets optional fields be absent and nullable values be null', () => {
    const s = obj({ a: optional(int()), b: nullable(str()) });
    expect(validate(s, { b: null }).ok).toBe(true);
    expect(validate(s, { a: undefined, b: 'x' }).ok).toBe(true);
    expect(errorOf(s, { a: null, b: 'x' }).path).toBe('$.a');
    expect(errorOf(s, {}).path).toBe('$.b');
  });

  it('refuses values that are not plain objects where objects are expected', () => {
    class Point {
      x = 1;
    }
    expect(errorOf(obj({ x: int() }), new Point()).message).toBe('expected plain object, got non-plain object');
    expect(validate(obj({ x: int() }), Object.assign(Object.create(null) as object, { x: 1 })).ok).toBe(true);
    for (const bad of [[], new Uint8Array(2), null, 'x', 1, new Map(), new Date(0), new Point()]) {
      expect(validate(obj({}), bad).ok).toBe(false);
      expect(validate(record(int()), bad).ok).toBe(false);
    }
  });

  it('bounds record entries and checks keys and values', () => {
    const r = record(str({ pattern: /^gpu[0-7]$/ }), int(), { max: 2 });
    expect(validate(r, { gpu0: 1, gpu1: 2 }).ok).toBe(true);
    expect(errorOf(r, { gpu0: 1, gpu1: 2, gpu2: 3 }).message).toBe(
      'expected plain object with at most 2 keys, got more than 2 keys',
    );
    const badKey = errorOf(r, { gpu9: 1 });
    expect(badKey.path).toBe('$.gpu9');
    expect(badKey.message).toContain('expected key string');
    expect(errorOf(r, { gpu3: 'x' }).path).toBe('$.gpu3');
    expect(validate(record(int()), { anything: 1 }).ok).toBe(true);
  });

  it('dispatches a discriminated union on its tag field', () => {
    expect(validate(Msg, { type: 'ping', seq: 1 }).ok).toBe(true);
    expect(validate(Msg, { type: 'release', gpu: 2, reason: null }).ok).toBe(true);
    expect(errorOf(Msg, { type: 'nope' })).toEqual({
      path: '$.type',
      message: 'expected one of "status" | "ping" | "release", got string of length 4',
    });
    expect(errorOf(Msg, { seq: 1 }).path).toBe('$.type');
    expect(errorOf(Msg, { type: 'ping', seq: 1, extra: 1 }).path).toBe('$.extra');
    expect(errorOf(Msg, { type: 'toString' }).path).toBe('$.type');
    expect(errorOf(Msg, Object.assign(Object.create({ type: 'ping' }) as object, { seq: 1 })).path).toBe('$');
  });

  it('refuses union variants that are not objects or that declare the tag', () => {
    expect(() => union('type', { a: obj({ type: lit('a') }) })).toThrow(TypeError);
    expect(() => union('type', { a: int() as never })).toThrow(TypeError);
  });

  it('checks byte arrays and their length', () => {
    expect(validate(bytes({ max: 4 }), new Uint8Array(4)).ok).toBe(true);
    expect(validate(bytes({ max: 4 }), Buffer.alloc(2)).ok).toBe(true);
    expect(errorOf(bytes({ max: 4 }), new Uint8Array(5)).message).toBe(
      'expected bytes with length <= 4, got bytes of length 5',
    );
    expect(validate(bytes(), [1, 2]).ok).toBe(false);
    expect(validate(bytes(), new Uint16Array(2)).ok).toBe(false);
  });

  it('infers static types from schemas', () => {
    type M = Infer<typeof Msg>;
    expectTypeOf<Extract<M, { type: 'ping' }>>().toEqualTypeOf<{ seq: number; type: 'ping' }>();
    expectTypeOf<Extract<M, { type: 'release' }>>().toEqualTypeOf<{
      gpu: number;
      reason: 'done' | 'evicted' | null;
      type: 'release';
    }>();
    expectTypeOf<Infer<typeof Gpu>>().toEqualTypeOf<{ id: number; epoch: number; model?: string | undefined }>();
    expectTypeOf<Infer<ReturnType<typeof record<'a' | 'b', number>>>>().toEqualTypeOf<{ a?: number; b?: number }>();
    expectTypeOf<Infer<ReturnType<typeof bytes>>>().toEqualTypeOf<Uint8Array>();
  });

  it('never throws on arbitrary values, even from the raw checks', () => {
    const schemas: Schema<unknown>[] = [
      Msg,
      Status,
      Gpu,
      record(str(), arr(num())),
      arr(nullable(bytes())),
      obj({ a: optional(bool()) }, { strict: false }),
    ];
    fc.assert(
      fc.property(
        fc.anything({
          withNullPrototype: true,
          withTypedArray: true,
          withSparseArray: true,
          withBoxedValues: true,
          withMap: true,
          withSet: true,
          withBigInt: true,
          withDate: true,
        }),
        (value) => {
          for (const s of schemas) {
            const r = validate(s, value);
            expect(typeof r.ok).toBe('boolean');
            const raw = s.check(value);
            expect(raw === null || typeof raw.expected === 'string').toBe(true);
          }
        },
      ),
      { numRuns: 2000 },
    );
  });

  it('turns a throwing getter or proxy into a validation failure', () => {
    const getter = Object.defineProperty({}, 'a', {
      enumerable: true,
      get: () => {
        throw new Error('boom');
      },
    });
    expect(validate(obj({ a: int() }), getter)).toEqual({
      ok: false,
      error: { code: 'invalid_message', path: '$', message: 'value could not be inspected: Error' },
    });
    const proxy = new Proxy(
      {},
      {
        ownKeys: () => {
          throw new Error('boom');
        },
        getOwnPropertyDescriptor: () => {
          throw new Error('boom');
        },
      },
    );
    expect(validate(record(int()), proxy).ok).toBe(false);
  });
});
