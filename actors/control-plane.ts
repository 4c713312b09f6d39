// The control plane: requests, router, placement and replicas of one node, wired on one runtime. The same code
// serves live traffic (wall clock, WebSocket link to the node agent) and runs simulations (virtual clock).
import { createActor, type ActorRefFrom } from 'xstate';
import { requestMachine, type RequestContext } from '../machines/request.machine.ts';
import { createSequence, type Sequence, type SequenceListener } from './batcher/sequence.ts';
import type { StepPlan } from './batcher/continuous.ts';
import type { Scenario } from './config.ts';
import { createCollector, type Collector } from './metrics/collector.ts';
import { failure, type Failure } from './outcomes.ts';
import { startPlacement, type Placement } from './placement/placement.ts';
import type { ReplicaHandle } from './replica.ts';
import { createRegistry } from './router/registry.ts';
import { createRouter, type DecisionTrace, type Router } from './router/router.ts';
import type { Runtime } from './runtime/system.ts';
import { createDeadlineWheel } from './runtime/deadlines.ts';

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
}

/** Options of a control plane. */
export interface ControlPlaneOptions {
  checkInvariants?: boolean;
  /** Keep decision traces of finished requests (for `--explain`). */
  keepTraces?: boolean;
  /** Called when no request is live any more. */
  onIdle?(): void;
}

/** Starts a control plane on `runtime` for `scenario`. */
export function startControlPlane(runtime: Runtime, scenario: Scenario, opts: ControlPlaneOptions = {}): ControlPlane {
  const { clock } = runtime;
  const collector = createCollector();
  const live = new Map<string, Live>();
  const held = new Map<string, Live[]>();
  const finishedTraces = new Map<string, DecisionTrace[]>();
  const violations: string[] = [];
  const deadlines = createDeadlineWheel(clock);
  const modelByName = new Map(scenario.models.map((m) => [m.name, m]));
  const routerRng = runtime.rng.fork('router');
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

  const listener: SequenceListener = {
    scheduled: (seq, t) => {
      const l = seq.tag as Live;
      if (l.firstScheduledAt < 0) l.firstScheduledAt = t;
      l.awaitingToken = true;
      l.actor.send({ type: 'request.scheduled', replica: l.actor.getSnapshot().context.replica ?? 'router', t, prefilling: true });
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
    while (q.length > 0) {
      const l = q.shift()!;
      const snap = l.actor.getSnapshot();
      if (snap.status !== 'active') continue;
      const generated = l.seq?.generated ?? 0;
      const target = router.pickForResume(l.model, l.version, {
        promptTokens: l.spec.promptTokens + generated,
        estOutputTokens: l.spec.maxTokens - generated,
        priority: l.rank,
      });
      if (!target) {
        q.unshift(l);
        return;
      }
      l.actor.send({ type: 'request.requeued', replica: target.id, t: clock.now() });
      target.enqueue(newSequence(l, generated), generated > 0);
    }
  };

  const onInterrupted = (seqs: Sequence[], reason: string): void => {
    const t = clock.now();
    for (const s of seqs) {
      const l = s.tag as Live;
      if (l.actor.getSnapshot().status !== 'active') continue;
      l.actor.send({ type: 'request.interrupted', code: reason, message: `the replica serving it failed (${reason})`, tokens: s.generated, t });
      if (l.actor.getSnapshot().status !== 'active') continue;
      // Resumed: re-prefill what the client already has, on another replica of the same model@version.
      const target = router.pickForResume(l.model, l.version, {
        promptTokens: l.spec.promptTokens + s.generated,
        estOutputTokens: l.spec.maxTokens - s.generated,
        priority: l.rank,
      });
      if (target) {
        l.actor.send({ type: 'request.requeued', replica: target.id, t });
        target.enqueue(newSequence(l, s.generated), true);
      } else {
        const k = heldKey(l.model, l.version);
        const q = held.get(k) ?? [];
        q.unshift(l);
        held.set(k, q);
      }
    }
  };

  const placement = startPlacement(runtime, scenario, {
    onInterrupted,
    onReplicaReady: dispatchHeld,
    onStep: (r, plan) => {
      if (opts.checkInvariants) {
        try {
          r.batcher.checkInvariants();
        } catch (e) {
          violations.push(`${r.id} at ${clock.now()} ms: ${(e as Error).message}`);
        }
      }
      cp.onStep?.(r, plan);
    },
  });

  const registry = createRegistry(
    scenario.models.map((m) => ({ name: m.name, versions: m.versions, aliases: m.aliases, ...(m.split ? { split: m.split } : {}) })),
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
  });

  runtime.register('router', (msg) => {
    if (msg.type !== 'request.withdraw') return;
    const l = live.get(msg['id'] as string);
    if (!l) return;
    const q = held.get(heldKey(l.model, l.version));
    const i = q?.indexOf(l) ?? -1;
    if (q && i >= 0) q.splice(i, 1);
  });

  const finish = (l: Live, c: RequestContext): void => {
    const outcome = c.outcome ?? 'failed';
    live.delete(l.id);
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
      timings: { receivedAt: l.receivedAt, firstTokenAt: c.firstTokenAt, finishedAt: c.finishedAt >= 0 ? c.finishedAt : clock.now() },
    });
    if (live.size === 0) opts.onIdle?.();
  };

  const submit = (spec: SubmitSpec, clientListener?: ClientListener): { id: string; ok: boolean; failure?: Failure } => {
    const t = clock.now();
    const id = spec.id ?? runtime.ids.next('req');
    if (live.has(id)) return { id, ok: false, failure: failure('invalid_request', `request id ${id} is already in flight`) };
    const m = modelByName.get(spec.model);
    const priority = spec.priority ?? m?.classes[0]?.name ?? 'interactive';
    const full = { ...spec, priority, outputTokens: Math.min(spec.outputTokens ?? spec.maxTokens, spec.maxTokens) };
    const adm = router.route({
      id,
      model: spec.model,
      ...(spec.version !== undefined ? { version: spec.version } : {}),
      priority,
      promptTokens: spec.promptTokens,
      maxTokens: spec.maxTokens,
      estOutputTokens: m?.estimate === 'oracle' ? full.outputTokens : spec.maxTokens,
      ...(spec.deadlineMs !== undefined ? { deadlineMs: spec.deadlineMs } : {}),
    });
    const budgetMs = adm.ok ? adm.budgetMs : 0;
    const actor = createActor(
      requestActorMachine,
      {
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
      },
    );
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
    if (!adm.ok) {
      actor.send({ type: 'request.rejected', code: adm.failure.code, message: adm.failure.message, t });
      return { id, ok: false, failure: adm.failure };
    }
    clientListener?.accepted?.(id);
    actor.send({ type: 'request.admitted', replica: adm.replica?.id ?? 'router', t });
    if (adm.replica) {
      adm.replica.enqueue(newSequence(l, 0));
    } else {
      const k = heldKey(adm.model, adm.version);
      const q = held.get(k) ?? [];
      q.push(l);
      held.set(k, q);
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
  };
  return cp;
}
