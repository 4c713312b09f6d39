// A flat XState machine compiled to actor logic: the same states, transitions, guards, actions and output, looked up
// in tables built once from the machine's own definition instead of interpreted per event.
import type { ActorLogic, ActorScope, ActorSystem, AnyActorRef, AnyStateMachine, EventObject, Snapshot } from 'xstate';

/**
 * Why: XState's interpreter is general (nested and parallel states, history, eventless transitions), and it pays for
 * that on every event. A request's machine is flat, and as a bare actor the interpreter costs it about 100 µs of CPU
 * per life here, against under 15 µs for XState's actor (mailbox, system, observers, inspection) around a logic that
 * does nothing. The compiled logic runs inside that same actor (`createActor`), so the actor, its system, its
 * supervision and its inspection are XState's; only the machine's interpretation is replaced, and only for machines
 * whose every feature is listed below (`compileFlatMachine` refuses any other). test/runtime/flat-machine.test.ts
 * runs both on the same event sequences and compares every snapshot, action and emitted event.
 *
 * Supported: a root with atomic and final child states; transitions on exact event types (on a state, or on the
 * root), with a guard given by name or inline, an optional target among the root's children, and actions; entry
 * and exit actions; tags; the root's output. Actions: named or inline functions, `assign` and `emit`.
 */

/** A snapshot of a flat machine: what a machine snapshot of the same state carries, for the same reads. */
export type FlatSnapshot<TContext> = Snapshot<unknown> & FlatState<TContext>;

/** What a flat machine's snapshot has besides its status, output and error. */
interface FlatState<TContext> {
  readonly value: string;
  readonly context: TContext;
  readonly tags: ReadonlySet<string>;
  readonly children: Record<string, never>;
  readonly historyValue: Record<string, never>;
  matches(value: string): boolean;
  hasTag(tag: string): boolean;
  toJSON(): object;
}

/** The compiled logic: XState actor logic (pass it to `createActor`), named by the machine's id. */
export type FlatMachineLogic<TContext, TEvent extends EventObject> = ActorLogic<
  FlatSnapshot<TContext>,
  TEvent,
  unknown,
  ActorSystem<any>,
  EventObject
> & { readonly id: string };

type Scope = ActorScope<any, any, any, any>;
type Ctx = Record<string, unknown>;
type Args = { context: Ctx; event: EventObject; self: AnyActorRef; system: unknown };
type Fn = (args: any, params: unknown) => unknown;

/** One action, resolved when the machine is compiled. */
type Action =
  /** An assign by a function, or by property (each key's assigner or value, listed once). */
  | { kind: 'assign'; assignment: Fn | readonly (readonly [string, unknown])[] }
  | { kind: 'emit'; event: Fn | EventObject }
  | { kind: 'custom'; type: string; exec: Fn | undefined; params: unknown };

/** One transition: a guard, actions, and (if it has one) the state it enters. */
interface Transition {
  guard: ((args: { context: Ctx; event: EventObject }) => boolean) | null;
  actions: Action[];
  target: State | null;
}

/** One state of the machine, with what every snapshot in it shares. */
interface State {
  key: string;
  final: boolean;
  entry: Action[];
  exit: Action[];
  tags: ReadonlySet<string>;
  on: Map<string, Transition[]>;
}

/** Thrown at compile time when a machine uses what a flat machine does not support. */
function unsupported(machine: AnyStateMachine, what: string): Error {
  return new Error(`machine '${machine.id}' cannot be compiled flat: ${what}`);
}

const ERROR_EVENT = 'xstate.error.actor';
const STOP_EVENT = 'xstate.stop';

/** Resolves a machine's action items as XState does per event, once. */
function compileActions(machine: AnyStateMachine, items: readonly unknown[], where: string): Action[] {
  const impls = machine.implementations.actions as Record<string, unknown>;
  return items.map((item): Action => {
    const named =
      typeof item === 'string'
        ? item
        : typeof item === 'object' && item !== null
          ? (item as { type: string }).type
          : null;
    const params = typeof item === 'object' && item !== null ? (item as { params?: unknown }).params : undefined;
    const resolved = (named !== null ? impls[named] : item) as (Fn & Record<string, unknown>) | undefined;
    if (resolved && 'resolve' in resolved) {
      if (resolved['type'] === 'xstate.assign') {
        if (params !== undefined) throw unsupported(machine, `${where}: an assign with params`);
        const assignment = resolved['assignment'] as Fn | Record<string, unknown>;
        return {
          kind: 'assign',
          assignment: typeof assignment === 'function' ? assignment : Object.entries(assignment),
        };
      }
      if (resolved['type'] === 'xstate.emit') {
        if (params !== undefined) throw unsupported(machine, `${where}: an emit with params`);
        return { kind: 'emit', event: resolved['event'] as Fn | EventObject };
      }
      throw unsupported(machine, `${where}: built-in action ${String(resolved['type'])}`);
    }
    if (typeof params === 'function') throw unsupported(machine, `${where}: action params given as a function`);
    const type = named ?? ((resolved as Fn | undefined)?.name || '(anonymous)');
    return { kind: 'custom', type, exec: resolved, params };
  });
}

/** Resolves a transition's guard to a function of its arguments. */
function compileGuard(machine: AnyStateMachine, guard: unknown, where: string): Transition['guard'] {
  if (guard === undefined) return null;
  const impls = machine.implementations.guards as Record<string, unknown>;
  const resolved = typeof guard === 'string' ? impls[guard] : guard;
  if (typeof resolved !== 'function' || 'check' in resolved)
    throw unsupported(machine, `${where}: guard ${String(guard)}`);
  return resolved as Transition['guard'];
}

/** Runs actions as XState's interpreter does: assigns update the context in order; an emit and a custom action go
 * through the actor's action executor (an emit's event is delivered after the snapshot is updated). */
function run(actions: readonly Action[], context: Ctx, event: EventObject, scope: Scope, spawn: () => never): Ctx {
  for (const a of actions) {
    if (a.kind === 'assign') {
      const assignArgs = { context, event, spawn, self: scope.self, system: scope.system };
      let partial: Record<string, unknown>;
      if (typeof a.assignment === 'function') {
        partial = a.assignment(assignArgs, undefined) as Ctx;
      } else {
        partial = {};
        for (const [key, p] of a.assignment)
          partial[key] = typeof p === 'function' ? (p as Fn)(assignArgs, undefined) : p;
      }
      context = Object.assign({}, context, partial);
    } else if (a.kind === 'emit') {
      const args: Args = { context, event, self: scope.self, system: scope.system };
      const emitted = (typeof a.event === 'function' ? a.event(args, undefined) : a.event) as EventObject;
      scope.actionExecutor({
        type: 'xstate.emit',
        info: args as never,
        params: { event: emitted },
        exec: () => scope.defer(() => scope.emit(emitted)),
      });
    } else {
      const args: Args = { context, event, self: scope.self, system: scope.system };
      scope.actionExecutor({ type: a.type, info: args as never, params: a.params as never, exec: a.exec as never });
    }
  }
  return context;
}

/** A flat machine's tables: its states with their transitions, the root's transitions, how it starts and ends. */
function compileTables(machine: AnyStateMachine) {
  const root = machine.root;
  if (root.type !== 'compound') throw unsupported(machine, 'its root has no child states');
  if (root.always || Object.keys(root.after).length > 0 || root.invoke.length > 0 || root.exit.length > 0)
    throw unsupported(machine, 'its root has eventless, delayed or invoked transitions, or exit actions');

  const states = new Map<string, State>();
  for (const [key, node] of Object.entries(root.states)) {
    if (node.type !== 'atomic' && node.type !== 'final') throw unsupported(machine, `state ${key} is ${node.type}`);
    if (node.always || Object.keys(node.after).length > 0 || node.invoke.length > 0)
      throw unsupported(machine, `state ${key} has eventless, delayed or invoked transitions`);
    states.set(key, {
      key,
      final: node.type === 'final',
      entry: compileActions(machine, node.entry, `${key}.entry`),
      exit: compileActions(machine, node.exit, `${key}.exit`),
      tags: new Set(node.tags),
      on: new Map(),
    });
  }
  const compileOn = (node: typeof root, into: Map<string, Transition[]>, where: string): void => {
    const self = node === root ? null : states.get(node.key)!;
    for (const [type, list] of node.transitions) {
      if (type === '*' || type.endsWith('.*')) throw unsupported(machine, `${where}: wildcard event ${type}`);
      into.set(
        type,
        list.map((t) => {
          const targets = (t.target ?? []) as readonly { key: string; parent?: unknown }[];
          if (targets.length > 1 || (targets[0] && targets[0].parent !== root))
            throw unsupported(machine, `${where} on ${type}: a target that is not one of the root's states`);
          return {
            guard: compileGuard(machine, t.guard, `${where} on ${type}`),
            actions: compileActions(machine, t.actions, `${where} on ${type}`),
            // A state's own transition back to itself, unless told to reenter, stays in it as a targetless one
            // would: nothing exits or enters (a root's transition to its current state exits and reenters it).
            target:
              !targets[0] || (states.get(targets[0].key) === self && !t.reenter) ? null : states.get(targets[0].key)!,
          };
        }),
      );
    }
  };
  for (const [key, node] of Object.entries(root.states)) compileOn(node, states.get(key)!.on, key);
  const rootOn = new Map<string, Transition[]>();
  compileOn(root, rootOn, 'root');

  const initial = root.initial;
  if (initial.target.length !== 1) throw unsupported(machine, 'its initial transition has no single target');
  const initialState = states.get(initial.target[0]!.key)!;
  const initialActions = [
    ...compileActions(machine, root.entry, 'root.entry'),
    ...compileActions(machine, initial.actions, 'root.initial'),
  ];
  const output = root.output as unknown;
  if (output !== undefined && typeof output !== 'function') throw unsupported(machine, 'its output is not a function');
  const outputOf = output as ((args: { context: Ctx; event: EventObject; self: AnyActorRef }) => unknown) | undefined;
  const doneEventType = `xstate.done.state.${root.id}`;

  return { states, rootOn, initialState, initialActions, outputOf, doneEventType };
}

/** Compiles a flat machine (see above) to XState actor logic that behaves as XState's interpreter of it. */
export function compileFlatMachine<TContext, TEvent extends EventObject>(
  machine: AnyStateMachine,
  /** A deliberate defect for mutation tests (the DST shows its properties catch it): transitions defined on the
   * root are ignored. Never set outside tests and the DST. */
  mutation?: 'drop-root-transitions',
): FlatMachineLogic<TContext, TEvent> {
  const {
    states,
    rootOn: compiledRootOn,
    initialState,
    initialActions,
    outputOf,
    doneEventType,
  } = compileTables(machine);
  const rootOn = mutation === 'drop-root-transitions' ? new Map<string, Transition[]>() : compiledRootOn;
  const spawn = (): never => {
    throw unsupported(machine, 'spawn in an assign');
  };

  const snapshotOf = (
    state: State,
    context: Ctx,
    status: 'active' | 'done' | 'error' | 'stopped',
    out: unknown,
    error: unknown,
  ): FlatSnapshot<TContext> =>
    ({
      status,
      output: out,
      error,
      value: state.key,
      context: context as TContext,
      tags: state.tags,
      children: EMPTY,
      historyValue: EMPTY,
      matches,
      hasTag,
      toJSON,
    }) as FlatSnapshot<TContext>;

  /** Enters `state` (its entry actions; a final state ends the machine: its exit actions, then its output). */
  const enter = (state: State, context: Ctx, event: EventObject, scope: Scope): FlatSnapshot<TContext> => {
    context = run(state.entry, context, event, scope, spawn);
    if (!state.final) return snapshotOf(state, context, 'active', undefined, undefined);
    context = run(state.exit, context, event, scope, spawn);
    const done = { type: doneEventType, output: undefined };
    const out = outputOf ? outputOf({ context, event: done, self: scope.self }) : undefined;
    return snapshotOf(state, context, 'done', out, undefined);
  };

  const select = (list: Transition[] | undefined, context: Ctx, event: EventObject): Transition | null => {
    if (!list) return null;
    for (const t of list) if (!t.guard || t.guard({ context, event })) return t;
    return null;
  };

  return {
    id: machine.id,
    config: machine.config,
    transition: (snapshot, event, scope) => {
      if (snapshot.status !== 'active') return snapshot;
      if (event.type === STOP_EVENT)
        return snapshotOf(states.get(snapshot.value)!, snapshot.context as Ctx, 'stopped', undefined, undefined);
      const state = states.get(snapshot.value)!;
      const context = snapshot.context as Ctx;
      const t = select(state.on.get(event.type), context, event) ?? select(rootOn.get(event.type), context, event);
      if (t === null) {
        // As XState does: an actor's failure that no transition handles fails this actor too.
        if (event.type.startsWith(ERROR_EVENT))
          return snapshotOf(state, context, 'error', undefined, (event as EventObject & { error?: unknown }).error);
        return snapshot;
      }
      if (t.target === null) {
        const next = run(t.actions, context, event, scope, spawn);
        return next === context ? snapshot : snapshotOf(state, next, 'active', undefined, undefined);
      }
      const left = run(state.exit, context, event, scope, spawn);
      return enter(t.target, run(t.actions, left, event, scope, spawn), event, scope);
    },
    getInitialSnapshot: (scope, input) => {
      const config = machine.config.context as unknown;
      const context = (
        typeof config === 'function' ? (config as Fn)({ spawn, input, self: scope.self }, undefined) : (config ?? {})
      ) as Ctx;
      const init = { type: 'xstate.init', input } as EventObject;
      try {
        return enter(initialState, run(initialActions, context, init, scope, spawn), init, scope);
      } catch (error) {
        // As XState's machine does: a throw while starting is the actor's error, not the caller's.
        return snapshotOf(initialState, context, 'error', undefined, error);
      }
    },
    restoreSnapshot: (persisted) => {
      const p = persisted as Snapshot<unknown> & { value: string; context: Ctx };
      const state = states.get(p.value);
      if (!state) throw new Error(`machine '${machine.id}' has no state ${JSON.stringify(p.value)}`);
      return snapshotOf(state, p.context, p.status, p.output, 'error' in p ? p.error : undefined);
    },
    getPersistedSnapshot: (s) =>
      ({
        status: s.status,
        output: s.output,
        error: s.error,
        value: s.value,
        context: s.context,
        children: {},
        historyValue: {},
      }) as Snapshot<unknown>,
  };
}

const EMPTY: Record<string, never> = Object.freeze({}) as Record<string, never>;

function matches(this: FlatSnapshot<unknown>, value: string): boolean {
  return this.value === value;
}

function hasTag(this: FlatSnapshot<unknown>, tag: string): boolean {
  return this.tags.has(tag);
}

function toJSON(this: FlatSnapshot<unknown>): object {
  return {
    status: this.status,
    output: this.output,
    error: this.error,
    value: this.value,
    context: this.context,
    children: {},
    historyValue: {},
    tags: [...this.tags],
  };
}
