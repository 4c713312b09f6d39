// Tenants: the tokens file, token to tenant, start-time fair queuing over tokens, and the tenant gate's limits and
// fairness in front of a fake control plane on a virtual clock.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createFairQueue, type Flow } from '../../api/fair-queue.ts';
import { createTenantGate } from '../../api/tenant-gate.ts';
import { createTenants, parseTenantsFile, DEFAULT_TENANT, type Tenant } from '../../api/tenants.ts';
import type { Delivery, Serving, StreamSink } from '../../api/serving.ts';
import type { ClientRequest } from '../../transport/client-protocol.ts';
import { tenantEntry } from './tenant-entry.ts';
import { createVirtualClock } from '../../runtime/clock.ts';
import { estimateTokens } from '../../api/pseudo-text.ts';

const hash = (t: string): string => createHash('sha256').update(t).digest('hex');
const A = 'tenant-a-token-0123456789';
const B = 'tenant-b-token-0123456789';

describe('tenants file', () => {
  it('maps each token to its tenant, with plain client tokens as the default tenant', () => {
    const p = parseTenantsFile(
      `tenants:\n  - { name: a, tokenSha256: [${hash(A)}], priorities: [batch], maxConcurrent: 4 }\n` +
        `  - { name: b, tokenSha256: [${hash(B)}], weight: 2 }\n`,
    );
    expect(p.ok).toBe(true);
    if (!p.ok) return;
    const t = createTenants(p.tenants, ['plain-token-0123456789']);
    expect(t.of(A)?.name).toBe('a');
    expect(t.of(A)?.priorities).toEqual(['batch']);
    expect(t.of(B)?.weight).toBe(2);
    expect(t.of('plain-token-0123456789')?.name).toBe(DEFAULT_TENANT);
    expect(t.of('nobody')).toBeNull();
    expect(t.has(null)).toBe(false);
    expect(t.has(B)).toBe(true);
  });

  it('refuses a bad file naming the field', () => {
    const dup = parseTenantsFile(
      `tenants:\n  - { name: a, tokenSha256: [${hash(A)}] }\n  - { name: a, tokenSha256: [${hash(B)}] }\n`,
    );
    expect(dup).toMatchObject({ ok: false, message: expect.stringContaining('tenants[1].name') });
    const short = parseTenantsFile('tenants:\n  - { name: a, tokenSha256: [abc] }\n');
    expect(short).toMatchObject({ ok: false, message: expect.stringContaining('tenants[0].tokenSha256[0]') });
    const extra = parseTenantsFile(`tenants:\n  - { name: a, tokenSha256: [${hash(A)}], token: ${A} }\n`);
    expect(extra).toMatchObject({ ok: false, message: expect.stringContaining('token') });
    expect(parseTenantsFile('{')).toMatchObject({ ok: false });
  });
});

describe('fair queue', () => {
  it("serves a quiet flow's request before a flood's backlog", () => {
    const q = createFairQueue<string>();
    const flood: Flow = { weight: 1 };
    const quiet: Flow = { weight: 1 };
    for (let i = 0; i < 100; i++) q.push(`a${i}`, flood, 100);
    q.pop();
    q.pop();
    q.push('b0', quiet, 100);
    expect(q.pop()?.item).toBe('b0');
  });

  it('shares tokens of work by weight, not requests', () => {
    const q = createFairQueue<string>();
    const big: Flow = { weight: 1 };
    const small: Flow = { weight: 3 };
    for (let i = 0; i < 400; i++) {
      q.push('big', big, 400);
      q.push('small', small, 100);
    }
    const served = { big: 0, small: 0 };
    for (let i = 0; i < 200; i++) {
      const t = q.pop()!;
      served[t.item as 'big' | 'small'] += t.cost;
    }
    // Weight 3 against 1: three quarters of the tokens served, whatever the request sizes.
    const share = served.small / (served.small + served.big);
    expect(share).toBeGreaterThan(0.7);
    expect(share).toBeLessThan(0.8);
  });
});

/** A fake control plane: one model with one accepting replica; it records what reaches it. */
/** A request that reached the fake; it waits in the fake replica's queue until its first token or its end. */
interface Got {
  req: ClientRequest;
  delivery: Delivery;
  sink: StreamSink;
  started: boolean;
}

function fakeInner(): { inner: Serving; got: Got[]; refuse: { on: boolean } } {
  const got: Got[] = [];
  let n = 0;
  const refuse = { on: false };
  const cp = {
    scenario: {
      models: [
        {
          name: 'm',
          versions: ['1'],
          classes: [
            { name: 'interactive', maxQueueMs: 1_000 },
            { name: 'batch', maxQueueMs: 10_000 },
          ],
        },
      ],
    },
    placement: {
      replicas: new Map([
        [
          'r0',
          {
            model: 'm',
            ready: () => true,
            stateless: null,
            work: {
              limits: { maxRunning: 4, blocksTotal: 1_000, blockTokens: 16 },
              stats: () => ({ waiting: got.filter((g) => !g.started).length }),
            },
          },
        ],
      ]),
    },
    runtime: { ids: { next: (p: string) => `${p}.${n++}` } },
  };
  const inner = {
    cp,
    readiness: () => ({}),
    models: () => [],
    backend: () => 'simulated',
    // The count admission uses, as the real facade makes it for a cost-model model.
    count: (req: ClientRequest) => ({
      promptTokens: req.promptTokens ?? estimateTokens(req.prompt ?? ''),
      engine: null,
    }),
    submit: (req: ClientRequest, sink: StreamSink, delivery: Delivery = { text: true }) => {
      if (refuse.on) return { ok: false, failure: { code: 'overloaded', message: 'full', retryable: true } };
      const g: Got = { req, delivery, sink, started: false };
      g.sink = {
        tokens: (seq, n, text) => {
          g.started = true;
          sink.tokens(seq, n, text);
        },
        done: (d) => {
          g.started = true;
          sink.done(d);
        },
        failed: (f) => {
          g.started = true;
          sink.failed(f);
        },
      };
      got.push(g);
      return {
        ok: true,
        request: delivery.id ?? 'x',
        model: req.model,
        version: '1',
        promptTokens: 1,
        cancel: () => {},
      };
    },
  } as unknown as Serving;
  return { inner, got, refuse };
}

const tenant = (name: string, extra: Partial<Tenant> = {}): Tenant & { hashes: string[] } =>
  tenantEntry(name, [hash(`${name}-token-0123456789`)], extra);

/** A sink that records how the request ended. */
function sink(): StreamSink & { ends: string[] } {
  const ends: string[] = [];
  return {
    ends,
    tokens: () => {},
    done: () => ends.push('done'),
    failed: (f) => ends.push(`${f.outcome}:${f.code}`),
  };
}

const done = (s: StreamSink): void =>
  s.done({
    finishReason: 'length',
    usage: { promptTokens: 1, completionTokens: 1 },
    timings: { queueMs: 0, ttftMs: 0, e2eMs: 0 },
  });

describe('tenant gate', () => {
  it('gives a tenant its first class by default and refuses a class or model that is not its own', () => {
    const clock = createVirtualClock();
    const { inner, got } = fakeInner();
    const tenants = createTenants([tenant('a', { priorities: ['batch'], models: ['m'] })]);
    const gate = createTenantGate(inner, { clock, tenants });
    const r = gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false, tenant: 'a' });
    expect(r.ok).toBe(true);
    expect(got[0]!.req.priority).toBe('batch');
    const up = gate.submit({ model: 'm', priority: 'interactive', maxTokens: 4 }, sink(), { text: false, tenant: 'a' });
    expect(up).toMatchObject({ ok: false, failure: { code: 'invalid_request' } });
    const other = gate.submit({ model: 'x', maxTokens: 4 }, sink(), { text: false, tenant: 'a' });
    expect(other).toMatchObject({ ok: false, failure: { code: 'invalid_request' } });
  });

  it('refuses past the concurrency limit and the token rate, with retryAfterMs', () => {
    const clock = createVirtualClock();
    const { inner, got } = fakeInner();
    const tenants = createTenants([
      tenant('c', { maxConcurrent: 1 }),
      tenant('r', { tokensPerSecond: 100, burstTokens: 100 }),
    ]);
    const gate = createTenantGate(inner, { clock, tenants });
    expect(gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false, tenant: 'c' }).ok).toBe(true);
    const over = gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false, tenant: 'c' });
    expect(over).toMatchObject({ ok: false, failure: { code: 'overloaded', retryAfterMs: expect.any(Number) } });
    done(got[0]!.sink);
    expect(gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false, tenant: 'c' }).ok).toBe(true);
    // 100 tokens of burst at 100 tokens/s: 60 pass, the next 60 wait for 20 more tokens (200 ms).
    expect(gate.submit({ model: 'm', promptTokens: 30, maxTokens: 30 }, sink(), { text: false, tenant: 'r' }).ok).toBe(
      true,
    );
    const fast = gate.submit({ model: 'm', promptTokens: 30, maxTokens: 30 }, sink(), { text: false, tenant: 'r' });
    expect(fast).toMatchObject({ ok: false, failure: { code: 'overloaded', retryAfterMs: 200 } });
  });

  it("serves a quiet tenant's request next while a flooding tenant's backlog waits, and refuses the flood's excess", () => {
    const clock = createVirtualClock();
    const { inner, got } = fakeInner();
    const gate = createTenantGate(inner, { clock, tenants: createTenants([tenant('a'), tenant('b')]) });
    const aSinks: ReturnType<typeof sink>[] = [];
    const refusals: number[] = [];
    // One replica, a window of two: two of A's requests reach the control plane, the rest wait here.
    for (let i = 0; i < 40; i++) {
      const s = sink();
      const r = gate.submit({ model: 'm', promptTokens: 50, maxTokens: 50 }, s, { text: false, tenant: 'a' });
      if (r.ok) aSinks.push(s);
      else refusals.push(r.failure.retryAfterMs ?? -1);
    }
    expect(got).toHaveLength(2);
    const bSink = sink();
    expect(gate.submit({ model: 'm', promptTokens: 50, maxTokens: 50 }, bSink, { text: false, tenant: 'b' }).ok).toBe(
      true,
    );
    // One of A's requests starts (its first token): the next to go is B's, not A's backlog.
    got[0]!.sink.tokens(0, 1, undefined);
    clock.run(clock.now() + 1);
    expect(got[2]!.delivery.tenant).toBe('b');
    // Served at about 100 tokens per ms of release, A's backlog grows past its budget: the excess is refused.
    for (let k = 0; k < 30; k++) {
      got[got.length - 1]!.sink.tokens(0, 1, undefined);
      got[got.length - 2]!.sink.tokens(0, 1, undefined);
      clock.run(clock.now() + 20);
    }
    for (let i = 0; i < 400; i++) {
      const r = gate.submit({ model: 'm', promptTokens: 50, maxTokens: 50 }, sink(), { text: false, tenant: 'a' });
      if (!r.ok) refusals.push(r.failure.retryAfterMs ?? -1);
    }
    expect(refusals.length).toBeGreaterThan(0);
    expect(refusals.every((ms) => ms >= 1)).toBe(true);
    expect(gate.stats()['b']).toMatchObject({ pending: 0 });
  });

  it('ends a waiting request once: cancelled by the client, or expired at its budget', () => {
    const clock = createVirtualClock();
    const { inner } = fakeInner();
    const gate = createTenantGate(inner, { clock, tenants: createTenants([tenant('a')]) });
    for (let i = 0; i < 2; i++) gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false, tenant: 'a' });
    const s1 = sink();
    const r1 = gate.submit({ model: 'm', maxTokens: 4 }, s1, { text: false, tenant: 'a' });
    const s2 = sink();
    gate.submit({ model: 'm', maxTokens: 4 }, s2, { text: false, tenant: 'a' });
    expect(gate.pending()).toBe(2);
    if (r1.ok) r1.cancel();
    if (r1.ok) r1.cancel();
    expect(s1.ends).toEqual(['cancelled:cancelled']);
    clock.run(5_000);
    expect(s2.ends).toEqual(['expired:expired']);
    expect(gate.pending()).toBe(0);
  });

  it('tells a waiting request of a refusal by the control plane once, as rejected', () => {
    const clock = createVirtualClock();
    const { inner, got, refuse } = fakeInner();
    const gate = createTenantGate(inner, { clock, tenants: createTenants([tenant('a')]) });
    for (let i = 0; i < 2; i++) gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false, tenant: 'a' });
    const s = sink();
    expect(gate.submit({ model: 'm', maxTokens: 4 }, s, { text: false, tenant: 'a' }).ok).toBe(true);
    refuse.on = true;
    done(got[0]!.sink);
    clock.run(clock.now() + 10);
    expect(s.ends).toEqual(['rejected:overloaded']);
  });

  it('passes requests without a tenant straight through', () => {
    const clock = createVirtualClock();
    const { inner, got } = fakeInner();
    const gate = createTenantGate(inner, { clock, tenants: createTenants([tenant('a')]) });
    for (let i = 0; i < 5; i++) gate.submit({ model: 'm', maxTokens: 4 }, sink(), { text: false });
    expect(got).toHaveLength(5);
  });
});
