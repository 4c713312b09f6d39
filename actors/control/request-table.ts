// The request table: every live request by id, its request actor (one terminal outcome each), its decision traces,
// the sequence a generative replica runs for it, and the record and client answer when it ends.
import type { TokenLogprob } from '../../machines/core-messages.ts';
import { createActor, type AnyActorRef, type Snapshot } from 'xstate';
import {
  admittedRequestContext,
  initialRequestContext,
  REQUEST_ADMITTED_STATE,
  REQUEST_INITIAL_STATE,
  requestMachine,
  type RequestContext,
  type RequestEvent,
} from '../../machines/request.machine.ts';
import { compileFlatMachine, type FlatMachineLogic } from '../../runtime/flat-machine.ts';
import { createSequence, ownerKey, type Sequence, type SequenceListener } from '../batcher/sequence.ts';
import type { Collector } from '../metrics/collector.ts';
import { MAX_TRACES } from '../router/explain.ts';
import type { DecisionTrace } from '../router/router.ts';
import type { Runtime } from '../../runtime/system.ts';
import type { DeadlineWheel } from '../../runtime/deadlines.ts';
import { ChurnMap } from '../../runtime/churn-map.ts';
import { BrokenInvariant, contained } from '../../runtime/contain.ts';
import { HELD_ADDRESS } from './held-queue.ts';
import type { Live, RequestActor } from './types.ts';

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
  /** A deliberate defect of the compiled request machine, for mutation tests (see compileFlatMachine). */
  flatMutation?: 'drop-root-transitions';
  /** A request's first scheduling (invariant checks and estimate error). */
  scheduled(l: Live, t: number): void;
  onIdle?(): void;
  /** The operator's log: a request whose client side threw (it alone fails, with `internal`). */
  log?(line: string): void;
}

/** The live requests of a control plane. */
export interface RequestTable {
  get(id: string): Live | undefined;
  has(id: string): boolean;
  readonly size: number;
  /** Creates and starts the request actor of `l` (its input from `l`), and adds a live record built from `l` (with
   * its actor and streams) to the table; returns that record. With `admitted`, the request is admitted to that
   * replica (or holding queue) at that time: as if sent `request.admitted` once started. */
  start(
    l: Omit<Live, 'actor' | 'streams'>,
    resume: { budgetMs: number; maxResumes: number },
    admitted?: Admission,
  ): Live;
  addTrace(l: Live, t: DecisionTrace): void;
  /** Marks a request's first scheduling at `t` (once). */
  markScheduled(l: Live, t: number): void;
  /** A new sequence for `l` that has `generated` tokens already (re-prefilled on a resume). */
  newSequence(l: Live, generated: number): Sequence;
  /**
   * Hands `n` tokens (the first numbered `seq`) to a request's client. A client side that throws fails that request
   * alone (`internal`, logged), once the step or turn delivering them is done: the others in it go on.
   */
  deliver(l: Live, seq: number, n: number, t: number, text?: string, lp?: readonly TokenLogprob[]): void;
  /**
   * Contains an exception raised while `what` for one request, outside its actor: logged, and the request alone fails
   * (`internal`, fail()) at once, or with `later` once the step or turn that raised it is done. A BrokenInvariant is
   * not contained: it goes on up.
   */
  contain(id: string, what: string, e: unknown, later?: boolean): void;
  cancel(id: string): boolean;
  /**
   * Ends a live request whose handling threw with `internal`: it leaves the queue it waits in (its replica's, or the
   * hold) and its actor fails, which releases the rest as any end does. False when it is not live. Throws a
   * BrokenInvariant when even that throws: what it held is then unknown.
   */
  fail(id: string, message: string): boolean;
  /** A live request's tokens streamed and first token's time (-1: none yet), or null when it is not live. */
  progress(id: string): { tokens: number; firstTokenAt: number } | null;
  explain(id: string): DecisionTrace[] | undefined;
}

type ProvidedRequestMachine = ReturnType<typeof requestMachine.provide>;

/** The logic a request actor runs: the provided request machine, interpreted or compiled flat. */
export type RequestLogic = ProvidedRequestMachine | FlatMachineLogic<RequestContext, RequestEvent>;

/** A request's admission: the replica (or holding queue) it waits in, from `t`. */
export interface Admission {
  replica: string;
  t: number;
}

/**
 * A request's actor, created (not started) as a member of `parent`'s group. It starts from the machine's initial
 * state and context as a snapshot: the same snapshot the machine's initial transition computes (its initial state
 * has no entry action and no eventless transition; test/actors/control checks that they are equal), without
 * computing it. With `admitted`, it starts from the snapshot `request.admitted` leads to from there instead (the
 * transition's target and assign; its target's one entry action, arming the deadline, is then the caller's).
 */
export function createRequestActor(
  logic: RequestLogic,
  parent: AnyActorRef,
  rec: Omit<Live, 'actor' | 'streams'>,
  resume: { budgetMs: number; maxResumes: number },
  admitted?: Admission,
): RequestActor {
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
    value: admitted ? REQUEST_ADMITTED_STATE : REQUEST_INITIAL_STATE,
    context: admitted ? admittedRequestContext(input, admitted) : initialRequestContext(input),
    children: {},
    historyValue: {},
  };
  // Two calls, one per kind of logic: each returns its own actor type. Started from a snapshot, an actor reads its
  // input only for the init event an inspector is shown, and only the interpreted machine runs under an inspector:
  // the compiled one is not given it (XState copies every option into a fresh object per actor, about 1 µs each).
  return 'root' in logic
    ? createActor(logic, { input, snapshot, id: rec.id, parent })
    : createActor(logic, { snapshot, id: rec.id, parent });
}

/** Arms the deadline of a request's wait on the wheel, in place of its previous wait's (`l` keeps the disarm). */
function armWait(
  wheel: DeadlineWheel,
  l: Live | undefined,
  at: number,
  self: { getSnapshot(): { status: string }; send(e: { type: 'request.deadline'; at: number }): void },
): void {
  l?.disarm?.();
  const disarm = wheel.arm(at, () => {
    if (self.getSnapshot().status === 'active') self.send({ type: 'request.deadline', at });
  });
  if (l) l.disarm = disarm;
}

/** Tokens a request's client has: its sequence's (a generative request streams what its sequence generates, and a
 * resumed one starts from there), else what a stateless batch gave it. */
const streamedOf = (l: Live): number => (l.seq ? l.seq.generated : l.streamed);

/** The listener of a model's sequences: request actor events at scheduling, first token, preemption and finish,
 * time between tokens for the collector, and tokens for a client that takes them (`streams`). */
function sequenceListener(
  model: string,
  streams: boolean,
  markScheduled: (l: Live, t: number) => void,
  collector: Collector,
  deliver: RequestTable['deliver'],
): SequenceListener {
  return {
    scheduled: (seq, t) => {
      const l = seq.tag as Live;
      // Scheduled, it no longer waits: its deadline is moot (a preemption or interruption arms a new one).
      l.disarm?.();
      // A sequence starts with what its replica's prefix cache held of its prompt already computed.
      if (l.firstScheduledAt < 0 && l.hashes) {
        l.cachedTokens = seq.computed;
        // The decision that sent it there hears what its replica really held (--explain shows both).
        for (let i = l.traces.length - 1; i >= 0; i--) {
          if (l.traces[i]!.outcome !== 'routed') continue;
          l.traces[i]!.cachedTokens = seq.computed;
          break;
        }
      }
      markScheduled(l, t);
      seq.awaitingToken = true;
      l.actor.send({ type: 'request.scheduled', replica: l.actor.getSnapshot().context.replica ?? 'router', t });
    },
    preempted: (seq, t) => {
      (seq.tag as Live).actor.send({ type: 'request.preempted', t });
    },
    tokens: (seq, n, t) => {
      if (seq.awaitingToken) {
        seq.awaitingToken = false;
        (seq.tag as Live).actor.send({ type: 'request.firstToken', t });
      } else if (seq.lastTokenAt >= 0) {
        collector.tbt(model, t - seq.lastTokenAt);
      }
      if (!streams) return;
      const lp = seq.tokens?.lastLogprob;
      deliver(seq.tag as Live, seq.generated - n, n, t, seq.tokens?.lastText, lp ? [lp] : undefined);
    },
    finished: (seq, t) => {
      (seq.tag as Live).actor.send({ type: 'request.finished', tokens: seq.generated, t });
    },
    ...(streams ? {} : { sameGap: (n: number, gapMs: number) => collector.tbtN(model, gapMs, n) }),
  };
}

/**
 * A live request as one literal, every field in one order: the spread it replaces (`{ ...rec, actor, streams }`) gave
 * each request a hidden class of its own (in V8, a spread followed by a key it did not have does), so every read of a
 * Live was a megamorphic miss in V8's stub cache.
 */
function liveOf(rec: Omit<Live, 'actor' | 'streams'>, actor: Live['actor']): Live {
  return {
    id: rec.id,
    actor,
    spec: rec.spec,
    model: rec.model,
    version: rec.version,
    rank: rec.rank,
    budgetMs: rec.budgetMs,
    estOutputTokens: rec.estOutputTokens,
    receivedAt: rec.receivedAt,
    firstScheduledAt: rec.firstScheduledAt,
    streamed: rec.streamed,
    seq: rec.seq,
    tokens: rec.tokens,
    hashes: rec.hashes,
    listener: rec.listener,
    streams: rec.listener?.tokens !== undefined,
    traces: rec.traces,
    retryAfterMs: rec.retryAfterMs,
    heldSince: rec.heldSince,
    disarm: rec.disarm,
  };
}

/** Ending one request whose handling threw, alone (fail), containing such a throw (contain), and handing tokens to a
 * client whose side may throw (deliver): see RequestTable. */
function failingAlone(
  deps: RequestTableDeps,
  live: ChurnMap<string, Live>,
): Pick<RequestTable, 'fail' | 'contain' | 'deliver'> {
  const { clock } = deps.runtime;
  const fail = (id: string, message: string): boolean => {
    const l = live.get(id);
    if (!l) return false;
    try {
      const t = clock.now();
      const at = l.actor.getSnapshot().context.replica;
      l.actor.send({ type: 'request.failed', code: 'internal', message, tokens: streamedOf(l), t });
      // As a cancel withdraws it (the request machine's `withdraw`), from wherever it was handed (or the hold).
      deps.runtime.send(at ?? HELD_ADDRESS, { type: 'request.withdraw', id });
    } catch (e) {
      throw new BrokenInvariant(`failing ${id} after its handling threw, threw again`, [id], e);
    }
    return true;
  };

  // Requests to fail once the step (or turn) that raised their failure is done, each once.
  const failing = new Set<string>();
  const contain = (id: string, what: string, e: unknown, later = false): void => {
    deps.log?.(`request ${id}: ${what} failed: ${contained(e)}`);
    const message = `the server failed while ${what} (request ${id})`;
    if (!later) {
      fail(id, message);
      return;
    }
    if (failing.has(id)) return;
    failing.add(id);
    clock.setTimeout(() => {
      failing.delete(id);
      fail(id, message);
    }, 0);
  };
  const deliver = (l: Live, seq: number, n: number, t: number, text?: string, lp?: readonly TokenLogprob[]): void => {
    try {
      l.listener?.tokens?.(l.id, seq, n, t, text, lp);
    } catch (e) {
      // The step goes on for the others; this request alone fails once it is done.
      contain(l.id, 'delivering its tokens', e, true);
    }
  };
  return { fail, contain, deliver };
}

/** Creates the request table. */
export function createRequestTable(deps: RequestTableDeps): RequestTable {
  const { clock } = deps.runtime;
  const live = new ChurnMap<string, Live>();
  const finishedTraces = new Map<string, DecisionTrace[]>();
  let order = 0;
  // Every request actor is a member of this group: one actor system for all of them, supervised through it.
  const group = deps.runtime.group('requests');

  // Provided once: providing per request would rebuild the machine for every request.
  const machine = requestMachine.provide({
    actions: {
      reportOutcome: ({ context }) => {
        const l = live.get(context.id);
        if (l) finish(l, context);
      },
      armDeadline: ({ context, self }) => armWait(deps.deadlines, live.get(context.id), context.deadlineAt, self),
    },
  });
  // The same machine compiled flat: what request actors run unless every event must go through XState's interpreter.
  const flat = compileFlatMachine<RequestContext, RequestEvent>(machine, deps.flatMutation);

  const addTrace = (l: Live, t: DecisionTrace): void => {
    if (l.traces.length < MAX_TRACES) l.traces.push(t);
  };

  const markScheduled = (l: Live, t: number): void => {
    if (l.firstScheduledAt >= 0) return;
    l.firstScheduledAt = t;
    deps.scheduled(l, t);
  };

  // A sequence's listener is its model's (and whether its client takes tokens): a token then touches only the
  // sequence, not the request (what the request has streamed is its sequence's `generated`; see streamedOf).
  const listeners = new Map<string, SequenceListener>();
  const listenerOf = (model: string, streams: boolean): SequenceListener => {
    const key = streams ? `${model}\u0000streams` : model;
    let x = listeners.get(key);
    if (!x) listeners.set(key, (x = sequenceListener(model, streams, markScheduled, deps.collector, deliver)));
    return x;
  };

  const { fail, contain, deliver } = failingAlone(deps, live);

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
      listener: listenerOf(l.model, l.streams),
      owner: ownerKey(l.model, l.version),
      tag: l,
      ...(l.tokens ? { tokens: l.tokens } : {}),
      ...(l.hashes ? { hashes: l.hashes } : {}),
    });
    l.seq = seq;
    return seq;
  };

  const finish = (l: Live, c: RequestContext): void => {
    const outcome = c.outcome ?? 'failed';
    l.disarm?.();
    live.delete(l.id);
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
      tokens: streamedOf(l),
      budgetMs: l.budgetMs,
      resumes: c.resumes,
      preemptions: c.preemptions,
      ...(l.hashes ? { promptTokens: l.spec.promptTokens, cachedTokens: l.cachedTokens ?? 0 } : {}),
    });
    try {
      l.listener?.terminal?.(l.id, {
        outcome,
        code: c.code,
        message: c.message,
        tokens: streamedOf(l),
        ...(l.retryAfterMs !== undefined ? { retryAfterMs: l.retryAfterMs } : {}),
        timings: { receivedAt: l.receivedAt, firstTokenAt: c.firstTokenAt, finishedAt },
      });
    } catch (e) {
      // The request has ended and released what it held: only telling its client failed.
      deps.log?.(`request ${l.id}: delivering its end failed: ${contained(e)}`);
    }
    if (live.size === 0) deps.onIdle?.();
  };

  return {
    get: (id) => live.get(id),
    has: (id) => live.has(id),
    get size() {
      return live.size;
    },
    start: (rec, resume, admitted) => {
      // Admitted at once, the actor starts where `request.admitted` leads (one macrostep less per request) and its
      // deadline is armed here, as that state's entry would; an inspector (or the reference run) sees the event.
      const reference = deps.runtime.stepByStep();
      const direct = admitted !== undefined && !reference;
      const actor = createRequestActor(
        reference ? machine : flat,
        group.parent,
        rec,
        resume,
        direct ? admitted : undefined,
      );
      const l = liveOf(rec, actor);
      live.set(l.id, l);
      group.add(l.id, actor);
      actor.start();
      if (direct) armWait(deps.deadlines, l, actor.getSnapshot().context.deadlineAt, actor);
      else if (admitted) actor.send({ type: 'request.admitted', replica: admitted.replica, t: admitted.t });
      return l;
    },
    addTrace,
    markScheduled,
    newSequence,
    deliver,
    contain,
    cancel: (id) => {
      const l = live.get(id);
      if (!l) return false;
      l.actor.send({ type: 'request.cancel', t: clock.now() });
      return true;
    },
    fail,
    progress: (id) => {
      const l = live.get(id);
      return l ? { tokens: streamedOf(l), firstTokenAt: l.actor.getSnapshot().context.firstTokenAt } : null;
    },
    explain: (id) => live.get(id)?.traces ?? finishedTraces.get(id),
  };
}
