// Cached pure transitions of a machine, and what a snapshot can still do (timers it waits for, events it may handle).
import {
  createActor,
  type ActorScope,
  type AnyEventObject,
  type AnyMachineSnapshot,
  type AnyStateMachine,
} from 'xstate';

/** An action a transition returns to be executed (never executed here). */
export type Action = { type: string; params?: unknown; info?: { context?: unknown } };

/** A machine's transition function with every (snapshot, event) pair computed once. */
export interface PureStepper {
  step(snapshot: AnyMachineSnapshot, event: AnyEventObject): [AnyMachineSnapshot, Action[]];
  /** Distinct (snapshot, event) pairs computed so far. */
  readonly size: number;
}

type AnyScope = ActorScope<AnyMachineSnapshot, AnyEventObject>;
type Node = {
  parent?: Node;
  states: Record<string, Node>;
  transitions: Map<string, { target?: Node[] }[]>;
  always?: { target?: Node[] }[];
};
const nodesOf = (s: AnyMachineSnapshot): Node[] => (s as unknown as { _nodes: Node[] })._nodes;

/**
 * Creates a cached stepper. It does what xstate's `transition()` does, but with one inert actor scope for the machine
 * instead of a new actor per call (building that actor dominated the model checker's run). Equal (value, status,
 * context) means an equal future, so snapshots are interned by those and transitions cached by (snapshot, event).
 */
export function pureStepper(machine: AnyStateMachine, input: unknown): PureStepper {
  const self = createActor(machine, { input });
  const collected: Action[] = [];
  const noop = (): void => {};
  const scope = {
    self,
    id: '',
    sessionId: '',
    logger: noop,
    defer: noop,
    stopChild: noop,
    emit: noop,
    system: self.system,
    actionExecutor: (a: Action) => collected.push(a),
  };
  const ids = new Map<string, number>();
  const idOf = new WeakMap<object, number>();
  const eventJson = new WeakMap<object, string>();
  const cache = new Map<string, [AnyMachineSnapshot, Action[]]>();
  const intern = (s: AnyMachineSnapshot): number => {
    let id = idOf.get(s);
    if (id === undefined) {
      const k = JSON.stringify([s.value, s.status, s.context]);
      id = ids.get(k);
      if (id === undefined) ids.set(k, (id = ids.size));
      idOf.set(s, id);
    }
    return id;
  };
  return {
    step: (s, e) => {
      let ej = eventJson.get(e);
      if (ej === undefined) eventJson.set(e, (ej = JSON.stringify(e)));
      const k = `${intern(s)}|${ej}`;
      let hit = cache.get(k);
      if (!hit) {
        collected.length = 0;
        const next = machine.transition(s, e, scope as unknown as AnyScope) as AnyMachineSnapshot;
        hit = [next, [...collected]];
        cache.set(k, hit);
      }
      return hit;
    },
    get size() {
      return cache.size;
    },
  };
}

/** The delayed (`after`) events the active states of a snapshot wait for. */
export function pendingTimers(s: AnyMachineSnapshot): string[] {
  if (s.status !== 'active') return [];
  const out: string[] = [];
  for (const node of nodesOf(s))
    for (const type of node.transitions.keys()) if (type.startsWith('xstate.after.')) out.push(type);
  return out;
}

const liveCache = new WeakMap<object, Set<string>>();

/**
 * The event types a snapshot may still handle: those of every state it may yet enter (the active ones, then every
 * declared target, with its descendants, of a transition of such a state or of its ancestors) and their ancestors.
 * An over-approximation from the machine's declared structure: an event type outside it is ignored from now on.
 */
export function liveEventTypes(s: AnyMachineSnapshot): Set<string> {
  let set = liveCache.get(s);
  if (set) return set;
  const seen = new Set<Node>();
  const work: Node[] = [];
  const enter = (n: Node): void => {
    if (seen.has(n)) return;
    seen.add(n);
    work.push(n);
    for (const c of Object.values(n.states)) enter(c);
  };
  for (const n of nodesOf(s)) if (Object.keys(n.states).length === 0) enter(n);
  set = new Set<string>();
  while (work.length > 0) {
    for (let n: Node | undefined = work.pop(); n; n = n.parent) {
      for (const [type, list] of n.transitions) {
        set.add(type);
        for (const t of list) for (const target of t.target ?? []) enter(target);
      }
      for (const t of n.always ?? []) for (const target of t.target ?? []) enter(target);
    }
  }
  liveCache.set(s, set);
  return set;
}
