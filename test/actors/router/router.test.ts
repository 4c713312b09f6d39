import { describe, expect, it } from 'vitest';
import { ROUTING_POLICIES, type Admission } from '../../../actors/router/router.ts';
import { CLASSES, fakeReplica, req, routerFor } from './fakes.ts';

const chosen = (a: Admission): string | null => (a.ok ? (a.replica?.id ?? null) : null);

describe('router', () => {
  describe('readiness', () => {
    it('never routes to a loading, placing, draining or failed replica, whatever the policy', () => {
      for (const policy of ROUTING_POLICIES) {
        const reps = [
          fakeReplica('loading', 'm', 'v1', 'loading'),
          fakeReplica('placing', 'm', 'v1', 'placing'),
          fakeReplica('draining', 'm', 'v1', 'draining.stepping'),
          fakeReplica('failed', 'm', 'v1', 'failed'),
          fakeReplica('ready', 'm', 'v1', 'ready.saturated'),
        ];
        const router = routerFor(reps, { policy });
        for (let i = 0; i < 40; i++) expect(chosen(router.route(req()))).toBe('ready');
      }
    });

    it('records why the other replicas were not considered', () => {
      const router = routerFor([
        fakeReplica('a', 'm', 'v1', 'loading'),
        fakeReplica('b', 'm', 'v1', 'draining.stepping'),
        fakeReplica('c', 'm', 'v1'),
      ]);
      const a = router.route(req());
      expect(a.trace.excluded).toEqual([
        { replica: 'a', why: 'not ready (loading)' },
        { replica: 'b', why: 'not ready (draining.stepping)' },
      ]);
    });

    it('leaves out ejected replicas and says why', () => {
      const router = routerFor([fakeReplica('a', 'm', 'v1'), fakeReplica('b', 'm', 'v1')], {
        ejected: (id) => (id === 'a' ? 'slow steps' : null),
      });
      const a = router.route(req());
      expect(chosen(a)).toBe('b');
      expect(a.trace.excluded).toEqual([{ replica: 'a', why: 'ejected: slow steps' }]);
    });

    it('still routes to ejected replicas when every ready replica is ejected, rather than holding the request', () => {
      const router = routerFor([fakeReplica('a', 'm', 'v1'), fakeReplica('b', 'm', 'v1', 'loading')], {
        ejected: () => 'slow steps',
        etaMs: () => 0,
      });
      const a = router.route(req());
      expect(chosen(a)).toBe('a');
      expect(a.trace.excluded).toEqual([{ replica: 'b', why: 'not ready (loading)' }]);
    });

    it('holds a request, bounded, while a replica loads, and refuses it when the load outlasts its budget', () => {
      const reps = [fakeReplica('a', 'm', 'v1', 'loading')];
      const soon = routerFor(reps, { etaMs: () => 400 }).route(req());
      expect(soon.ok && soon.replica === null && soon.trace.outcome === 'held').toBe(true);
      const late = routerFor(reps, { etaMs: () => 5000 }).route(req());
      expect(late.ok).toBe(false);
      if (late.ok) return;
      expect(late.failure.code).toBe('overloaded');
      expect(late.failure.retryAfterMs).toBe(4000);
    });
  });

  describe('the cost policy', () => {
    it('picks the replica with the lowest predicted time to first token', () => {
      const busy = fakeReplica('busy', 'm', 'v1');
      busy.load(6000);
      busy.load(6000);
      const light = fakeReplica('light', 'm', 'v1');
      light.load(1000);
      const idle = fakeReplica('idle', 'm', 'v1');
      idle.load(3000);
      const a = routerFor([busy, light, idle]).route(req());
      expect(chosen(a)).toBe('light');
      const [b, l, i] = a.trace.candidates;
      expect(l!.ttftMs).toBeLessThan(i!.ttftMs);
      expect(i!.ttftMs).toBeLessThan(b!.ttftMs);
    });

    it('counts only work of the same or a higher class as ahead of a request', () => {
      const r = fakeReplica('a', 'm', 'v1');
      r.load(8000, 100, 1);
      r.load(8000, 100, 1);
      const router = routerFor([r]);
      const inter = router.route(req());
      const batch = router.route(req({ priority: 'batch' }));
      expect(inter.trace.candidates[0]!.aheadTokens).toBe(0);
      expect(batch.trace.candidates[0]!.aheadTokens).toBe(16_000);
      expect(inter.trace.candidates[0]!.waitMs).toBeLessThan(batch.trace.candidates[0]!.waitMs);
    });

    it('treats KV headroom as a hard limit: a quicker replica without room for the request is passed over', () => {
      // 560 blocks of 16 tokens; a queued 7000 + 1000-token request commits 500, leaving 60: too few for 500 + 1000.
      const full = fakeReplica('full', 'm', 'v1', 'ready.busy', 560);
      full.load(7000, 1000);
      const roomy = fakeReplica('roomy', 'm', 'v1');
      roomy.load(8000);
      roomy.load(8000);
      const a = routerFor([full, roomy]).route(req({ promptTokens: 500, maxTokens: 1000, estOutputTokens: 1000 }));
      const [f, r] = a.trace.candidates;
      expect(f!.headroom).toBe(false);
      expect(f!.freeBlocks).toBeLessThan(f!.needBlocks);
      expect(f!.waitMs).toBeLessThan(r!.waitMs);
      expect(chosen(a)).toBe('roomy');
    });

    it('refuses with overloaded and a retryAfterMs when no replica has KV headroom', () => {
      const full = fakeReplica('full', 'm', 'v1', 'ready.busy', 560);
      full.load(7000, 1000);
      const a = routerFor([full]).route(req({ promptTokens: 500, maxTokens: 1000, estOutputTokens: 1000 }));
      expect(a.ok).toBe(false);
      if (a.ok) return;
      expect(a.failure.code).toBe('overloaded');
      expect(a.failure.message).toMatch(/KV headroom/);
      expect(a.failure.retryAfterMs).toBeGreaterThan(0);
    });

    it('refuses a request larger than any replica’s whole KV cache as the client’s error', () => {
      const small = fakeReplica('small', 'm', 'v1', 'ready.idle', 100);
      const a = routerFor([small]).route(req({ promptTokens: 4000, maxTokens: 1000, estOutputTokens: 1000 }));
      expect(a.ok).toBe(false);
      if (!a.ok) expect(a.failure.code).toBe('invalid_request');
    });
  });

  describe('baseline policies', () => {
    it('round-robin cycles through the ready replicas', () => {
      const reps = ['a', 'b', 'c'].map((id) => fakeReplica(id, 'm', 'v1'));
      const router = routerFor(reps, { policy: 'round-robin' });
      expect(Array.from({ length: 6 }, () => chosen(router.route(req())))).toEqual(['a', 'b', 'c', 'a', 'b', 'c']);
    });

    it('least-requests picks the replica holding the fewest requests, ignoring their size', () => {
      const a = fakeReplica('a', 'm', 'v1');
      a.load(100);
      a.load(100);
      const b = fakeReplica('b', 'm', 'v1');
      b.load(8000);
      expect(chosen(routerFor([a, b], { policy: 'least-requests' }).route(req()))).toBe('b');
    });

    it('power-of-two picks the shorter queue of two sampled replicas', () => {
      const a = fakeReplica('a', 'm', 'v1');
      for (let i = 0; i < 5; i++) a.load(100);
      const b = fakeReplica('b', 'm', 'v1');
      const router = routerFor([a, b], { policy: 'power-of-two' });
      for (let i = 0; i < 10; i++) expect(chosen(router.route(req()))).toBe('b');
    });

    it('can be switched at run time', () => {
      const router = routerFor([fakeReplica('a', 'm', 'v1')]);
      router.setPolicy('least-requests');
      expect(router.policy).toBe('least-requests');
      expect(router.route(req()).trace.policy).toBe('least-requests');
    });
  });

  describe('admission', () => {
    it('rejects at once with overloaded when the predicted wait exceeds the class budget, with retryAfterMs from the drain', () => {
      const r = fakeReplica('a', 'm', 'v1');
      for (let i = 0; i < 20; i++) r.load(8000);
      const a = routerFor([r]).route(req());
      expect(a.ok).toBe(false);
      if (a.ok) return;
      const wait = a.trace.candidates[0]!.waitMs;
      expect(wait).toBeGreaterThan(1000);
      expect(a.failure.code).toBe('overloaded');
      expect(a.failure.retryable).toBe(true);
      expect(a.failure.retryAfterMs).toBe(Math.ceil(wait - 1000));
      expect(a.trace.budgetMs).toBe(1000);
    });

    it('uses the client deadline when it is shorter than the class budget', () => {
      const r = fakeReplica('a', 'm', 'v1');
      for (let i = 0; i < 4; i++) r.load(8000);
      const router = routerFor([r]);
      const relaxed = router.route(req());
      expect(relaxed.ok).toBe(true);
      const hurried = router.route(req({ deadlineMs: 50 }));
      expect(hurried.ok).toBe(false);
      expect(hurried.trace.budgetMs).toBe(50);
    });

    it('bounds each class queue in count and in tokens across the model', () => {
      const r = fakeReplica('a', 'm', 'v1');
      r.load(100);
      r.load(100);
      const byCount = routerFor([r], {
        classes: { ...CLASSES, interactive: { ...CLASSES['interactive']!, maxQueued: 2 } },
      }).route(req());
      expect(byCount.ok).toBe(false);
      if (!byCount.ok)
        expect(byCount.failure).toMatchObject({
          code: 'overloaded',
          message: expect.stringMatching(/queue of m is full/),
        });
      const byTokens = routerFor([r], {
        classes: { ...CLASSES, interactive: { ...CLASSES['interactive']!, maxQueuedTokens: 600 } },
      }).route(req());
      expect(byTokens.ok).toBe(false);
      if (!byTokens.ok) expect(byTokens.failure.retryAfterMs).toBeGreaterThan(0);
      const held = routerFor([r], {
        held: () => ({ count: 5, tokens: 100 }),
        classes: { ...CLASSES, interactive: { ...CLASSES['interactive']!, maxQueued: 6 } },
      }).route(req());
      expect(held.ok).toBe(false);
    });

    it('sheds the lower class first: batch is refused while interactive still gets in', () => {
      const r = fakeReplica('a', 'm', 'v1');
      // About 0.6 s of interactive prefill queued: past half the interactive budget, within all of it.
      for (let i = 0; i < 3; i++) r.load(8000);
      const router = routerFor([r]);
      const inter = router.route(req());
      const batch = router.route(req({ priority: 'batch' }));
      expect(inter.trace.candidates[0]!.topWaitMs).toBeGreaterThan(500);
      expect(inter.ok).toBe(true);
      expect(batch.ok).toBe(false);
      if (!batch.ok) {
        expect(batch.failure.code).toBe('overloaded');
        expect(batch.failure.message).toMatch(/shedding batch/);
        expect(batch.failure.retryAfterMs).toBeGreaterThan(0);
      }
    });

    it('answers model_unavailable with the reason when no replica of the model can exist', () => {
      const a = routerFor([], { unavailable: () => 'm needs 8 healthy GPUs, 7 available' }).route(req());
      expect(a.ok).toBe(false);
      if (!a.ok)
        expect(a.failure).toMatchObject({
          code: 'model_unavailable',
          message: 'm needs 8 healthy GPUs, 7 available',
          retryable: true,
        });
    });

    it('answers model_not_found for an unknown model or version', () => {
      const router = routerFor([fakeReplica('a', 'm', 'v1')]);
      const model = router.route(req({ model: 'nope' }));
      const version = router.route(req({ version: 'v7' }));
      expect(!model.ok && model.failure.code).toBe('model_not_found');
      expect(!version.ok && version.failure.code).toBe('model_not_found');
    });
  });

  describe('client errors', () => {
    it('rejects bad parameters as invalid_request before any replica is looked at', () => {
      const r = fakeReplica('a', 'm', 'v1');
      const router = routerFor([r]);
      const cases = [
        req({ promptTokens: 8000, maxTokens: 500 }),
        req({ promptTokens: 0 }),
        req({ maxTokens: 0 }),
        req({ promptTokens: 1.5 }),
        req({ priority: 'vip' }),
        req({ deadlineMs: -1 }),
      ];
      for (const c of cases) {
        const a = router.route(c);
        expect(a.ok).toBe(false);
        if (a.ok) continue;
        expect(a.failure.code).toBe('invalid_request');
        expect(a.failure.retryable).toBe(false);
        expect(a.trace.candidates).toEqual([]);
        expect(a.trace.chosen).toBeNull();
      }
      expect(r.work.stats().waiting).toBe(0);
    });

    it('refuses a priority class or version named like an Object.prototype property, with or without the edge', () => {
      const r = fakeReplica('a', 'm', 'v1');
      const router = routerFor([r]);
      for (const name of ['toString', 'constructor', 'valueOf', '__proto__', 'hasOwnProperty']) {
        const byClass = router.route(req({ priority: name }));
        expect(!byClass.ok && byClass.failure.code, name).toBe('invalid_request');
        const byVersion = router.route(req({ version: name }));
        expect(!byVersion.ok && byVersion.failure.code, name).toBe('model_not_found');
        expect(router.route(req({ model: name })).ok, name).toBe(false);
        expect(router.check({ model: 'm', priority: name })?.code, name).toBe('invalid_request');
        expect(router.check({ model: 'm', version: name })?.code, name).toBe('model_not_found');
        expect(router.check({ model: name })?.code, name).toBe('model_not_found');
      }
      expect(router.check({ model: 'm', version: 'v1', priority: 'batch' })).toBeNull();
      expect(r.work.stats().waiting).toBe(0);
    });

    it('says how long the request is and what the context holds', () => {
      const a = routerFor([fakeReplica('a', 'm', 'v1')]).route(req({ promptTokens: 8000, maxTokens: 500 }));
      expect(!a.ok && a.failure.message).toBe("prompt (8000) + max_tokens (500) exceeds the model's context of 8192");
    });
  });

  describe('versions', () => {
    it('routes only to replicas of the resolved version', () => {
      const reps = [fakeReplica('v1a', 'm', 'v1'), fakeReplica('v2a', 'm', 'v2')];
      const router = routerFor(reps);
      for (let i = 0; i < 10; i++) {
        expect(chosen(router.route(req({ version: 'v2' })))).toBe('v2a');
        expect(chosen(router.route(req({ version: 'v1' })))).toBe('v1a');
      }
    });

    it('falls back to another advertised version when an unpinned request’s version has no ready replica', () => {
      const reps = [fakeReplica('v1a', 'm', 'v1', 'draining.stepping'), fakeReplica('v2a', 'm', 'v2')];
      const router = routerFor(reps, { models: [{ name: 'm', versions: ['v1', 'v2'], aliases: { stable: 'v1' } }] });
      const a = router.route(req());
      expect(chosen(a)).toBe('v2a');
      expect(a.trace).toMatchObject({ version: 'v2', fallbackFrom: 'v1', resolvedBy: 'default' });
    });

    it('never falls back from a version the client named exactly', () => {
      const reps = [fakeReplica('v1a', 'm', 'v1', 'loading'), fakeReplica('v2a', 'm', 'v2')];
      const a = routerFor(reps, { etaMs: () => 300 }).route(req({ version: 'v1' }));
      expect(a.ok && a.replica === null && a.version === 'v1').toBe(true);
    });
  });

  describe('decision traces', () => {
    it('records the candidates with their predicted waits and KV headroom, the choice and the budget', () => {
      const a = fakeReplica('a', 'm', 'v1');
      a.load(4000);
      const b = fakeReplica('b', 'm', 'v1');
      const adm = routerFor([a, b]).route(req());
      expect(adm.trace).toMatchObject({
        kind: 'admit',
        model: 'm',
        version: 'v1',
        budgetMs: 1000,
        chosen: 'b',
        outcome: 'routed',
        policy: 'cost',
      });
      expect(adm.trace.candidates.map((c) => c.replica)).toEqual(['a', 'b']);
      for (const c of adm.trace.candidates) {
        expect(c.waitMs).toBeGreaterThanOrEqual(0);
        expect(c.ttftMs).toBeGreaterThan(c.waitMs);
        expect(c.needBlocks).toBe(Math.ceil(600 / 16));
        expect(typeof c.headroom).toBe('boolean');
      }
      expect(adm.trace.reason).toMatch(/^cost: b predicted wait/);
    });
  });
});
