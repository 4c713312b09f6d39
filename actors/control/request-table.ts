// The request table: every live request by id, its request actor (one terminal outcome each), its decision traces,
// the sequence a generative replica runs for it, and the record and client answer when it ends.
import { createActor, type AnyActorRef, type Snapshot } from 'xstate';
import {
  initialRequestContext,
  REQUEST_INITIAL_STATE,
  requestMachine,
  type RequestContext,
} from '../../machines/request.machine.ts';
import { createSequence, type Sequence, type SequenceListener } from '../batcher/sequence.ts';
import type { Collector } from '../metrics/collector.ts';
import { MAX_TRACES } from '../router/explain.ts';
import type { DecisionTrace } from '../router/router.ts';
import type { Runtime } from '../../runtime/system.ts';
import type { DeadlineWheel } from '../../runtime/deadlines.ts';
import type { Live } from './types.ts';

/** What the request table needs. */
export interface RequestTableDeps {
  runtime: Runtime;
  collector: Collector;
  deadlines: DeadlineWheel;
  keepTraces: boolean;
  /** Whether a model's ledger expects a request's real output length (oracle) rather than its maxTokens. */
  oracle(model: string): boolean;
  /** The trace recorded when a request expires (where it waited, that replica's queue). */
  expiryTrace(l: Live, c: RequestContext): DecisionTrace;
  /** A request's first scheduling (invariant checks and estimate error). */
  scheduled(l: Live, t: number): void;
  onIdle?(): void;
}

/** The live requests of a control plane. */
export interface RequestTable {
  get(id: string): Live | undefined;
  has(id: string): boolean;
  readonly size: number;
  /** Creates and starts the request actor of `l` (its input from `l`), and adds `l` to the table. `l` becomes the
   * live record (its actor and streams set on it): the caller hands over a fresh object. */
  start(l: Omit<Live, 'actor' | 'streams' | 'deadline'>, resume: { budgetMs: number; maxResumes: number }): Live;
  addTrace(l: Live, t: DecisionTrace): void;
  /** Marks a request's first scheduling at `t` (once). */
  markScheduled(l: Live, t: number): void;
  /** A new sequence for `l` that has `generated` tokens already (re-prefilled on a resume). */
  newSequence(l: Live, generated: number): Sequence;
  cancel(id: string): boolean;
  /** A live request's tokens streamed and first token's time (-1: none yet), or null when it is not live. */
  progress(id: string): { tokens: number; firstTokenAt: number } | null;
  explain(id: string): DecisionTrace[] | undefined;
}

type ProvidedRequestMachine = ReturnType<typeof requestMachine.provide>;

/**
 * A request's actor, created (not started) as a member of `parent`'s group. It starts from the machine's initial
 * state and context as a snapshot: the same snapshot the machine's initial transition computes (its initial state
 * has no entry action and no eventless transition; test/machines checks that they are equal), without computing it.
 */
export function createRequestActor(
  machine: ProvidedRequestMachine,
  parent: AnyActorRef,
  rec: Omit<Live, 'actor' | 'streams' | 'deadline'>,
  resume: { budgetMs: number; maxResumes: number },
): Live['actor'] {
  const input = {
    id: rec.id,
    model: rec.model,
    priority: rec.spec.priority,
    receivedAt: rec.receivedAt,
    queueBudgetMs: rec.budgetMs,
    resumeBudgetMs: resume.budgetMs,
    maxResumes: resume.maxResumes,
  };
  const snapshot: Snapshot<unknown> & Record<string, unknown> = {
    status: 'active',
    output: undefined,
    error: undefined,
    value: REQUEST_INITIAL_STATE,
    context: initialRequestContext(input),
    children: {},
    historyValue: {},
  };
  return createActor(machine, { input, snapshot, id: rec.id, parent });
}

/** Creates the request table. */
export function createRequestTable(deps: RequestTableDeps): RequestTable {
  const { clock } = deps.runtime;
  const live = new Map<string, Live>();
  const finishedTraces = new Map<string, DecisionTrace[]>();
  let order = 0;
  // Every request actor is a member of this group: one actor system for all of them, supervised through it.
  const group = deps.runtime.group('requests');

  const expire = (l: Live, at: number): void => {
    if (l.actor.getSnapshot().status === 'active') l.actor.send({ type: 'request.deadline', at });
  };
  // Provided once: providing per request would rebuild the machine for every request.
  const machine = requestMachine.provide({
    actions: {
      reportOutcome: ({ context }) => {
        const l = live.get(context.id);
        if (l) finish(l, context);
      },
      armDeadline: ({ context }) => {
        const l = live.get(context.id);
        if (!l) return;
        const at = context.deadlineAt;
        // A deadline armed before (a requeue) stays armed: it fires stale, in its place among the others.
        l.deadline = deps.deadlines.arm(at, () => expire(l, at));
      },
    },
  });

  const addTrace = (l: Live, t: DecisionTrace): void => {
    if (l.traces.length < MAX_TRACES) l.traces.push(t);
  };

  const markScheduled = (l: Live, t: number): void => {
    if (l.firstScheduledAt >= 0) return;
    l.firstScheduledAt = t;
    deps.scheduled(l, t);
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
        deps.collector.tbt(l.model, t - seq.lastTokenAt);
      }
      if (l.streams) l.listener!.tokens!(l.id, l.streamed, n, t, seq.tokens?.lastText);
      l.streamed += n;
    },
    finished: (seq, t) => {
      (seq.tag as Live).actor.send({ type: 'request.finished', tokens: seq.generated, t });
    },
  };

  const newSequence = (l: Live, generated: number): Sequence => {
    const seq = createSequence({
      id: l.id,
      priority: l.rank,
      order: ++order,
      promptTokens: l.spec.promptTokens,
      outputTokens: l.spec.outputTokens,
      maxTokens: l.spec.maxTokens,
      estOutputTokens: deps.oracle(l.model) ? l.spec.outputTokens : l.spec.maxTokens,
      receivedAt: l.receivedAt,
      generated,
      listener,
      tag: l,
      ...(l.tokens ? { tokens: l.tokens } : {}),
    });
    l.seq = seq;
    return seq;
  };

  const finish = (l: Live, c: RequestContext): void => {
    const outcome = c.outcome ?? 'failed';
    live.delete(l.id);
    // The actor is ending, so its deadline could only fire stale: let the wheel drop what it holds now.
    if (l.deadline) deps.deadlines.disarm(l.deadline);
    l.deadline = null;
    if (c.code === 'expired') addTrace(l, deps.expiryTrace(l, c));
    if (deps.keepTraces) finishedTraces.set(l.id, l.traces);
    const finishedAt = c.finishedAt >= 0 ? c.finishedAt : clock.now();
    deps.collector.record({
      id: l.id,
      model: l.model,
      priority: l.spec.priority,
      outcome,
      code: c.code,
      receivedAt: l.receivedAt,
      firstScheduledAt: l.firstScheduledAt,
      firstTokenAt: c.firstTokenAt,
      finishedAt,
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
      timings: { receivedAt: l.receivedAt, firstTokenAt: c.firstTokenAt, finishedAt },
    });
    if (live.size === 0) deps.onIdle?.();
  };

  return {
    get: (id) => live.get(id),
    has: (id) => live.has(id),
    get size() {
      return live.size;
    },
    start: (rec, resume) => {
      const actor = createRequestActor(machine, group.parent, rec, resume);
      const l = rec as Live;
      l.actor = actor;
      l.streams = rec.listener?.tokens !== undefined;
      l.deadline = null;
      live.set(l.id, l);
      group.add(l.id, actor);
      actor.start();
      return l;
    },
    addTrace,
    markScheduled,
    newSequence,
    cancel: (id) => {
      const l = live.get(id);
      if (!l) return false;
      l.actor.send({ type: 'request.cancel', t: clock.now() });
      return true;
    },
    progress: (id) => {
      const l = live.get(id);
      return l ? { tokens: l.streamed, firstTokenAt: l.actor.getSnapshot().context.firstTokenAt } : null;
    },
    explain: (id) => live.get(id)?.traces ?? finishedTraces.get(id),
  };
}
