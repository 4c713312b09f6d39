// Fairness between tenants as properties (fast-check), each with a mutation it catches. The simulator (actors/sim)
// cannot reach the tenant gate (it lives in api/, above the actors), so the gate runs here in front of a fake control
// plane on a virtual clock: a pool of slots that starts waiting requests at each step and ends them some steps later.
//  - The fair queue alone: start-time fair queuing's bound. Over any stretch in which two flows both have requests
//    queued, the tokens served to each, divided by its weight, differ by at most the sum of their largest requests
//    divided by their weights (Goyal et al.). Caught: serving in arrival order (fifo).
//  - The gate: a quiet tenant (at most two requests in flight) beside a tenant flooding at random is never refused,
//    is handed to the control plane the moment it arrives, and starts at the next step; the flooding tenant never
//    holds more than its weighted share of the slots while the other is active, and every refusal it gets carries
//    retryAfterMs. Caught: one window shared by all tenants (sharedWindow), no cap on a share (noCap).
// Not covered here: the real batcher and router behind the gate (the fake starts every waiting request that has a
// slot), token-rate limits, priority classes, and more than two tenants in the gate property.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createFairQueue, type FairQueueMutations, type Flow } from '../../api/fair-queue.ts';
import { createTenantGate, type TenantGateMutations } from '../../api/tenant-gate.ts';
import { createTenants, type Tenant } from '../../api/tenants.ts';
import type { Delivery, Serving, StreamSink } from '../../api/serving.ts';
import type { ClientRequest } from '../../transport/client-protocol.ts';
import { tenantEntry } from './tenant-entry.ts';
import { createVirtualClock, type VirtualClock } from '../../runtime/clock.ts';
import { estimateTokens } from '../../api/pseudo-text.ts';

type QueueOp = { push: number; costs: number[] } | { pop: number };

const queueOps = (flows: number): fc.Arbitrary<QueueOp[]> =>
  fc.array(
    fc.oneof(
      fc.record({
        push: fc.integer({ min: 0, max: flows - 1 }),
        costs: fc.array(fc.integer({ min: 1, max: 500 }), { minLength: 1, maxLength: 30 }),
      }),
      fc.record({ pop: fc.integer({ min: 1, max: 40 }) }),
    ),
    { maxLength: 40 },
  );

/** The largest breach of the SFQ bound over the run (0 when it holds). */
function sfqBreach(weights: number[], ops: QueueOp[], mutations: FairQueueMutations): number {
  const q = createFairQueue<number>(mutations);
  const flows: Flow[] = weights.map((weight) => ({ weight }));
  const served = weights.map(() => 0);
  const largest = weights.map(() => 0);
  // Per pair of flows: the normalized difference's range over the current stretch where both are backlogged.
  const runs = new Map<string, { lo: number; hi: number }>();
  let breach = 0;
  const diff = (i: number, j: number): number => served[i]! / weights[i]! - served[j]! / weights[j]!;
  for (const op of ops) {
    if ('push' in op) {
      for (const c of op.costs) q.push(op.push, flows[op.push]!, c);
      largest[op.push] = Math.max(largest[op.push]!, ...op.costs);
      continue;
    }
    for (let k = 0; k < op.pop && q.size() > 0; k++) {
      const backlogged = flows.map((f) => q.size(f) > 0);
      const t = q.pop()!;
      // A stretch where both are backlogged starts (from the difference before this pop) or goes on; else it ends.
      for (let i = 0; i < flows.length; i++) {
        for (let j = i + 1; j < flows.length; j++) {
          const key = `${i}:${j}`;
          if (!backlogged[i] || !backlogged[j]) runs.delete(key);
          else if (!runs.has(key)) runs.set(key, { lo: diff(i, j), hi: diff(i, j) });
        }
      }
      served[t.item] = served[t.item]! + t.cost;
      for (let i = 0; i < flows.length; i++) {
        for (let j = i + 1; j < flows.length; j++) {
          const run = runs.get(`${i}:${j}`);
          if (!run) continue;
          const d = diff(i, j);
          run.lo = Math.min(run.lo, d);
          run.hi = Math.max(run.hi, d);
          const bound = largest[i]! / weights[i]! + largest[j]! / weights[j]!;
          breach = Math.max(breach, run.hi - run.lo - bound);
        }
      }
    }
  }
  return breach;
}

const sfqProperty = (mutations: FairQueueMutations): fc.IPropertyWithHooks<[number[], QueueOp[]]> =>
  fc.property(
    fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 2, maxLength: 4 }),
    queueOps(4),
    (weights, ops) => sfqBreach(weights, ops.map(clampFlow(weights.length)), mutations) <= 1e-9,
  );

const clampFlow =
  (n: number) =>
  (op: QueueOp): QueueOp =>
    'push' in op ? { push: op.push % n, costs: op.costs } : op;

describe('fair queue (property)', () => {
  it('keeps any two backlogged flows within the start-time fair queuing bound', () => {
    fc.assert(sfqProperty({}), { seed: 15, numRuns: 400 });
  });

  it('catches the mutation that serves in arrival order', () => {
    expect(() => fc.assert(sfqProperty({ fifo: true }), { seed: 15, numRuns: 400 })).toThrow(/Property failed/);
  });
});

/** The fake control plane: `slots` slots in all; a step every `stepMs` starts waiting requests while slots are free. */
interface Fake {
  inner: Serving;
  /** Requests handed over: when, when they started (-1 until then), and how many of the tenant's were inside then. */
  got: { tenant: string; at: number; startedAt: number; inside: number }[];
}

const SLOTS = 8;
const STEP_MS = 10;

function fakeControlPlane(clock: VirtualClock): Fake {
  const got: Fake['got'] = [];
  const waiting: { sink: StreamSink; rec: Fake['got'][number]; steps: number }[] = [];
  const running: typeof waiting = [];
  let n = 0;
  const step = (): void => {
    for (const r of [...running]) {
      if (--r.steps > 0) continue;
      running.splice(running.indexOf(r), 1);
      r.sink.done({
        finishReason: 'length',
        usage: { promptTokens: 1, completionTokens: 1 },
        timings: { queueMs: 0, ttftMs: 0, e2eMs: 0 },
      });
    }
    while (running.length < SLOTS && waiting.length > 0) {
      const r = waiting.shift()!;
      r.rec.startedAt = clock.now();
      running.push(r);
      r.sink.tokens(0, 1, undefined);
    }
    clock.setTimeout(step, STEP_MS);
  };
  clock.setTimeout(step, STEP_MS);
  const replica = (id: string): [string, unknown] => [
    id,
    {
      model: 'm',
      ready: () => true,
      stateless: null,
      work: {
        limits: { maxRunning: SLOTS / 2, blocksTotal: 1_000, blockTokens: 16 },
        stats: () => ({ waiting: waiting.length / 2 }),
      },
    },
  ];
  const cp = {
    scenario: { models: [{ name: 'm', versions: ['1'], classes: [{ name: 'interactive', maxQueueMs: 1_000 }] }] },
    placement: { replicas: new Map([replica('r0'), replica('r1')]) },
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
      const tenant = delivery.tenant ?? '';
      const inside = [...waiting, ...running].filter((r) => r.rec.tenant === tenant).length + 1;
      const rec = { tenant, at: clock.now(), startedAt: -1, inside };
      got.push(rec);
      // A request runs for a number of steps set by its size: 2 to 6.
      waiting.push({ sink, rec, steps: 2 + ((req.promptTokens ?? 0) % 5) });
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
  return { inner, got };
}

const tenant = (name: string): Tenant & { hashes: string[] } => tenantEntry(name, [name.padEnd(64, '0')]);

type GateOp = { flood: number } | { quiet: true } | { wait: number };

const gateOps: fc.Arbitrary<GateOp[]> = fc.array(
  fc.oneof(
    fc.record({ flood: fc.integer({ min: 1, max: 40 }) }),
    fc.constant({ quiet: true as const }),
    fc.record({ wait: fc.integer({ min: 1, max: 40 }) }),
  ),
  { minLength: 1, maxLength: 60 },
);

/** What went wrong for the quiet tenant or the flood's cap in one run; empty when every promise held. */
function gateViolations(ops: GateOp[], mutations: TenantGateMutations): string[] {
  const clock = createVirtualClock();
  const fake = fakeControlPlane(clock);
  const gate = createTenantGate(fake.inner, {
    clock,
    tenants: createTenants([tenant('flood'), tenant('quiet')]),
    mutations,
  });
  const bad: string[] = [];
  let quietInFlight = 0;
  let size = 0;
  const quietSent: { at: number; index: number }[] = [];
  const submit = (name: string, onEnd: () => void): ReturnType<Serving['submit']> => {
    const ends: StreamSink = { tokens: () => {}, done: onEnd, failed: onEnd };
    return gate.submit({ model: 'm', promptTokens: 16 + (size++ % 97), maxTokens: 16 }, ends, {
      text: false,
      tenant: name,
    });
  };
  // The quiet tenant is active from the start (a tenant alone on a model may use all of it).
  for (const op of [{ quiet: true as const }, ...ops]) {
    if ('wait' in op) clock.run(clock.now() + op.wait);
    else if ('flood' in op) {
      for (let i = 0; i < op.flood; i++) {
        const r = submit('flood', () => {});
        if (!r.ok && !(r.failure.code === 'overloaded' && (r.failure.retryAfterMs ?? 0) >= 1))
          bad.push(`flood refused without retryAfterMs: ${r.failure.code}`);
      }
    } else if (quietInFlight < 2) {
      quietInFlight++;
      const before = fake.got.length;
      const r = submit('quiet', () => quietInFlight--);
      if (!r.ok) bad.push(`quiet refused: ${r.failure.message}`);
      else quietSent.push({ at: clock.now(), index: before });
    }
  }
  // The flood never held more than its share of the slots (half: two tenants of equal weight, both active).
  for (const g of fake.got)
    if (g.tenant === 'flood' && g.inside > SLOTS / 2) bad.push(`flood held ${g.inside} of ${SLOTS} slots`);
  clock.run(clock.now() + 200);
  for (const q of quietSent) {
    const rec = fake.got.slice(q.index).find((g) => g.tenant === 'quiet' && g.at >= q.at);
    if (!rec || rec.at > q.at) bad.push(`quiet sent at ${q.at} handed over at ${rec?.at ?? 'never'}`);
    else if (rec.startedAt < 0 || rec.startedAt > q.at + STEP_MS)
      bad.push(`quiet sent at ${q.at} started at ${rec.startedAt}`);
  }
  return bad;
}

const gateProperty = (mutations: TenantGateMutations): fc.IPropertyWithHooks<[GateOp[]]> =>
  fc.property(gateOps, (ops) => gateViolations(ops, mutations).length === 0);

describe('tenant gate (property)', () => {
  it('never refuses or holds back a quiet tenant beside a flood, and caps the flood at its share', () => {
    fc.assert(gateProperty({}), { seed: 15, numRuns: 300 });
  });

  // Each mutation fails the property, and for the reason it breaks: the counterexample's violations say so.
  const caught = (mutations: TenantGateMutations): string[] => {
    const r = fc.check(gateProperty(mutations), { seed: 15, numRuns: 300 });
    expect(r.failed).toBe(true);
    return gateViolations(r.counterexample![0], mutations);
  };

  it('catches one window shared by all tenants: the quiet request waits behind the flood', () => {
    expect(caught({ sharedWindow: true })).toContainEqual(expect.stringMatching(/^quiet sent at \d+ handed over at/));
  });

  it('catches no cap on a tenant share: the flood holds more than half the slots', () => {
    expect(caught({ noCap: true })).toContainEqual(expect.stringMatching(/^flood held \d+ of 8 slots/));
  });
});
