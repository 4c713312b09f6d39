// Fair sharing between tenants in front of the control plane: each tenant's own limits (models, priority classes,
// concurrency, token rate), then start-time fair queuing over tokens of work (prompt + max tokens, over the tenant's
// weight) per model and class, so that a tenant flooding the node cannot starve a quiet one. Requests go on to the
// control plane while it has no backlog of its own for the model; a tenant whose backlog here could not be served
// within its queue budget at its fair share is refused at once with `overloaded` and `retryAfterMs`.
import type { Clock, TimerId } from '../runtime/clock.ts';
import { failure, type Failure } from '../machines/outcomes.ts';
import type { ClientRequest } from '../transport/client-protocol.ts';
import type { Accepted, Delivery, Serving, StreamSink } from './serving.ts';
import { createFairQueue, type FairQueue, type Tagged } from './fair-queue.ts';
import type { Tenant, Tenants } from './tenants.ts';

/** Options of the tenant gate. */
export interface TenantGateOptions {
  clock: Clock;
  tenants: Tenants;
  /** Requests of one tenant handed to the control plane and not yet started, per ready replica of the model, before
   * more of its requests wait here. Default 2. */
  perReplicaWindow?: number;
  /** Most requests one tenant may have waiting here in one model's class. Default 64. */
  maxPendingPerTenant?: number;
  /** How often waiting requests are looked at while any wait (ms). Default 5. */
  pumpMs?: number;
  /** Told of every refusal made here (metrics). */
  refused?(code: string): void;
  /** Test-only mutations that break a promise on purpose, to show the property tests catch them. */
  mutations?: TenantGateMutations;
}

/** Test-only mutations of the tenant gate (test/api/tenant-fairness.test.ts shows each is caught). */
export interface TenantGateMutations {
  /** The class queues serve in arrival order across tenants. */
  fifo?: boolean;
  /** One window per model shared by all tenants (a flood's requests waiting at the replicas hold the others back). */
  sharedWindow?: boolean;
  /** No cap on a tenant's share of the slots and the cache beside other tenants. */
  noCap?: boolean;
}

/** A Serving that applies tenants' limits and fair queuing, and what it holds. */
export interface TenantGate extends Serving {
  /** Requests waiting here, not yet handed to the control plane. */
  pending(): number;
  /** Per tenant: requests in flight (here or in the control plane) and waiting here. */
  stats(): Record<string, { inflight: number; pending: number }>;
}

/** A tenant's live state; it is also its flow in the fair queues. */
interface TenantState {
  readonly tenant: Tenant;
  readonly weight: number;
  inflight: number;
  bucket: number;
  bucketAt: number;
}

/** A request of a tenant, from the gate until its end. */
interface Entry {
  req: ClientRequest;
  /** How the edge handed it over (its tenant, how its tokens are delivered); the gate adds the id. */
  delivery: Delivery;
  sink: StreamSink;
  id: string;
  /** Tokens of work it is charged: its prompt as admission counts it, plus the most it may generate. */
  cost: number;
  state: TenantState;
  queue: FairQueue<Entry>;
  enqueuedAt: number;
  budgetMs: number;
  timer: TimerId | null;
  tag: Tagged<Entry> | null;
  inner: Accepted | null;
  /** Handed to the control plane and not yet started (no token, no end): counts toward the model's window. */
  outstanding: boolean;
  ended: boolean;
}

const RATE_TAU_MS = 1_000;

/** The class queues and the release of their requests to the control plane, fairly and while it has room. */
interface Dispatch {
  queueFor(model: string, priority: string, rank: number): FairQueue<Entry>;
  queues(): FairQueue<Entry>[];
  /** True when the tenant may hand one more request of `model` to the control plane now (its window). */
  room(model: string, s: TenantState): boolean;
  /** True when the tenant may have one more request of `cost` in the control plane for `model` (its share). */
  underCap(s: TenantState, model: string, cost: number): boolean;
  /** The tenant asked for `model` now: it counts as active there for a while. */
  seen(s: TenantState, model: string): void;
  /** Tokens of work per ms the model's requests were released at lately. */
  rateOf(model: string): number;
  /** Hands an entry to the control plane now; answers its refusal. */
  release(e: Entry): Failure | null;
  /** An entry was queued: look at the queues soon. */
  enqueued(): void;
  withdraw(e: Entry, f: Failure & { outcome: 'cancelled' | 'expired' }): void;
  waiting(): number;
}

/** Creates the dispatch of a tenant gate. */
function createDispatch(
  inner: Serving,
  clock: Clock,
  window: number,
  pumpMs: number,
  mutations: TenantGateMutations,
): Dispatch {
  const queues = new Map<string, { model: string; rank: number; q: FairQueue<Entry> }>();
  const outstanding = new Map<string, number>();
  const rates = new Map<string, { perMs: number; at: number }>();
  let waiting = 0;
  let pumpAt: TimerId | null = null;
  const usage = createUsage(inner, clock, mutations.noCap === true);

  // Room for a tenant while it has fewer than `window` requests per ready replica of the model handed over and not
  // yet started (waiting in the replicas' queues). Counted per tenant, so that a flooding tenant's requests waiting
  // there never hold a quiet tenant's next request back here: it joins the replicas' queues at once and starts at
  // the next step (the flood's share of the slots and the cache is capped, see underCap, so there is room for it).
  const key = (model: string, s: TenantState): string =>
    mutations.sharedWindow ? model : `${model}\u0000${s.tenant.name}`;
  const room = (model: string, s: TenantState): boolean => {
    let ready = 0;
    for (const r of inner.cp.placement.replicas.values()) if (r.model === model && r.ready()) ready++;
    return (outstanding.get(key(model, s)) ?? 0) < window * Math.max(1, ready);
  };
  const rateOf = (model: string): number => {
    const r = rates.get(model);
    return r ? r.perMs * Math.exp(-(clock.now() - r.at) / RATE_TAU_MS) : 0;
  };
  const bump = (model: string, s: TenantState, d: number): void => {
    const k = key(model, s);
    const n = Math.max(0, (outstanding.get(k) ?? 0) + d);
    if (n === 0) outstanding.delete(k);
    else outstanding.set(k, n);
  };
  /** Hands an entry to the control plane; answers its refusal (the caller tells the client). */
  const release = (e: Entry): Failure | null => {
    if (e.timer !== null) clock.clearTimeout(e.timer);
    e.timer = null;
    const waited = clock.now() - e.enqueuedAt;
    e.outstanding = true;
    bump(e.req.model, e.state, 1);
    usage.add(e.state, e.req.model, e.cost);
    rates.set(e.req.model, { perMs: rateOf(e.req.model) + e.cost / RATE_TAU_MS, at: clock.now() });
    const settle = (): void => {
      if (e.outstanding) bump(e.req.model, e.state, -1);
      e.outstanding = false;
    };
    const end = (): void => {
      if (e.ended) return;
      e.ended = true;
      settle();
      e.state.inflight--;
      usage.add(e.state, e.req.model, -e.cost);
      schedule(0);
    };
    // The time waited here counts against the request's queue budget: what is left goes on as its deadline.
    const deadline = waited > 0 ? { deadlineMs: Math.max(0, e.budgetMs - waited) } : {};
    const r = inner.submit(
      { ...e.req, ...deadline },
      {
        tokens: (seq, n, text, lp) => {
          if (e.outstanding) {
            settle();
            schedule(0);
          }
          e.sink.tokens(seq, n, text, lp);
        },
        done: (d) => {
          end();
          e.sink.done(d);
        },
        failed: (f) => {
          end();
          e.sink.failed(f);
        },
      },
      Object.assign({}, e.delivery, { id: e.id }),
    );
    if (!r.ok) {
      end();
      return r.failure;
    }
    e.inner = r;
    return null;
  };

  /** Releases waiting requests, highest class first and fairly within each, while their tenant has room. */
  const pump = (): void => {
    pumpAt = null;
    const ordered = [...queues.values()].sort((a, b) => a.rank - b.rank);
    const eligible = (model: string, h: Tagged<Entry>): boolean =>
      room(model, h.item.state) && usage.underCap(h.item.state, model, h.cost);
    for (const { model, q } of ordered) {
      while (q.size() > 0) {
        const t = q.pop((h) => eligible(model, h));
        if (!t) break;
        waiting--;
        const refused = release(t.item);
        if (refused) t.item.sink.failed({ ...refused, outcome: 'rejected' });
      }
    }
    if (waiting > 0) schedule(pumpMs);
  };
  const schedule = (ms: number): void => {
    if (pumpAt !== null && ms > 0) return;
    if (pumpAt !== null) clock.clearTimeout(pumpAt);
    pumpAt = clock.setTimeout(pump, ms);
  };

  /** Takes an entry out of its queue (cancelled or expired) and ends it with `f`. */
  const withdraw = (e: Entry, f: Failure & { outcome: 'cancelled' | 'expired' }): void => {
    if (!e.tag || !e.queue.remove(e.tag)) return;
    waiting--;
    if (e.timer !== null) clock.clearTimeout(e.timer);
    e.timer = null;
    e.ended = true;
    e.state.inflight--;
    e.sink.failed(f);
  };

  return {
    queueFor: (model, priority, rank) => {
      const key = `${model}\u0000${priority}`;
      let cq = queues.get(key);
      if (!cq) {
        cq = { model, rank, q: createFairQueue<Entry>({ fifo: mutations.fifo === true }) };
        queues.set(key, cq);
      }
      return cq.q;
    },
    queues: () => [...queues.values()].map((c) => c.q),
    room,
    underCap: usage.underCap,
    seen: usage.seen,
    rateOf,
    release,
    enqueued: () => {
      waiting++;
      schedule(0);
    },
    withdraw,
    waiting: () => waiting,
  };
}

/** Wraps `inner` with tenants' limits and fair queuing; a request without a tenant passes straight through. */
export function createTenantGate(inner: Serving, opts: TenantGateOptions): TenantGate {
  const { clock } = opts;
  const maxPending = opts.maxPendingPerTenant ?? 64;
  const byName = new Map(opts.tenants.list().map((t) => [t.name, t]));
  const states = new Map<string, TenantState>();
  const d = createDispatch(inner, clock, opts.perReplicaWindow ?? 2, opts.pumpMs ?? 5, opts.mutations ?? {});
  const stateOf = (t: Tenant): TenantState => {
    let s = states.get(t.name);
    if (!s) {
      const full = t.burstTokens ?? t.tokensPerSecond ?? 0;
      s = { tenant: t, weight: t.weight, inflight: 0, bucket: full, bucketAt: clock.now() };
      states.set(t.name, s);
    }
    return s;
  };
  const refuse = (f: Failure): { ok: false; failure: Failure } => {
    opts.refused?.(f.code);
    return { ok: false, failure: f };
  };

  const submit: Serving['submit'] = (req, sink, delivery = { text: true }) => {
    const tenant = delivery.tenant === undefined ? undefined : byName.get(delivery.tenant);
    if (!tenant) return inner.submit(req, sink, delivery);
    const s = stateOf(tenant);
    const m = inner.cp.scenario.models.find((x) => x.name === req.model);
    const checked = checkTenant(tenant, req, m);
    if ('code' in checked) return refuse(checked);
    const { priority, rank, budgetMs } = checked;
    // Charged by the prompt as admission counts it (a real engine's tokenizer), never by the client's own figure.
    const counted = inner.count(req);
    if (counted.refused) return refuse(counted.refused);
    const work = counted.promptTokens + req.maxTokens;
    if (tenant.maxConcurrent !== null && s.inflight >= tenant.maxConcurrent)
      return refuse(
        failure('overloaded', `tenant ${tenant.name} has ${s.inflight} requests in flight, its limit`, {
          retryAfterMs: 1000,
        }),
      );
    const q = d.queueFor(req.model, priority, rank);
    const e: Entry = {
      req: Object.assign({}, req, { priority }),
      delivery: Object.assign({}, delivery, { counted }),
      sink,
      id: '',
      cost: work,
      state: s,
      queue: q,
      enqueuedAt: clock.now(),
      budgetMs,
      timer: null,
      tag: null,
      inner: null,
      outstanding: false,
      ended: false,
    };
    d.seen(s, req.model);
    // Straight through when the tenant has nothing waiting here and room of its own: the pump would release it at
    // once too (room and caps are per tenant, so it takes nothing from the others), a tick later.
    const direct = q.size(s) === 0 && d.room(req.model, s) && d.underCap(s, req.model, work);
    const late = direct ? null : backlogRefusal(q, s, work, d.rateOf(req.model), budgetMs, maxPending, req.model);
    if (late) return refuse(late);
    const bucketWait = takeTokens(s, work, clock.now());
    if (bucketWait > 0)
      return refuse(
        failure('overloaded', `tenant ${tenant.name} is over its rate of ${tenant.tokensPerSecond} tokens/s`, {
          retryAfterMs: Math.max(1, Math.ceil(bucketWait)),
        }),
      );
    if (direct) {
      // Tagged all the same, so that fairness holds afterwards.
      q.push(e, s, work, false);
      s.inflight++;
      e.id = inner.cp.runtime.ids.next('req');
      const refused = d.release(e);
      if (refused) return { ok: false, failure: refused };
      return e.inner!;
    }
    e.id = inner.cp.runtime.ids.next('req');
    e.tag = q.push(e, s, work);
    s.inflight++;
    e.timer = clock.setTimeout(() => {
      e.timer = null;
      d.withdraw(e, {
        ...failure('expired', `waited its queue budget of ${Math.round(budgetMs)} ms behind other tenants`),
        outcome: 'expired',
      });
    }, budgetMs);
    d.enqueued();
    const version = req.version ?? m?.versions[0] ?? '';
    return {
      ok: true,
      request: e.id,
      model: req.model,
      version,
      promptTokens: counted.promptTokens,
      cancel: () => {
        if (e.inner) e.inner.cancel();
        else d.withdraw(e, { ...failure('cancelled', 'cancelled by the client'), outcome: 'cancelled' });
      },
    };
  };

  return {
    ...inner,
    submit,
    pending: () => d.waiting(),
    stats: () => {
      const out: Record<string, { inflight: number; pending: number }> = {};
      for (const [name, s] of states) {
        let p = 0;
        for (const q of d.queues()) p += q.size(s);
        out[name] = { inflight: s.inflight, pending: p };
      }
      return out;
    },
  };
}

/** A refusal when the tenant's backlog here, at its share of what the model serves, would outlast the budget. */
function backlogRefusal(
  q: FairQueue<Entry>,
  s: TenantState,
  work: number,
  rate: number,
  budgetMs: number,
  maxPending: number,
  model: string,
): Failure | null {
  const mine = q.size(s);
  const share = s.weight / q.activeWeight(s);
  const waitMs = rate > 0 ? (q.costOf(s) + work) / (rate * share) : 0;
  if (mine < maxPending && !(mine > 0 && waitMs > budgetMs)) return null;
  return failure(
    'overloaded',
    `tenant ${s.tenant.name} has ${mine} requests waiting for ${model}; at its share they would wait ${Math.round(waitMs)} ms, over the budget of ${Math.round(budgetMs)} ms`,
    { retryAfterMs: Math.max(1, Math.ceil(rate > 0 && waitMs > budgetMs ? waitMs - budgetMs : 1000)) },
  );
}

/** How long a tenant counts as active on a model after its last request (ms). */
const ACTIVE_MS = 10_000;

/** What each tenant has in the control plane per model, and its share of the model's slots and KV tokens. */
function createUsage(
  inner: Serving,
  clock: Clock,
  noCap: boolean,
): {
  add(s: TenantState, model: string, tokens: number): void;
  seen(s: TenantState, model: string): void;
  underCap(s: TenantState, model: string, cost: number): boolean;
} {
  const byModel = new Map<string, Map<TenantState, { count: number; tokens: number; seen: number }>>();
  const of = (s: TenantState, model: string): { count: number; tokens: number; seen: number } => {
    let m = byModel.get(model);
    if (!m) byModel.set(model, (m = new Map()));
    let u = m.get(s);
    if (!u) m.set(s, (u = { count: 0, tokens: 0, seen: -Infinity }));
    return u;
  };
  return {
    add: (s, model, tokens) => {
      const u = of(s, model);
      u.count += Math.sign(tokens);
      u.tokens += tokens;
    },
    seen: (s, model) => void (of(s, model).seen = clock.now()),
    underCap: (s, model, cost) => {
      const now = clock.now();
      let weight = 0;
      for (const [t, u] of byModel.get(model) ?? []) {
        if (u.count > 0 || now - u.seen < ACTIVE_MS || t === s) weight += t.weight;
      }
      // Alone on the model it may use all of it; beside others, its weighted share of the slots and the KV cache,
      // so that another tenant's next request finds room at once instead of waiting behind this one's work.
      if (weight <= s.weight || noCap) return true;
      let slots = 0;
      let kvTokens = 0;
      for (const r of inner.cp.placement.replicas.values()) {
        if (r.model !== model || !r.ready()) continue;
        slots += r.work.limits.maxRunning;
        kvTokens += r.work.limits.blocksTotal * r.work.limits.blockTokens;
      }
      if (slots === 0) return true;
      const share = s.weight / weight;
      const u = of(s, model);
      return (
        u.count + 1 <= Math.max(1, Math.floor(slots * share)) && u.tokens + cost <= Math.max(cost, kvTokens * share)
      );
    },
  };
}

/** Takes `work` from the tenant's token bucket; answers 0, or the ms until the bucket could pay for it. */
function takeTokens(s: TenantState, work: number, now: number): number {
  const rate = s.tenant.tokensPerSecond;
  if (rate === null) return 0;
  const full = s.tenant.burstTokens ?? rate;
  s.bucket = Math.min(full, s.bucket + ((now - s.bucketAt) * rate) / 1000);
  s.bucketAt = now;
  // A request larger than the whole bucket is paid for once the bucket is full.
  const need = Math.min(work, full);
  if (s.bucket >= need) {
    s.bucket -= work;
    return 0;
  }
  return ((need - s.bucket) * 1000) / rate;
}

/** The tenant's right to this model and class: the class it gets, its rank and queue budget, or a refusal. */
function checkTenant(
  t: Tenant,
  req: ClientRequest,
  m: { name: string; classes: readonly { name: string; maxQueueMs: number }[] } | undefined,
): { priority: string; rank: number; budgetMs: number } | Failure {
  if (t.models !== null && !t.models.includes(req.model))
    return failure(
      'invalid_request',
      `tenant ${t.name} may not use model "${req.model}" (it may use ${t.models.join(', ')})`,
    );
  if (!m) return failure('model_not_found', `no model "${req.model}"`);
  // The client picks a class only among the tenant's own; without one it gets the tenant's first.
  const priority = req.priority ?? t.priorities?.[0] ?? m.classes[0]?.name ?? 'interactive';
  if (t.priorities !== null && !t.priorities.includes(priority))
    return failure(
      'invalid_request',
      `tenant ${t.name} may not use priority class "${priority}" (it may use ${t.priorities.join(', ')})`,
    );
  const rank = m.classes.findIndex((c) => c.name === priority);
  if (rank < 0)
    return failure(
      'invalid_request',
      `unknown priority class "${priority}"; known: ${m.classes.map((c) => c.name).join(', ')}`,
    );
  const budgetMs = Math.max(0, Math.min(m.classes[rank]!.maxQueueMs, req.deadlineMs ?? Infinity));
  return { priority, rank, budgetMs };
}
