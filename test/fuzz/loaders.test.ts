// The tenants file and the config file through their loaders, with hostile values (test/fuzz/hostile.ts) in every
// field the shipped files and scenarios hold and keys named after prototype members in every table: each load ends in
// a typed refusal naming the field or in a sound config, never in another exception.
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { describe, expect, it } from 'vitest';
import { createRng, type Rng } from '../../runtime/rng.ts';
import { ConfigError, loadScenario, type Scenario } from '../../actors/config.ts';
import { createTenants, parseTenantsFile } from '../../api/tenants.ts';
import { ROOT } from '../e2e/harness.ts';
import {
  HOSTILE,
  PROTO_NAMES,
  brief,
  copy,
  jsonText,
  mutate,
  withKey,
  type FieldPath,
  type FieldSpec,
} from './hostile.ts';

/** Every path in a document: each container and each leaf. */
function pathsOf(v: unknown, at: FieldPath = []): FieldPath[] {
  const out: FieldPath[] = at.length > 0 ? [at] : [];
  if (Array.isArray(v)) v.forEach((x, i) => out.push(...pathsOf(x, [...at, i])));
  else if (v !== null && typeof v === 'object')
    for (const k of Object.keys(v)) out.push(...pathsOf((v as Record<string, unknown>)[k], [...at, k]));
  return out;
}

/** The field specs of a document: each path, its own value as the near one. */
function specsOf(doc: unknown): FieldSpec[] {
  return pathsOf(doc).map((path) => ({ path, near: [valueAt(doc, path)] }));
}

function valueAt(doc: unknown, path: FieldPath): unknown {
  let v = doc;
  for (const k of path) v = (v as Record<string | number, unknown>)[k];
  return v;
}

/** Renames one key of a table (or adds one) to a prototype member's name, keeping a valid value under it. */
function protoKey(doc: Record<string, unknown>, r: Rng): string {
  const tables = pathsOf(doc).filter((p) => {
    const v = valueAt(doc, p);
    return v !== null && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length > 0;
  });
  const path = tables[r.int(tables.length)]!;
  const table = valueAt(doc, path) as Record<string, unknown>;
  const keys = Object.keys(table);
  const from = keys[r.int(keys.length)]!;
  const to = PROTO_NAMES[r.int(PROTO_NAMES.length)]!;
  // An empty value sometimes: what a table fills in for a missing entry is looked up under the new name.
  const value = r.int(3) === 0 ? {} : table[from];
  if (r.int(2) === 0) delete table[from];
  withKey(to, value, table);
  return `${path.join('.')}: key ${from} -> ${to}`;
}

/** A hostile version of `base`: field values from the dictionary, or a prototype name as a table's key. */
function hostileDoc(
  base: Record<string, unknown>,
  specs: readonly FieldSpec[],
  r: Rng,
): { doc: unknown; what: string } {
  if (r.int(5) === 0) {
    const doc = copy(base);
    return { doc, what: protoKey(doc, r) };
  }
  if (r.int(40) === 0) {
    const v = HOSTILE[r.int(HOSTILE.length)];
    return { doc: v, what: `document=${brief(v)}` };
  }
  const m = mutate(base, specs, r);
  return { doc: m.value, what: m.changes.join(', ') };
}

/** Text of a document: YAML (mostly) or JSON, both of which the loaders read. */
const textOf = (doc: unknown, r: Rng): string => (r.int(3) === 0 ? jsonText(doc) : stringify(doc));

/** Functions, NaN or undefined reached anywhere in a loaded value: a prototype member or a hole taken as data. */
function unsound(v: unknown, at = '', seen = new Set<unknown>()): string | null {
  if (typeof v === 'function') return `${at} is a function`;
  if (typeof v === 'number' && Number.isNaN(v)) return `${at} is NaN`;
  if (v === null || typeof v !== 'object' || seen.has(v)) return null;
  seen.add(v);
  for (const k of Object.keys(v)) {
    const x = (v as Record<string, unknown>)[k];
    if (x === undefined && !Array.isArray(v)) continue;
    const bad = x === undefined ? `${at}.${k} is a hole` : unsound(x, `${at}.${k}`, seen);
    if (bad) return bad;
  }
  return null;
}

/** A class whose limits are not all numbers (the router divides and compares with them). */
function classLimits(s: Scenario): string | null {
  for (const m of s.models)
    for (const c of m.classes)
      for (const k of ['ttftMs', 'tpotMs', 'maxQueueMs', 'maxQueued', 'maxQueuedTokens', 'shedAt'] as const)
        if (typeof c[k] !== 'number') return `models.${m.name}.classes.${c.name}.${k} is ${typeof c[k]}`;
  return null;
}

/** Seeded cases per loader (each config case writes and loads a file). */
const CASES = Number(process.env['FUZZ_LOADER_CASES'] ?? 1000);

describe('the config loader under hostile values', () => {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-config-fuzz-'));
  const files = [
    join(ROOT, 'bin/default-config.yaml'),
    ...readdirSync(join(ROOT, 'scenarios'))
      .filter((f) => f.endsWith('.yaml') && f !== 'fleet-mixed.yaml' && f !== 'real-tiny.yaml')
      .map((f) => join(ROOT, 'scenarios', f)),
  ];
  const bases = files.map((f) => parse(readFileSync(f, 'utf8')) as Record<string, unknown>);

  it(`refuses with a ConfigError or loads a sound scenario, for ${CASES} seeded cases`, () => {
    const r = createRng(32);
    const specs = bases.map(specsOf);
    const failures: string[] = [];
    let loaded = 0;
    let refused = 0;
    for (let i = 0; i < CASES; i++) {
      const b = r.int(bases.length);
      const { doc, what } = hostileDoc(bases[b]!, specs[b]!, r);
      const file = join(dir, `${i % 16}.yaml`);
      writeFileSync(file, textOf(doc, r));
      try {
        // Each class's limits are the router's: a class named after a prototype member must still get numbers.
        const s = loadScenario(file, { calibrations: false });
        const bad = unsound(s, 'scenario') ?? classLimits(s);
        if (bad) failures.push(`${bad} <- ${what}`);
        loaded++;
      } catch (e) {
        if (e instanceof ConfigError) refused++;
        else failures.push(`${(e as Error).name}: ${(e as Error).message} <- ${what}`);
      }
    }
    expect(failures.slice(0, 10)).toEqual([]);
    // Both ends were reached: some hostile values are valid (a name, a number in range), most are refused.
    expect(loaded).toBeGreaterThan(0);
    expect(refused).toBeGreaterThan(loaded);
  });
});

describe('the tenants file under hostile values', () => {
  const hash = (c: string): string => c.repeat(64);
  const base: Record<string, unknown> = {
    tenants: [
      {
        name: 'team-a',
        tokenSha256: [hash('a')],
        models: ['llama-3-8b'],
        priorities: ['interactive', 'batch'],
        weight: 2,
        maxConcurrent: 8,
        tokensPerSecond: 1000,
        burstTokens: 4000,
      },
      { name: 'team-b', tokenSha256: [hash('b'), hash('c')] },
    ],
  };

  it(`refuses with a message or builds tenants, for ${CASES} seeded cases`, () => {
    const r = createRng(33);
    const specs = specsOf(base);
    const failures: string[] = [];
    let loaded = 0;
    for (let i = 0; i < CASES; i++) {
      const { doc, what } = hostileDoc(base, specs, r);
      try {
        const p = parseTenantsFile(textOf(doc, r));
        if (!p.ok) {
          if (typeof p.message !== 'string' || p.message.length === 0) failures.push(`no message <- ${what}`);
          continue;
        }
        loaded++;
        const tenants = createTenants(p.tenants);
        const bad = unsound(tenants.list(), 'tenants');
        if (bad) failures.push(`${bad} <- ${what}`);
        for (const token of ['', 'a', ...PROTO_NAMES])
          if (tenants.of(token) !== null) failures.push(`${token} matched`);
      } catch (e) {
        failures.push(`${(e as Error).name}: ${(e as Error).message} <- ${what}`);
      }
    }
    expect(failures.slice(0, 10)).toEqual([]);
    expect(loaded).toBeGreaterThan(0);
  });
});
