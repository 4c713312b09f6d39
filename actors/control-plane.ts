// The control plane: requests, router, placement and replicas of one node, wired on one runtime. The same code
// serves live traffic (wall clock, WebSocket link to the node agent) and runs simulations (virtual clock).
import { createActor, type ActorRefFrom } from 'xstate';
import { requestMachine, type RequestContext } from '../machines/request.machine.ts';
import { createSequence, type Sequence, type SequenceListener } from './batcher/sequence.ts';
import type { StepPlan } from './batcher/continuous.ts';
import type { StatelessBatcher, StatelessItem } from './batcher/stateless.ts';
import type { Scenario } from './config.ts';
import { createCollector, type Collector } from './metrics/collector.ts';
import { failure, type Failure, type OutcomeCode } from '../machines/outcomes.ts';
import { startPlacement, type Placement } from './placement/placement.ts';
import type { ReplicaHandle } from './replica.ts';
import { createRegistry } from './router/registry.ts';
import { createRouter, type DecisionTrace, type Router } from './router/router.ts';
import { createHealth, type Health } from './router/health.ts';
import { expiryTrace, MAX_TRACES } from './router/explain.ts';
import type { Runtime } from '../runtime/system.ts';
import { createDeadlineWheel } from '../runtime/deadlines.ts';

/** A request as a client submits it. */
export interface SubmitSpec {
  id?: string;
  model: string;
  version?: string;
  priority?: string;
  promptTokens: number;
  maxTokens: number;
  /** Tokens the (simulated) model will produce before stopping; at most maxTokens. */
  outputTokens?: number;
  deadlineMs?: number;
  /** A stateless model's batch compatibility beyond model, version and input length: dtype, adapter, options. */
  dtype?: string;
  adapter?: string | null;
  options?: Readonly<Record<string, string | number | boolean>>;
}

/** What a client hears about its request. */
export interface ClientListener {
  accepted?(id: string): void;
  /** `n` tokens; `seq` is the sequence number of the first of them (contiguous from 0). */
  tokens?(id: string, seq: number, n: number, t: number): void;
  terminal?(id: string, outcome: TerminalOutcome): void;
}

/** The one terminal outcome of a request. */
export interface TerminalOutcome {
  outcome: 'done' | 'cancelled' | 'expired' | 'rejected' | 'failed';
  code: string | null;
  message: string | null;
  tokens: number;
  retryAfterMs?: number;
  timings: { receivedAt: number; firstTokenAt: number; finishedAt: number };
}

/** A live request inside the control plane. */
interface Live {
  id: string;
  actor: ActorRefFrom<typeof requestMachine>;
  spec: SubmitSpec & { outputTokens: number; priority: string };
  model: string;
  version: string;
  rank: number;
  budgetMs: number;
  receivedAt: number;
  firstScheduledAt: number;
  awaitingToken: boolean;
  /** Tokens the client has been sent. */
  streamed: number;
  seq: Sequence | null;
  listener: ClientListener | undefined;
  traces: DecisionTrace[];
  retryAfterMs?: number;
}

/** The control plane of one node. */
export interface ControlPlane {
  readonly runtime: Runtime;
  readonly scenario: Scenario;
  readonly router: Router;
  readonly placement: Placement;
  readonly collector: Collector;
  submit(spec: SubmitSpec, listener?: ClientListener): { id: string; ok: boolean; failure?: Failure };
  cancel(id: string): boolean;
  /** Requests not yet terminal. */
  live(): number;
  /** The decision trace of a request (kept for finished ones when `keepTraces`). */
  explain(id: string): DecisionTrace[] | undefined;
  /** Invariant violations seen (simulation checks). */
  readonly violations: string[];
  onStep?: (r: ReplicaHandle, plan: StepPlan) => void;
  /** Outlier ejection: replicas out of routing for slow or failing steps. */
  readonly health: Health;
}

/** Options of a control plane. */
export interface ControlPlaneOptions {
  checkInvariants?: boolean;
  /** Keep decision traces of finished requests (for `--explain`). */
  keepTraces?: boolean;
  /** Called when no request is live any more. */
  onIdle?(): void;
  /** The collector to record into (serving passes a bounded one: a long-running server cannot keep every record). */
  collector?: Collector;
}

/** Starts a control plane on `runtime` for `scenario`. */
export function startControlPlane(runtime: Runtime, scenario: Scenario, opts: ControlPlaneOptions = {}): ControlPlane {
  const { clock } = runtime;
  const collector = opts.collector ?? createCollector();
  const live = new Map<string, Live>();
  const held = new Map<string, Live[]>();
  const finishedTraces = new Map<string, DecisionTrace[]>();
  const violations: string[] = [];
  const deadlines = createDeadlineWheel(clock);
  const modelByName = new Map(scenario.models.map((m) => [m.name, m]));
  const routerRng = runtime.rng.fork('router');
  // Placement is created below; health only asks it about replicas once they exist.
  const health: Health = createHealth(
    {
      now: () => clock.now(),
      modelOf: (id) => placement.replicas.get(id)?.model,
      replicasOf: (m) => {
        let n = 0;
        for (const r of placement.replicas.values()) if (r.model === m) n++;
        return n;
      },
    },
    scenario.routing.ejection,
  );
  // Replica failures reach health from placement's timeline, read incrementally.
  let healthSeen = 0;
  const syncHealth = (): void => {
    const ev = placement.events;
    while (healthSeen < ev.length) {
      const e = ev[healthSeen++]!;
      if (e.kind === 'replica.failed' && e.replica) health.failed(e.replica, e.detail ?? 'replica failed');
      else if (e.kind === 'replica.created' && e.replica) health.reset(e.replica);
    }
  };
  const addTrace = (l: Live, t: DecisionTrace): void => {
    if (l.traces.length < MAX_TRACES) l.traces.push(t);
  };
  let order = 0;

  // Provided once: providing per request would rebuild the machine for every request.
  const requestActorMachine = requestMachine.provide({
    actions: {
      reportOutcome: ({ context }) => {
        const l = live.get(context.id);
        if (l) finish(l, context);
      },
      armDeadline: ({ context, self }) => {
        const at = context.deadlineAt;
        deadlines.arm(at, () => {
          if (self.getSnapshot().status === 'active') self.send({ type: 'request.deadline', at });
        });
      },
    },
  });

  const heldKey = (model: string, version: string): string => `${model}@${version}`;

  /** A request's first scheduling: its wait is checked against its bound and against the router's estimate. */
  const markScheduled = (l: Live, t: number): void => {
    if (l.firstScheduledAt >= 0) return;
    l.firstScheduledAt = t;
    // No request waits past its bound: checked as it is scheduled, not only in the final report.
    if (opts.checkInvariants && t - l.receivedAt > l.budgetMs + 1e-6) {
      violations.push(
        `${l.id} at ${t} ms: scheduled after waiting ${t - l.receivedAt} ms, past its ${l.budgetMs} ms bound`,
      );
    }
    const predicted = l.traces[0]?.candidates.find((c) => c.replica === l.traces[0]!.chosen);
    if (predicted) collector.estimate('queueWaitMs', predicted.waitMs, t - l.receivedAt);
  };

  /** A stateless request as its replica's dynamic batcher sees it; the batch's result is its one response. */
  const statelessItem = (l: Live, r: ReplicaHandle): StatelessItem => ({
    id: l.id,
    model: l.model,
    version: l.version,
    tokens: l.spec.promptTokens,
    dtype: l.spec.dtype ?? 'bf16',
    adapter: l.spec.adapter ?? null,
    options: l.spec.options ?? {},
    receivedAt: l.receivedAt,
    started: (t) => {
      markScheduled(l, t);
      l.actor.send({ type: 'request.scheduled', replica: r.id, t });
    },
    reply: (o) => {
      const t = clock.now();
      if (!o.ok) {
        l.actor.send({ type: 'request.failed', code: o.failure.code, message: o.failure.message, tokens: 0, t });
        return;
      }
      l.actor.send({ type: 'request.firstToken', t });
      l.listener?.tokens?.(l.id, 0, 1, t);
      l.streamed = 1;
      l.actor.send({ type: 'request.finished', tokens: 1, t });
    },
  });
  /** The stateless batcher of `r` (a stateless model's replica is created with one). */
  const statelessOf = (r: ReplicaHandle): StatelessBatcher => {
    if (!r.stateless) throw new Error(`replica ${r.id} of a stateless model has no stateless batcher`);
    return r.stateless;
  };
  /** Among the ready replicas of `r`'s model@version, the one whose stateless batcher holds the fewest requests. */
  const leastQueued = (r: ReplicaHandle): ReplicaHandle => {
    let best = r;
    let bestQueued = r.stateless?.stats().queued ?? 0;
    for (const x of placement.replicas.values()) {
      if (
        x.model !== r.model ||
        x.version !== r.version ||
        !x.actor.getSnapshot().matches('ready') ||
        health.ejected(x.id)
      )
        continue;
      const q = x.stateless?.stats().queued ?? 0;
      if (q < bestQueued) {
        best = x;
        bestQueued = q;
      }
    }
    return best;
  };
  /** Hands an admitted request to replica `r`: a sequence for a generative model, a batch member for a stateless one. */
  const handTo = (l: Live, r: ReplicaHandle, generated: number, atHead: boolean): void => {
    if (modelByName.get(l.model)?.kind === 'stateless') statelessOf(r).submit(statelessItem(l, r));
    else r.enqueue(newSequence(l, generated), atHead);
  };

  const listener: SequenceListener = {
    scheduled: (seq, t) => {
      const l = seq.tag as Live;
      markScheduled(l, t);
      l.awaitingToken = true;
      l.actor.send({
        type: 'request.scheduled',
        replica: l.actor.getSnapshot().context.replica ?? 'router',
        t,
      });
    },
    preempted: (seq, t) => {
      (seq.tag as Live).actor.send({ type: 'request.preempted', t });
    },
    tokens: (seq, n, t) => {
      const l = seq.tag as Live;
      if (l.awaitingToken) {
        l.awaitingToken = false;
        l.actor.send({ type: 'request.firstToken', t });
      } else if (seq.lastTokenAt >= 0) {
        collector.tbt(l.model, t - seq.lastTokenAt);
      }
      l.listener?.tokens?.(l.id, l.streamed, n, t);
      l.streamed += n;
    },
    finished: (seq, t) => {
      (seq.tag as Live).actor.send({ type: 'request.finished', tokens: seq.generated, t });
    },
  };

  const newSequence = (l: Live, generated: number): Sequence => {
    const m = modelByName.get(l.model)!;
    const seq = createSequence({
      id: l.id,
      priority: l.rank,
      order: ++order,
      promptTokens: l.spec.promptTokens,
      outputTokens: l.spec.outputTokens,
      maxTokens: l.spec.maxTokens,
      estOutputTokens: m.estimate === 'oracle' ? l.spec.outputTokens : l.spec.maxTokens,
      receivedAt: l.receivedAt,
      generated,
      listener,
      tag: l,
    });
    l.seq = seq;
    return seq;
  };

  const dispatchHeld = (r: ReplicaHandle): void => {
    const q = held.get(heldKey(r.model, r.version));
    if (!q) return;
    placement.demand(r.model);
    while (q.length > 0) {
      const l = q.shift()!;
      const snap = l.actor.getSnapshot();
      if (snap.status !== 'active') continue;
      const generated = l.seq?.generated ?? 0;
      const pick = router.resume(l.model, l.version, l.spec.priority, {
        promptTokens: l.spec.promptTokens + generated,
        estOutputTokens: l.spec.maxTokens - generated,
        priority: l.rank,
      });
      const target = pick.replica;
      if (target) addTrace(l, pick.trace);
      if (!target) {
        q.unshift(l);
        return;
      }
      l.actor.send({ type: 'request.requeued', replica: target.id, t: clock.now() });
      handTo(l, target, generated, generated > 0);
    }
  };

  const onInterrupted = (seqs: Sequence[], reason: OutcomeCode): void => {
    const t = clock.now();
    for (const s of seqs) {
      const l = s.tag as Live;
      if (l.actor.getSnapshot().status !== 'active') continue;
      const from = l.actor.getSnapshot().context.replica;
      l.actor.send({
        type: 'request.interrupted',
        code: reason,
        message: `the replica serving it failed (${reason})`,
        tokens: s.generated,
        t,
      });
      if (l.actor.getSnapshot().status !== 'active') continue;
      // Resumed: re-prefill what the client already has, on another replica of the same model@version.
      const pick = router.resume(l.model, l.version, l.spec.priority, {
        promptTokens: l.spec.promptTokens + s.generated,
        estOutputTokens: l.spec.maxTokens - s.generated,
        priority: l.rank,
      });
      addTrace(l, pick.trace);
      // The failing replica still reads as ready while its failure transition runs: never resume onto it.
      const target = pick.replica && pick.replica.id !== from ? pick.replica : null;
      if (target) {
        l.actor.send({ type: 'request.requeued', replica: target.id, t });
        target.enqueue(newSequence(l, s.generated), true);
      } else {
        const k = heldKey(l.model, l.version);
        const q = held.get(k) ?? [];
        q.unshift(l);
        held.set(k, q);
        placement.demand(l.model);
      }
    }
  };

  const placement = startPlacement(runtime, scenario, {
    onInterrupted,
    onReplicaReady: dispatchHeld,
    held: (model) => {
      let count = 0;
      for (const [k, q] of held) if (k.startsWith(`${model}@`)) count += q.length;
      return count;
    },
    onStep: (r, plan) => {
      collector.estimate('stepMs', plan.predictedMs, clock.now() - plan.dispatchedAt);
      health.step(r.id, plan.predictedMs, clock.now() - plan.dispatchedAt);
      if (opts.checkInvariants) {
        try {
          if (r.stateless) r.stateless.checkInvariants();
          else r.batcher.checkInvariants(plan);
          // Every member of a step is a request for this replica's model@version.
          for (const e of plan.entries) {
            const l = e.seq.tag as Live;
            if (l.model !== r.model || l.version !== r.version)
              throw new Error(`step holds ${l.id} for ${l.model}@${l.version}`);
          }
        } catch (e) {
          violations.push(`${r.id} at ${clock.now()} ms: ${(e as Error).message}`);
        }
      }
      cp.onStep?.(r, plan);
    },
  });

  const registry = createRegistry(
    scenario.models.map((m) => ({
      name: m.name,
      versions: m.versions,
      aliases: m.aliases,
      ...(m.split ? { split: m.split } : {}),
    })),
  );
  const limits = new Map(
    scenario.models.map((m) => [
      m.name,
      { maxContext: m.batching.maxContext, classes: Object.fromEntries(m.classes.map((c) => [c.name, c])) },
    ]),
  );
  const router = createRouter({
    registry,
    limits: (m) => limits.get(m),
    replicas: () => placement.replicas.values(),
    unavailable: (m) => placement.unavailable(m),
    etaMs: (m, v) => placement.etaMs(m, v),
    held: (m, rank) => {
      let count = 0;
      let tokens = 0;
      for (const [k, q] of held) {
        if (!k.startsWith(`${m}@`)) continue;
        for (const l of q) {
          if (l.rank !== rank) continue;
          count++;
          tokens += l.spec.promptTokens;
        }
      }
      return { count, tokens };
    },
    policy: scenario.routing.policy,
    rng: routerRng,
    now: () => clock.now(),
    ejected: (id) => {
      syncHealth();
      return health.ejected(id);
    },
    slowdown: (id) => health.ratio(id),
  });

  runtime.register('router', (msg) => {
    if (msg.type !== 'request.withdraw') return;
    const id = msg['id'] as string;
    // The withdraw is emitted after the request reported its outcome (emits are deferred), so it may have left `live`.
    const l = live.get(id);
    for (const q of l ? [held.get(heldKey(l.model, l.version)) ?? []] : held.values()) {
      const i = q.findIndex((x) => x.id === id);
      if (i < 0) continue;
      const model = q[i]!.model;
      q.splice(i, 1);
      placement.demand(model);
      return;
    }
  });

  const finish = (l: Live, c: RequestContext): void => {
    const outcome = c.outcome ?? 'failed';
    live.delete(l.id);
    if (c.code === 'expired')
      addTrace(l, expiryTrace(router.policy, l, c, placement.replicas.get(c.replica ?? ''), clock.now()));
    if (opts.keepTraces) finishedTraces.set(l.id, l.traces);
    collector.record({
      id: l.id,
      model: l.model,
      priority: l.spec.priority,
      outcome,
      code: c.code,
      receivedAt: l.receivedAt,
      firstScheduledAt: l.firstScheduledAt,
      firstTokenAt: c.firstTokenAt,
      finishedAt: c.finishedAt >= 0 ? c.finishedAt : clock.now(),
      tokens: l.streamed,
      budgetMs: l.budgetMs,
      resumes: c.resumes,
      preemptions: c.preemptions,
    });
    l.listener?.terminal?.(l.id, {
      outcome,
      code: c.code,
      message: c.message,
      tokens: l.streamed,
      ...(l.retryAfterMs !== undefined ? { retryAfterMs: l.retryAfterMs } : {}),
      timings: {
        receivedAt: l.receivedAt,
        firstTokenAt: c.firstTokenAt,
        finishedAt: c.finishedAt >= 0 ? c.finishedAt : clock.now(),
      },
    });
    if (live.size === 0) opts.onIdle?.();
  };

  const submit = (
    spec: SubmitSpec,
    clientListener?: ClientListener,
  ): { id: string; ok: boolean; failure?: Failure } => {
    const t = clock.now();
    const id = spec.id ?? runtime.ids.next('req');
    if (live.has(id))
      return { id, ok: false, failure: failure('invalid_request', `request id ${id} is already in flight`) };
    const m = modelByName.get(spec.model);
    const priority = spec.priority ?? m?.classes[0]?.name ?? 'interactive';
    const full = { ...spec, priority, outputTokens: Math.min(spec.outputTokens ?? spec.maxTokens, spec.maxTokens) };
    // A stateless request is one forward pass with one response: it asks for no output tokens.
    const stateless = m?.kind === 'stateless';
    const adm = router.route({
      id,
      model: spec.model,
      ...(spec.version !== undefined ? { version: spec.version } : {}),
      priority,
      promptTokens: spec.promptTokens,
      maxTokens: stateless ? 1 : spec.maxTokens,
      estOutputTokens: m?.estimate === 'oracle' ? full.outputTokens : spec.maxTokens,
      ...(spec.deadlineMs !== undefined ? { deadlineMs: spec.deadlineMs } : {}),
    });
    const budgetMs = adm.ok ? adm.budgetMs : 0;
    const actor = createActor(requestActorMachine, {
      input: {
        id,
        model: spec.model,
        priority,
        receivedAt: t,
        queueBudgetMs: budgetMs,
        resumeBudgetMs: m?.resume.budgetMs ?? 30_000,
        maxResumes: m?.resume.maxResumes ?? 1,
      },
      clock,
      id,
    });
    const l: Live = {
      id,
      actor,
      spec: full,
      model: spec.model,
      version: adm.ok ? adm.version : '',
      rank: adm.ok ? adm.rank : 0,
      budgetMs,
      receivedAt: t,
      firstScheduledAt: -1,
      awaitingToken: false,
      streamed: 0,
      seq: null,
      listener: clientListener,
      traces: [adm.trace],
      ...(adm.ok ? {} : adm.failure.retryAfterMs !== undefined ? { retryAfterMs: adm.failure.retryAfterMs } : {}),
    };
    live.set(id, l);
    runtime.supervise(id, actor);
    actor.start();
    // A stateless request goes to the replica with the fewest requests in its batcher (the router's estimate reads the
    // iteration-level ledger, empty for these replicas); that batcher refuses what no batch can hold, or a full queue.
    const target = adm.ok && adm.replica && stateless ? leastQueued(adm.replica) : adm.ok ? adm.replica : null;
    const refused = target && stateless ? statelessOf(target).check({ id, tokens: spec.promptTokens }) : null;
    if (refused) {
      actor.send({ type: 'request.rejected', code: refused.code, message: refused.message, t });
      return { id, ok: false, failure: refused };
    }
    if (!adm.ok) {
      // Refused only because no replica is ready yet: still demand for placement (the client will retry).
      if (adm.failure.code === 'overloaded' && adm.trace.candidates.length === 0)
        placement.demand(spec.model, true, adm.failure.retryAfterMs);
      actor.send({ type: 'request.rejected', code: adm.failure.code, message: adm.failure.message, t });
      return { id, ok: false, failure: adm.failure };
    }
    clientListener?.accepted?.(id);
    actor.send({ type: 'request.admitted', replica: target?.id ?? 'router', t });
    if (target) {
      handTo(l, target, 0, false);
    } else {
      const k = heldKey(adm.model, adm.version);
      const q = held.get(k) ?? [];
      q.push(l);
      held.set(k, q);
      placement.demand(adm.model);
    }
    return { id, ok: true };
  };

  const cp: ControlPlane = {
    runtime,
    scenario,
    router,
    placement,
    collector,
    submit,
    cancel: (id) => {
      const l = live.get(id);
      if (!l) return false;
      l.actor.send({ type: 'request.cancel', t: clock.now() });
      return true;
    },
    live: () => live.size,
    explain: (id) => live.get(id)?.traces ?? finishedTraces.get(id),
    violations,
    health,
  };
  return cp;
}
