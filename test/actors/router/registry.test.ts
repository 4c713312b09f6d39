import { describe, expect, it } from 'vitest';
import { createRegistry } from '../../../actors/router/registry.ts';
import { createRng } from '../../../runtime/rng.ts';

const registry = () =>
  createRegistry([
    { name: 'llama', versions: ['v1', 'v2', 'v3'], aliases: { stable: 'v2' }, split: { v2: 90, v3: 10 } },
    { name: 'small', versions: ['a', 'b'], aliases: {} },
  ]);

describe('registry', () => {
  describe('resolution', () => {
    it('resolves an exact version to itself and never falls back from it', () => {
      const r = registry().resolve('llama', 'v1', createRng(1));
      expect(r).toEqual({ ok: true, model: 'llama', version: 'v1', by: 'exact', fallbacks: [] });
    });

    it('resolves aliases, with latest defaulting to the last version and stable to the first', () => {
      const reg = registry();
      const rng = createRng(1);
      expect(reg.resolve('llama', 'stable', rng)).toMatchObject({ ok: true, version: 'v2', by: 'alias' });
      expect(reg.resolve('llama', 'latest', rng)).toMatchObject({ ok: true, version: 'v3', by: 'alias' });
      expect(reg.resolve('small', 'stable', rng)).toMatchObject({ ok: true, version: 'a' });
      expect(reg.resolve('small', 'latest', rng)).toMatchObject({ ok: true, version: 'b' });
    });

    it('knows no version or alias by an Object.prototype name, and keeps such an alias set by a rollout apart', () => {
      const reg = registry();
      for (const name of ['toString', 'constructor', 'valueOf', '__proto__', 'hasOwnProperty']) {
        expect(reg.resolve('llama', name, createRng(1)), name).toMatchObject({ ok: false });
        expect(reg.check('llama', name)?.code, name).toBe('model_not_found');
      }
      expect(reg.setAlias('llama', '__proto__', 'v3')).toBeNull();
      expect(reg.resolve('llama', '__proto__', createRng(1))).toMatchObject({ ok: true, version: 'v3', by: 'alias' });
      expect(reg.resolve('llama', 'stable', createRng(1))).toMatchObject({ ok: true, version: 'v2', by: 'alias' });
      expect(Object.getPrototypeOf(reg.get('llama')!.aliases)).toBe(Object.prototype);
    });

    it('sends requests that name no version to the stable alias when there is no split', () => {
      const r = registry().resolve('small', undefined, createRng(1));
      expect(r).toMatchObject({ ok: true, version: 'a', by: 'default' });
    });

    it('splits unpinned requests between versions in the configured proportions (seeded, 20,000 requests)', () => {
      const reg = registry();
      const rng = createRng(42);
      const counts: Record<string, number> = {};
      const n = 20_000;
      for (let i = 0; i < n; i++) {
        const r = reg.resolve('llama', undefined, rng);
        if (!r.ok) throw new Error('unexpected failure');
        expect(r.by).toBe('split');
        counts[r.version] = (counts[r.version] ?? 0) + 1;
      }
      expect(counts['v1']).toBeUndefined();
      // Binomial standard deviation at p = 0.1, n = 20,000 is 0.21 %; allow five of them.
      expect(counts['v3']! / n).toBeGreaterThan(0.1 - 0.0106);
      expect(counts['v3']! / n).toBeLessThan(0.1 + 0.0106);
      expect(counts['v2']! + counts['v3']!).toBe(n);
    });

    it('gives the same split for the same seed', () => {
      const draw = (seed: number) => {
        const reg = registry();
        const rng = createRng(seed);
        return Array.from({ length: 200 }, () => {
          const r = reg.resolve('llama', undefined, rng);
          return r.ok ? r.version : '';
        }).join(',');
      };
      expect(draw(7)).toBe(draw(7));
      expect(draw(7)).not.toBe(draw(8));
    });

    it('lists what exists when the model is unknown', () => {
      const r = registry().resolve('gpt', undefined, createRng(1));
      expect(r.ok).toBe(false);
      if (r.ok) return;
      expect(r.failure.code).toBe('model_not_found');
      expect(r.failure.retryable).toBe(false);
      expect(r.failure.message).toContain('llama@{v1,v2,v3}');
      expect(r.failure.message).toContain('small@{a,b}');
    });

    it('lists the versions and aliases when the version is unknown', () => {
      const r = registry().resolve('llama', 'v9', createRng(1));
      expect(r.ok).toBe(false);
      if (r.ok) return;
      expect(r.failure.code).toBe('model_not_found');
      expect(r.failure.message).toMatch(/v1, v2, v3, stable, latest/);
    });

    it('offers the other advertised versions as fallbacks for unpinned requests', () => {
      const r = registry().resolve('llama', 'stable', createRng(1));
      expect(r).toMatchObject({ ok: true, version: 'v2', fallbacks: ['v3'] });
    });
  });

  describe('changes while serving', () => {
    it('moves an alias and replaces a split, validating both', () => {
      const reg = registry();
      expect(reg.setAlias('llama', 'stable', 'v3')).toBeNull();
      expect(reg.resolve('llama', 'stable', createRng(1))).toMatchObject({ version: 'v3' });
      expect(reg.setAlias('llama', 'stable', 'v9')?.code).toBe('model_not_found');
      expect(reg.setAlias('llama', 'v1', 'v2')?.code).toBe('invalid_request');
      expect(reg.setSplit('llama', { v1: 1 })).toBeNull();
      expect(reg.resolve('llama', undefined, createRng(1))).toMatchObject({ version: 'v1', by: 'split' });
      expect(reg.setSplit('llama', { v9: 1 })?.code).toBe('invalid_request');
      expect(reg.setSplit('llama', null)).toBeNull();
      expect(reg.resolve('llama', undefined, createRng(1))).toMatchObject({ version: 'v3', by: 'default' });
    });

    it('refuses at creation an alias or split that names an unknown version', () => {
      expect(() => createRegistry([{ name: 'm', versions: ['v1'], aliases: { stable: 'v2' } }])).toThrow(
        /aliases\.stable/,
      );
      expect(() => createRegistry([{ name: 'm', versions: ['v1'], aliases: {}, split: { v2: 1 } }])).toThrow(
        /split\.v2/,
      );
    });
  });
});
