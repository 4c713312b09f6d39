// Tests of the cost model built from a calibrated engine profile: step times, cache, load time, files and keys.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import {
  costModelFor,
  costModelKey,
  createProfileCostModel,
  describeOrigin,
  EngineProfileError,
  originDifferences,
  predictS,
  profileOrigin,
  readEngineProfile,
  type EngineProfile,
} from '../../../actors/gpu/profile-cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';

/** A profile with round coefficients: 1 ms base, 0.1 ms a prefill token, 2 ms a decoding sequence. */
function sampleProfile(over: Partial<EngineProfile> = {}): EngineProfile {
  return {
    kind: 'switchyard.engine-profile',
    version: 1,
    name: 'sample',
    engine: 'llama.cpp',
    model: 'sample.gguf',
    threads: 1,
    timing: 'cpu',
    machine: { cpus: 2, platform: 'linux', arch: 'x64' },
    loadS: 3,
    capacity: { sequences: 4, cellsPerSequence: 511, totalCells: 2048, batchTokens: 64 },
    coefficients: {
      baseS: 1e-3,
      perPrefillTokenS: 1e-4,
      perPrefillPairS: 1e-8,
      perDecodeSeqS: 2e-3,
      perContextTokenS: 1e-6,
    },
    fit: { points: 10, meanRelError: 0.05, maxRelError: 0.1 },
    samples: [],
    ...over,
  };
}

const dir = mkdtempSync(join(tmpdir(), 'switchyard-profile-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the profile cost model', () => {
  const profile = sampleProfile();
  const cost = createProfileCostModel(profile, modelProfile('llama-3-8b'));

  it("prices a mixed step with the profile's linear formula", () => {
    const shape = { prefill: [{ tokens: 32, cached: 64 }], decodeBatch: 3, decodeContext: 300 };
    const expected = predictS(profile.coefficients, {
      prefillTokens: 32,
      prefillPairs: 32 * (64 + 16),
      decodeSeqs: 3,
      contextTokens: 300,
    });
    expect(cost.stepS(shape)).toBeCloseTo(expected, 12);
    expect(cost.step(shape).totalS).toBeCloseTo(expected, 12);
  });

  it('costs nothing for a step with no tokens, like the roofline', () => {
    expect(cost.stepS({ prefill: [], decodeBatch: 0, decodeContext: 0 })).toBe(0);
    expect(cost.prefillS(0, 10)).toBe(0);
  });

  it('makes a decode batch of eight cost eight decoding sequences (the per-sequence term)', () => {
    const one = cost.decodeS(1, 100);
    const eight = cost.decodeS(8, 800);
    expect(eight - one).toBeCloseTo(7 * (2e-3 + 100 * 1e-6), 12);
  });

  it('charges every prefill chunk its fixed cost (each sequence of a llama.cpp batch runs on its own)', () => {
    const chunked = createProfileCostModel(
      sampleProfile({ coefficients: { ...profile.coefficients, perPrefillSeqS: 5e-3 } }),
      modelProfile('llama-3-8b'),
    );
    const one = { prefill: [{ tokens: 32, cached: 0 }], decodeBatch: 0, decodeContext: 0 };
    const two = {
      prefill: [
        { tokens: 16, cached: 0 },
        { tokens: 16, cached: 0 },
      ],
      decodeBatch: 0,
      decodeContext: 0,
    };
    expect(chunked.stepS(two) - chunked.stepS(one)).toBeCloseTo(5e-3 + (2 * 16 * 8 - 32 * 16) * 1e-8, 12);
    expect(cost.stepS(two)).toBeLessThan(chunked.stepS(two));
  });

  it("sizes the KV ledger from the engine's real cache and a sequence's cells", () => {
    expect(cost.kvBlocks(16)).toBe(128);
    expect(cost.model.maxContext).toBe(511);
    expect(cost.tp).toBe(1);
    expect(() => cost.kvBlocks(0)).toThrow(RangeError);
  });

  it('loads in the time the calibration measured', () => {
    expect(cost.loadS()).toBe(3);
  });
});

describe('engine profile files', () => {
  it('reads a profile written as JSON', () => {
    const file = join(dir, 'ok.json');
    writeFileSync(file, JSON.stringify(sampleProfile()));
    expect(readEngineProfile(file).name).toBe('sample');
  });

  it('refuses a missing file, naming it', () => {
    expect(() => readEngineProfile(join(dir, 'none.json'))).toThrow(EngineProfileError);
    expect(() => readEngineProfile(join(dir, 'none.json'))).toThrow(/none\.json/);
  });

  it('refuses JSON that is not an engine profile or lacks coefficients', () => {
    const other = join(dir, 'other.json');
    writeFileSync(other, JSON.stringify({ kind: 'something' }));
    expect(() => readEngineProfile(other)).toThrow(/not a switchyard engine profile/);
    const broken = join(dir, 'broken.json');
    const p = sampleProfile();
    writeFileSync(broken, JSON.stringify({ ...p, coefficients: { ...p.coefficients, baseS: 'x' } }));
    expect(() => readEngineProfile(broken)).toThrow(/coefficients/);
  });
});

describe('where a profile was fitted', () => {
  const here = { nodeLlamaCpp: '3.22.1', build: 'cpu', devices: ['AMD EPYC'] };

  it('reads an older profile without the engine build and device as fitted on an unknown one', () => {
    const file = join(dir, 'old.json');
    writeFileSync(file, JSON.stringify(sampleProfile()));
    const p = readEngineProfile(file);
    expect(p.fittedOn).toBeUndefined();
    expect(profileOrigin(p)).toEqual({ nodeLlamaCpp: 'unknown', build: 'unknown', devices: ['unknown'] });
    expect(describeOrigin(profileOrigin(p), p.threads)).toBe(
      'node-llama-cpp unknown unknown build on unknown, 1 thread',
    );
  });

  it('keeps the build, device and threads a profile records, and refuses a malformed record', () => {
    const file = join(dir, 'origin.json');
    writeFileSync(file, JSON.stringify(sampleProfile({ fittedOn: here, threads: 2 })));
    const p = readEngineProfile(file);
    expect(profileOrigin(p)).toEqual(here);
    expect(describeOrigin(profileOrigin(p), p.threads)).toBe('node-llama-cpp 3.22.1 cpu build on AMD EPYC, 2 threads');
    const bad = join(dir, 'bad-origin.json');
    writeFileSync(bad, JSON.stringify({ ...sampleProfile(), fittedOn: { build: 'cpu', devices: 'x' } }));
    expect(() => readEngineProfile(bad)).toThrow(/fittedOn/);
  });

  it('names what differs between where a profile was fitted and here, leaving out what either does not know', () => {
    const gpu = { nodeLlamaCpp: '3.22.1', build: 'vulkan', devices: ['NVIDIA L4'] };
    expect(originDifferences({ origin: gpu, threads: 4 }, { origin: here, threads: 1 })).toEqual([
      'build: vulkan → cpu',
      'device: NVIDIA L4 → AMD EPYC',
      'threads: 4 → 1',
    ]);
    const unknown = profileOrigin({});
    expect(originDifferences({ origin: unknown, threads: 1 }, { origin: here, threads: 1 })).toEqual([]);
  });
});

describe('cost model keys', () => {
  it('keeps the profile name as the key of an uncalibrated model, so the roofline is built as before', () => {
    expect(costModelKey({ profile: 'llama-3-8b' })).toBe('llama-3-8b');
    const roofline = costModelFor('llama-3-8b', 'H100-SXM', 1);
    const direct = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
    const shape = { prefill: [{ tokens: 512, cached: 0 }], decodeBatch: 16, decodeContext: 8000 };
    expect(roofline.stepS(shape)).toBe(direct.stepS(shape));
  });

  it("builds a calibrated model's cost model from its profile file through the key a worker receives", () => {
    const file = join(dir, 'keyed.json');
    writeFileSync(file, JSON.stringify(sampleProfile({ name: 'keyed', loadS: 7 })));
    const key = costModelKey({ profile: 'llama-3-8b', calibration: file });
    expect(key.startsWith('calibrated:')).toBe(true);
    const cost = costModelFor(key, 'H100-SXM', 1);
    expect(cost.loadS()).toBe(7);
    expect(cost.kvBlocks(16)).toBe(128);
    expect(() => costModelFor(key, 'H100-SXM', 2)).toThrow(/tp 1/);
  });
});

describe("an uncalibrated llama.cpp model's default cost, from its GGUF size", () => {
  const engine = (file: string) => ({ file, threads: 1, sequences: 4, contextTokens: 512, batchTokens: 64 });
  const write = (name: string, bytes: number): string => {
    const file = join(dir, name);
    writeFileSync(file, Buffer.alloc(bytes));
    return file;
  };

  it('keys the model by its file size and cache, and prices steps from the size: twice the bytes, twice the time', () => {
    const small = costModelKey({ profile: 'llama-3-8b', engine: engine(write('small.gguf', 13_000_000)) });
    const large = costModelKey({ profile: 'llama-3-8b', engine: engine(write('large.gguf', 26_000_000)) });
    expect(small).toBe('sized:13000000:1:4:512:64|llama-3-8b');
    const [s, l] = [costModelFor(small, 'H100-SXM', 1), costModelFor(large, 'H100-SXM', 8)];
    const shape = { prefill: [{ tokens: 48, cached: 0 }], decodeBatch: 3, decodeContext: 300 };
    expect(l.stepS(shape)).toBeCloseTo(2 * s.stepS(shape), 12);
    // A pass reads the weights once, a token adds its matrix work: 8 decodes in one pass cost less than 8 steps of
    // one, 8 decodes in 8 passes cost 8 times one.
    const pass = 13e6 / 8e9;
    const token = 13e6 / 26e9;
    expect(s.decodeS(1, 100)).toBeCloseTo(pass + token, 12);
    expect(s.decodeS(8, 800)).toBeCloseTo(pass + 8 * token, 12);
    expect(s.stepS({ prefill: [], decodeBatch: 8, decodeContext: 800, passes: 8 })).toBeCloseTo(
      8 * s.decodeS(1, 100),
      12,
    );
    // Its cache is the engine's: 4 sequences of 512 cells, in 16-token blocks.
    expect(s.kvBlocks(16)).toBe(128);
    expect(s.model.maxContext).toBe(511);
    // Not the H100 roofline of the profile named for its shape.
    expect(s.stepS(shape)).not.toBeCloseTo(costModelFor('llama-3-8b', 'H100-SXM', 1).stepS(shape), 6);
  });

  it('falls back to the roofline key while the file does not exist (a model generated on first use)', () => {
    expect(costModelKey({ profile: 'llama-3-8b', engine: engine(join(dir, 'absent.gguf')) })).toBe('llama-3-8b');
  });
});
