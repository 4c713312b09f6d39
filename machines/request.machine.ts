// One inference request: admission, queueing with a hard budget, execution, and exactly one terminal outcome.
import { assign, emit, setup } from 'xstate';
import type { OutEvent } from './messages.ts';
import type { OutcomeCode } from './outcomes.ts';

/** Terminal outcomes a request can end with. */
export type RequestOutcome = 'done' | 'cancelled' | 'expired' | 'rejected' | 'failed';

/** What a request is given and never changes: one object shared by every snapshot of its actor. */
export interface RequestLimits {
  receivedAt: number;
  /** The most a request may wait in a queue before its first token (ms). */
  queueBudgetMs: number;
  /** The most a request may wait to resume after an interruption (ms). */
  resumeBudgetMs: number;
  /** Interruptions it may resume from; the next one ends it. */
  maxResumes: number;
}

/**
 * Context of a request actor: budget, where it runs, what it has streamed and how it ended.
 *
 * Every assign copies the context (`Object.assign({}, context, update)`), and V8 turns an object built that way into
 * a slow dictionary once it has 20 properties: every later assign and read then costs ~15 µs instead of ~0.7 µs. So
 * what never changes lives in `limits`, and the context stays at 17 properties (test/machines holds it under 20).
 */
export interface RequestContext {
  id: string;
  model: string;
  priority: string;
  limits: RequestLimits;
  replica: string | null;
  /** When it entered its current wait (admission, or the preemption or interruption it resumes from). */
  queuedAt: number;
  scheduledAt: number;
  firstTokenAt: number;
  finishedAt: number;
  tokens: number;
  resumes: number;
  preemptions: number;
  code: OutcomeCode | null;
  message: string | null;
  /** The code a requeued request ends with if it cannot resume in time. */
  requeueCode: OutcomeCode;
  /** When the current wait ends the request (absolute ms): the queue budget, or the resume budget after an interruption. */
  deadlineAt: number;
  outcome: RequestOutcome | null;
}

/** Input to create a request actor. */
export interface RequestInput {
  id: string;
  model: string;
  priority: string;
  receivedAt: number;
  queueBudgetMs: number;
  resumeBudgetMs?: number;
  maxResumes?: number;
}

/** Events a request hears: only changes of state (scheduled, first token, preempted, resumed, finished), never
 * individual tokens. */
export type RequestEvent =
  | { type: 'request.admitted'; replica: string; t: number }
  | { type: 'request.rejected'; code: OutcomeCode; message: string; t: number }
  /** Its first prefill chunk is in the step being dispatched (a batcher schedules a request no earlier). */
  | { type: 'request.scheduled'; replica: string; t: number }
  | { type: 'request.deadline'; at: number }
  | { type: 'request.firstToken'; t: number }
  | { type: 'request.preempted'; t: number }
  | { type: 'request.interrupted'; code: OutcomeCode; message: string; tokens: number; t: number }
  | { type: 'request.requeued'; replica: string; t: number }
  | { type: 'request.finished'; tokens: number; t: number }
  | { type: 'request.failed'; code: OutcomeCode; message: string; tokens: number; t: number }
  | { type: 'request.cancel'; t: number };

/** What a finished request reports. */
export interface RequestOutput {
  id: string;
  outcome: RequestOutcome;
  code: OutcomeCode | null;
  tokens: number;
}

/** The state a request actor starts in. */
export const REQUEST_INITIAL_STATE = 'received';

/** The state `request.admitted` leads to from the initial state. */
export const REQUEST_ADMITTED_STATE = 'queued';

/** What `request.admitted` assigns: the replica (or holding queue) it waits in, and since when. */
const admittedFields = (event: { replica: string; t: number }): Pick<RequestContext, 'replica' | 'queuedAt'> => ({
  replica: event.replica,
  queuedAt: event.t,
});

/** The context of a request actor admitted at once: its initial context as `request.admitted` leaves it (what a
 * request table starts an admitted request's actor from, instead of sending it `request.admitted`). */
export function admittedRequestContext(input: RequestInput, admitted: { replica: string; t: number }): RequestContext {
  return Object.assign(initialRequestContext(input), admittedFields(admitted));
}

/** The context a request actor starts with (the machine's own `context`; also what a request table starts an actor
 * from, without running the machine's initial transition: see actors/control/request-table.ts). */
export function initialRequestContext(input: RequestInput): RequestContext {
  return {
    id: input.id,
    model: input.model,
    priority: input.priority,
    limits: {
      receivedAt: input.receivedAt,
      queueBudgetMs: input.queueBudgetMs,
      resumeBudgetMs: input.resumeBudgetMs ?? input.queueBudgetMs,
      maxResumes: input.maxResumes ?? 1,
    },
    replica: null,
    queuedAt: input.receivedAt,
    scheduledAt: -1,
    firstTokenAt: -1,
    finishedAt: -1,
    tokens: 0,
    resumes: 0,
    preemptions: 0,
    code: null,
    message: null,
    requeueCode: 'expired',
    deadlineAt: input.receivedAt + input.queueBudgetMs,
    outcome: null,
  };
}

/** The request machine: received → queued (admitted) or rejected → prefilling (scheduled) → decoding → terminal;
 * requeued on a resumable failure. */
export const requestMachine = setup({
  types: {
    context: {} as RequestContext,
    input: {} as RequestInput,
    events: {} as RequestEvent,
    emitted: {} as OutEvent,
    output: {} as RequestOutput,
  },
  actions: {
    /** Reports the terminal outcome (to metrics, the client stream and the report). */
    reportOutcome: () => {},
    /** Records a failure's code, message, the tokens the client has, and when it ended. */
    recordFailure: assign(({ context, event }) =>
      event.type === 'request.failed' || event.type === 'request.interrupted'
        ? { code: event.code, message: event.message, tokens: event.tokens, finishedAt: event.t, outcome: 'failed' }
        : context,
    ),
    /** Arms a timer that sends `request.deadline` with `at = context.deadlineAt` (one wheel for all requests). */
    armDeadline: () => {},
    /** Tells the replica (or router) holding it in a queue to forget it. */
    withdraw: emit(({ context }) => ({
      type: 'out' as const,
      to: context.replica ?? 'router',
      msg: { type: 'request.withdraw', id: context.id },
    })),
  },
  guards: {
    canResume: ({ context }) => context.resumes < context.limits.maxResumes,
    /** The deadline that fired is the current one (an older one may fire after the request moved on). */
    currentDeadline: ({ context, event }) => event.type === 'request.deadline' && event.at === context.deadlineAt,
  },
}).createMachine({
  id: 'request',
  context: ({ input }) => initialRequestContext(input),
  initial: REQUEST_INITIAL_STATE,
  states: {
    received: {
      on: {
        // Admission queues the request at once (no transient `admitted` state: one microstep less per request).
        'request.admitted': {
          target: REQUEST_ADMITTED_STATE,
          actions: assign(({ event }) => admittedFields(event)),
        },
        'request.rejected': {
          target: 'rejected',
          actions: assign({
            code: ({ event }) => event.code,
            message: ({ event }) => event.message,
            finishedAt: ({ event }) => event.t,
            outcome: 'rejected',
          }),
        },
      },
    },
    queued: {
      tags: ['waiting', 'cancellable'],
      // The budget counts from receipt: deadlineAt = receivedAt + queue budget (the smaller of class and client).
      entry: 'armDeadline',
      on: {
        'request.scheduled': {
          target: 'prefilling',
          actions: assign({ scheduledAt: ({ event }) => event.t, replica: ({ event }) => event.replica }),
        },
        'request.deadline': {
          guard: 'currentDeadline',
          target: 'expired',
          actions: [
            assign({ code: 'expired', message: 'waited its whole queue budget', outcome: 'expired' }),
            'withdraw',
          ],
        },
        'request.cancel': {
          target: 'cancelled',
          actions: [assign({ code: 'cancelled', outcome: 'cancelled' }), 'withdraw'],
        },
        // A request held at the router until a replica was ready has now been handed to one.
        'request.requeued': { actions: assign({ replica: ({ event }) => event.replica }) },
      },
    },
    // Both batchers schedule a request in the step that dispatches its first prefill chunk (or its batch), so
    // `request.scheduled` leads straight to `prefilling`: there is no separate "prefill started" to hear.
    prefilling: {
      tags: ['running', 'cancellable'],
      on: {
        'request.firstToken': {
          target: 'decoding',
          actions: assign({
            firstTokenAt: ({ context, event }) => (context.firstTokenAt < 0 ? event.t : context.firstTokenAt),
          }),
        },
        'request.preempted': {
          target: 'requeued',
          actions: assign({
            preemptions: ({ context }) => context.preemptions + 1,
            queuedAt: ({ event }) => event.t,
            requeueCode: 'expired',
          }),
        },
      },
    },
    decoding: {
      tags: ['running', 'cancellable', 'streaming'],
      on: {
        'request.finished': {
          target: 'done',
          actions: assign({ tokens: ({ event }) => event.tokens, finishedAt: ({ event }) => event.t, outcome: 'done' }),
        },
        'request.preempted': {
          target: 'requeued',
          actions: assign({
            preemptions: ({ context }) => context.preemptions + 1,
            queuedAt: ({ event }) => event.t,
            requeueCode: 'expired',
          }),
        },
      },
    },
    requeued: {
      tags: ['waiting', 'cancellable'],
      // A request that was never scheduled keeps its queue deadline (and expires, if it must, as `expired`);
      // one that was already running gets the resume budget from now.
      entry: [
        assign({
          deadlineAt: ({ context }) =>
            context.scheduledAt < 0
              ? context.limits.receivedAt + context.limits.queueBudgetMs
              : context.queuedAt + context.limits.resumeBudgetMs,
          requeueCode: ({ context }) => (context.scheduledAt < 0 ? 'expired' : context.requeueCode),
        }),
        'armDeadline',
      ],
      on: {
        'request.requeued': { actions: assign({ replica: ({ event }) => event.replica }) },
        'request.scheduled': {
          target: 'prefilling',
          actions: assign({ replica: ({ event }) => event.replica }),
        },
        'request.deadline': {
          guard: 'currentDeadline',
          target: 'failed',
          actions: [
            assign({
              code: ({ context }) => context.requeueCode,
              message: 'could not resume within its budget',
              outcome: 'failed',
            }),
            'withdraw',
          ],
        },
        'request.cancel': {
          target: 'cancelled',
          actions: [assign({ code: 'cancelled', outcome: 'cancelled' }), 'withdraw'],
        },
      },
    },
    // Each transition into a terminal state sets `outcome` in its own assign (an entry assign would copy the context
    // once more per request).
    done: { type: 'final', tags: ['terminal'], entry: 'reportOutcome' },
    cancelled: { type: 'final', tags: ['terminal'], entry: 'reportOutcome' },
    expired: { type: 'final', tags: ['terminal'], entry: 'reportOutcome' },
    rejected: { type: 'final', tags: ['terminal'], entry: 'reportOutcome' },
    failed: { type: 'final', tags: ['terminal'], entry: 'reportOutcome' },
  },
  on: {
    // An interruption (replica failed, drained past its deadline) resumes elsewhere if the budget allows, else fails.
    'request.interrupted': [
      {
        guard: 'canResume',
        target: '.requeued',
        actions: assign({
          resumes: ({ context }) => context.resumes + 1,
          tokens: ({ event }) => event.tokens,
          replica: null,
          queuedAt: ({ event }) => event.t,
          requeueCode: ({ event }) => event.code,
        }),
      },
      {
        target: '.failed',
        actions: 'recordFailure',
      },
    ],
    'request.failed': {
      target: '.failed',
      actions: 'recordFailure',
    },
    'request.cancel': {
      target: '.cancelled',
      actions: [assign({ code: 'cancelled', finishedAt: ({ event }) => event.t, outcome: 'cancelled' }), 'withdraw'],
    },
  },
  output: ({ context }) => ({
    id: context.id,
    outcome: context.outcome ?? 'failed',
    code: context.code,
    tokens: context.tokens,
  }),
});
