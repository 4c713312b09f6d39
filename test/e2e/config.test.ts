// Config files and command lines refused from the file (or argv) alone, naming the field, before anything starts.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, MAX_SCENARIO_BYTES, loadScenario, normalizeScenario } from '../../actors/config.ts';
import { parseCommand, flag, UsageError } from '../../bin/args.ts';
import { runCommand as run } from './harness.ts';

const dir = mkdtempSync(join(tmpdir(), 'switchyard-config-'));
const big = { name: 'llama-3-70b', profile: 'llama-3-70b', tp: 8 };
const small = { name: 'llama-3-8b', profile: 'llama-3-8b' };

/** The ConfigError message normalizeScenario throws for `raw`. */
function refusal(raw: unknown): string {
  try {
    normalizeScenario(raw);
  } catch (e) {
    if (e instanceof ConfigError) return e.message;
    throw e;
  }
  throw new Error('accepted');
}

describe('a scenario file', () => {
  it('refuses tp 3 for the 70B (it must divide the heads) naming models[0].tp', () => {
    expect(refusal({ models: [{ ...big, tp: 3 }] })).toMatch(/^models\[0\]\.tp: must divide the query heads \(64\)/);
  });

  it('refuses an exclusive split that needs 16 GPUs on an 8-GPU node', () => {
    expect(refusal({ models: [big, { ...small, replicas: 8 }] })).toMatch(
      /^placement\.policy: exclusive placement needs 16 GPUs .* the node has 8/,
    );
    // The same models under switch alternate, so they fit.
    expect(() =>
      normalizeScenario({ placement: { policy: 'switch' }, models: [big, { ...small, replicas: 8 }] }),
    ).not.toThrow();
  });

  it('refuses repairAt before at', () => {
    expect(refusal({ models: [small], faults: [{ at: 500, gpu: 0, kind: 'fault', repairAt: 100 }] })).toMatch(
      /^faults\[0\]\.repairAt: must be after at \(500\)/,
    );
  });

  it('keeps naming the field for wrong types, unknown keys, NaN, tp 9 and __proto__', () => {
    expect(refusal({ models: [{ ...small, profile: 'gpt-5' }] })).toMatch(/^models\[0\]\.profile: expected one of/);
    expect(refusal({ models: [{ ...small, colour: 'red' }] })).toMatch(/^models\[0\]\.colour: expected a declared key/);
    expect(refusal({ models: [{ ...small, replicas: NaN }] })).toMatch(/^models\[0\]\.replicas: expected safe integer/);
    expect(refusal({ models: [{ ...small, tp: 9 }] })).toMatch(/^models\[0\]\.tp: expected safe integer in \[1, 8\]/);
    expect(refusal(JSON.parse('{"models":[{"name":"a","profile":"llama-3-8b","__proto__":{}}]}'))).toMatch(
      /^models\[0\]\.__proto__/,
    );
  });

  it('gives a priority class named like an Object.prototype property the interactive defaults, as any other name', () => {
    const classes = { interactive: {}, toString: {}, valueOf: { maxQueueMs: 5 }, hasOwnProperty: {} };
    const m = normalizeScenario({ models: [{ ...small, classes }] }).models[0]!;
    const plain = normalizeScenario({ models: [{ ...small, classes: { interactive: {}, other: {} } }] }).models[0]!;
    const { name: _n, rank: _r, shedAt: _s, ...defaults } = plain.classes[1]!;
    expect(m.classes.map((c) => c.name)).toEqual(Object.keys(classes));
    expect(m.classes[1]).toMatchObject({ name: 'toString', ...defaults });
    expect(m.classes[2]).toMatchObject({ name: 'valueOf', ...defaults, maxQueueMs: 5 });
  });

  it('fills every default from the schema', () => {
    const s = normalizeScenario({ models: [small] });
    expect(s).toMatchObject({
      name: 'scenario',
      seed: 1,
      node: { gpu: 'H100-SXM', gpus: 8, repairMs: 60_000 },
      placement: { policy: 'exclusive', drainDeadlineMs: 30_000 },
      traffic: [],
      faults: [],
    });
    expect(s.models[0]).toMatchObject({
      kind: 'generate',
      tp: 1,
      replicas: 1,
      versions: ['v1'],
      estimate: 'maxTokens',
    });
    expect(s.models[0]!.classes.map((c) => c.name)).toEqual(['interactive', 'batch']);
  });

  it('refuses a file over 1 MiB before reading or parsing it, and an over-long string or fault list', () => {
    const huge = join(dir, 'huge.yaml');
    writeFileSync(
      huge,
      `models: [{name: a, profile: llama-3-8b}]\nfaults:\n${'  - {at: 1, gpu: 0, kind: fault}\n'.repeat(60_000)}`,
    );
    expect(() => loadScenario(huge)).toThrow(new RegExp(`at most ${MAX_SCENARIO_BYTES}`));
    const longName = join(dir, 'long.yaml');
    writeFileSync(longName, `name: ${'x'.repeat(900_000)}\nmodels: [{name: a, profile: llama-3-8b}]\n`);
    expect(() => loadScenario(longName)).toThrow(/^name: expected string with length <= 200/);
    const faults = join(dir, 'faults.yaml');
    writeFileSync(
      faults,
      `models: [{name: a, profile: llama-3-8b}]\nfaults:\n${'  - {at: 1, gpu: 0, kind: fault}\n'.repeat(1001)}`,
    );
    expect(() => loadScenario(faults)).toThrow(/^faults: expected array with length <= 1000/);
  });

  it('makes simulate exit 2 naming the field, before it runs anything', async () => {
    const bad = join(dir, 'tp3.yaml');
    writeFileSync(bad, 'models:\n  - {name: llama-3-70b, profile: llama-3-70b, tp: 3}\n');
    const r = await run(['simulate', bad, '--json']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/models\[0\]\.tp: must divide/);
    expect(r.stdout).toBe('');
  });
});

describe('command-line flags', () => {
  const FLAGS = { port: flag.intOr(8080, { min: 0, max: 65_535 }), json: flag.bool(), token: flag.list() };

  it('types values and fills defaults', () => {
    expect(parseCommand(['--port', '9', '--token', 'a,b', '--token=c'], FLAGS).values).toEqual({
      port: 9,
      json: false,
      token: ['a', 'b', 'c'],
    });
    expect(parseCommand([], FLAGS).values.port).toBe(8080);
  });

  it('refuses an unknown flag naming it, and a bad value naming its flag', () => {
    expect(() => parseCommand(['--prot', '9'], FLAGS)).toThrow(UsageError);
    expect(() => parseCommand(['--prot', '9'], FLAGS)).toThrow(/--prot/);
    expect(() => parseCommand(['--port', 'eighty'], FLAGS)).toThrow(/^--port: expected an integer >= 0 <= 65535/);
    expect(() => parseCommand(['--json=yes'], FLAGS)).toThrow(/--json/);
  });

  it('makes a command exit 2 with its usage on an unknown flag', async () => {
    const r = await run(['simulate', 'scenarios/chat-8b.yaml', '--jsno']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--jsno/);
    expect(r.stderr).toMatch(/usage: switchyard simulate/);
  });
});
