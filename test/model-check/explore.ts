// A small explicit-state explorer over a machine's pure transition function: BFS over abstracted snapshots,
// with coverage of the declared states and transitions, dead ends and traps.
import {
  getInitialMicrosteps,
  getMicrosteps,
  transition,
  type AnyMachineSnapshot,
  type AnyStateMachine,
  type AnyEventObject,
} from 'xstate';

/** How to explore one machine: its input, the events to try in a snapshot, and what of the context matters. */
export interface ExploreSpec {
  machine: AnyStateMachine;
  input: unknown;
  /** The events to try in a snapshot (payloads may be derived from its context: current and stale epochs, ...). */
  events(snapshot: AnyMachineSnapshot): AnyEventObject[];
  /** Context fields left out of a state's identity: timestamps and counters that no guard compares except to event data derived from them. */
  ignore?: readonly string[];
  /** States every state must be able to reach again (default: the final states, when the machine has any). */
  home?(snapshot: AnyMachineSnapshot): boolean;
  /** Stops with an error past this many states (the abstraction must keep the space finite). */
  maxStates?: number;
}

/** One explored edge: the event that leads from one state key to another. */
export interface Edge {
  from: string;
  event: AnyEventObject;
  to: string;
}

/** What an exploration found. */
export interface ExploreReport {
  states: number;
  /** Edges that change the state (events that are ignored or loop back to the same state are not counted). */
  transitions: number;
  declaredStates: number;
  declaredTransitions: number;
  /** Non-final states in which no event of the alphabet leads anywhere else. */
  deadEnds: string[];
  /** States from which no home state (by default a final state) can be reached. */
  trapped: string[];
  /** Declared state nodes never entered, even transiently. */
  unreachableStates: string[];
  /** Declared transitions (`source#event#index`) never taken. */
  unreachableTransitions: string[];
  /** A shortest event path from the initial snapshot to every explored state. */
  pathTo(key: string): AnyEventObject[];
  edges: readonly Edge[];
  /** Every explored snapshot by its key. */
  snapshots: ReadonlyMap<string, AnyMachineSnapshot>;
}

type StateNodeLike = {
  id: string;
  type: string;
  states: Record<string, StateNodeLike>;
  transitions: Map<string, TransitionLike[]>;
  always?: TransitionLike[];
  parent?: StateNodeLike;
};
type TransitionLike = { source: StateNodeLike; eventType: string; guard?: unknown };
type TransitionData = { getTransitionData(s: AnyMachineSnapshot, e: AnyEventObject): TransitionLike[] };
type GuardImpl = (args: { context: unknown; event: AnyEventObject }, params: unknown) => boolean;

/** The identity of a snapshot: its state value, status and context minus the ignored fields. */
export function snapshotKey(snapshot: AnyMachineSnapshot, ignore: readonly string[] = []): string {
  const context: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(snapshot.context as Record<string, unknown>))
    if (!ignore.includes(k)) context[k] = v;
  return JSON.stringify({ value: snapshot.value, status: snapshot.status, context });
}

/** Every state node of a machine below its root, in document order. */
export function declaredStateNodes(machine: AnyStateMachine): StateNodeLike[] {
  const out: StateNodeLike[] = [];
  const walk = (n: StateNodeLike): void => {
    for (const c of Object.values(n.states)) {
      out.push(c);
      walk(c);
    }
  };
  walk(machine.root as unknown as StateNodeLike);
  return out;
}

/** Every transition a machine declares, with the stable name `source#event#index` (eventless ones use `always`). */
export function declaredTransitions(machine: AnyStateMachine): Map<TransitionLike, string> {
  const out = new Map<TransitionLike, string>();
  for (const n of [machine.root as unknown as StateNodeLike, ...declaredStateNodes(machine)]) {
    for (const [type, list] of n.transitions) list.forEach((t, i) => out.set(t, `${n.id}#${type}#${i}`));
    (n.always ?? []).forEach((t, i) => out.set(t, `${n.id}#always#${i}`));
  }
  return out;
}

/** The delayed (`after`) event types a machine declares: the explorer fires them like any other event. */
export function delayedEventTypes(machine: AnyStateMachine): string[] {
  const names = new Set<string>();
  for (const t of declaredTransitions(machine).keys())
    if (t.eventType.startsWith('xstate.after.')) names.add(t.eventType);
  return [...names];
}

// Eventless transitions do not show in getTransitionData: evaluate their (named or inline) guards the way XState does.
function guardPasses(
  machine: AnyStateMachine,
  t: TransitionLike,
  snapshot: AnyMachineSnapshot,
  event: AnyEventObject,
): boolean {
  const g = t.guard;
  if (g === undefined) return true;
  const guards = (machine.implementations.guards ?? {}) as Record<string, GuardImpl>;
  const args = { context: snapshot.context, event };
  if (typeof g === 'string') return call(guards[g], g, args, undefined);
  if (typeof g === 'function') return call(g as GuardImpl, 'inline', args, undefined);
  if (g && typeof g === 'object' && 'type' in g) {
    const ref = g as { type: string; params?: unknown };
    return call(guards[ref.type], ref.type, args, ref.params);
  }
  throw new Error(`unsupported guard on ${t.source.id}`);
}

function call(
  fn: GuardImpl | undefined,
  name: string,
  args: { context: unknown; event: AnyEventObject },
  params: unknown,
): boolean {
  if (typeof fn !== 'function' || 'check' in fn)
    throw new Error(`guard ${name} is not a plain guard the explorer can evaluate`);
  return fn(args, params);
}

// The eventless transitions a snapshot takes on its way to stability (one per atomic state, first passing guard wins).
function eventlessTaken(
  machine: AnyStateMachine,
  snapshot: AnyMachineSnapshot,
  event: AnyEventObject,
): TransitionLike[] {
  const taken: TransitionLike[] = [];
  const nodes = (snapshot as unknown as { _nodes: StateNodeLike[] })._nodes;
  for (const atomic of nodes.filter((n) => n.type === 'atomic' || n.type === 'final')) {
    search: for (let n: StateNodeLike | undefined = atomic; n; n = n.parent) {
      for (const t of n.always ?? []) {
        if (guardPasses(machine, t, snapshot, event)) {
          taken.push(t);
          break search;
        }
      }
    }
  }
  return taken;
}

function nodeIds(snapshot: AnyMachineSnapshot): string[] {
  return (snapshot as unknown as { _nodes: StateNodeLike[] })._nodes.map((n) => n.id);
}

/** Explores every state reachable under the alphabet and reports coverage, dead ends and traps. */
export function explore(spec: ExploreSpec): ExploreReport {
  const { machine } = spec;
  const ignore = spec.ignore ?? [];
  const maxStates = spec.maxStates ?? 100_000;
  const declared = declaredTransitions(machine);
  const allNodes = declaredStateNodes(machine);
  const hasFinal = Object.values((machine.root as unknown as StateNodeLike).states).some((n) => n.type === 'final');
  const home = spec.home ?? (hasFinal ? (s: AnyMachineSnapshot) => s.status === 'done' : null);
  const delayed = delayedEventTypes(machine).map((type) => ({ type }));

  const enteredNodes = new Set<string>();
  const takenTransitions = new Set<TransitionLike>();
  const snapshots = new Map<string, AnyMachineSnapshot>();
  const parent = new Map<string, { from: string; event: AnyEventObject } | null>();
  const edges: Edge[] = [];
  const outgoing = new Map<string, Set<string>>();

  // Records the transitions taken by one macrostep: the event's own, then one eventless step per later microstep.
  const cover = (
    before: AnyMachineSnapshot | null,
    event: AnyEventObject,
    micro: [AnyMachineSnapshot, unknown][],
  ): void => {
    if (before)
      for (const t of (machine as unknown as TransitionData).getTransitionData(before, event)) takenTransitions.add(t);
    for (const [snap] of micro) for (const id of nodeIds(snap)) enteredNodes.add(id);
    for (let i = 1; i < micro.length; i++)
      for (const t of eventlessTaken(machine, micro[i - 1]![0], event)) takenTransitions.add(t);
  };

  const initMicro = getInitialMicrosteps(machine, spec.input) as [AnyMachineSnapshot, unknown][];
  const first = initMicro[initMicro.length - 1]?.[0];
  if (!first) throw new Error('machine has no initial snapshot');
  cover(null, { type: 'xstate.init', input: spec.input } as AnyEventObject, initMicro);
  const firstKey = snapshotKey(first, ignore);
  snapshots.set(firstKey, first);
  parent.set(firstKey, null);
  const queue = [firstKey];

  for (let head = 0; head < queue.length; head++) {
    const key = queue[head]!;
    const snap = snapshots.get(key)!;
    const out = new Set<string>();
    outgoing.set(key, out);
    if (snap.status !== 'active') continue;
    for (const event of [...spec.events(snap), ...delayed]) {
      const micro = getMicrosteps(machine, snap, event) as [AnyMachineSnapshot, unknown][];
      if (micro.length === 0) continue;
      cover(snap, event, micro);
      const [next] = transition(machine, snap, event);
      const nextKey = snapshotKey(next, ignore);
      if (nextKey === key) continue;
      edges.push({ from: key, event, to: nextKey });
      out.add(nextKey);
      if (!snapshots.has(nextKey)) {
        if (snapshots.size >= maxStates)
          throw new Error(`more than ${maxStates} states: the abstraction is not finite`);
        snapshots.set(nextKey, next);
        parent.set(nextKey, { from: key, event });
        queue.push(nextKey);
      }
    }
  }

  const deadEnds = [...snapshots]
    .filter(([k, s]) => s.status === 'active' && (outgoing.get(k)?.size ?? 0) === 0)
    .map(([k]) => k);
  let trapped: string[] = [];
  if (home) {
    // Backward reachability from the home states over the explored edges.
    const incoming = new Map<string, string[]>();
    for (const e of edges) incoming.set(e.to, [...(incoming.get(e.to) ?? []), e.from]);
    const canReach = new Set([...snapshots].filter(([, s]) => home(s)).map(([k]) => k));
    const work = [...canReach];
    while (work.length > 0) {
      for (const p of incoming.get(work.pop()!) ?? []) if (!canReach.has(p)) (canReach.add(p), work.push(p));
    }
    trapped = [...snapshots.keys()].filter((k) => !canReach.has(k));
  }

  return {
    states: snapshots.size,
    transitions: edges.length,
    declaredStates: allNodes.length,
    declaredTransitions: declared.size,
    deadEnds,
    trapped,
    unreachableStates: allNodes.map((n) => n.id).filter((id) => !enteredNodes.has(id)),
    unreachableTransitions: [...declared].filter(([t]) => !takenTransitions.has(t)).map(([, name]) => name),
    pathTo: (k) => {
      const path: AnyEventObject[] = [];
      for (let p = parent.get(k); p; p = parent.get(p.from)) path.unshift(p.event);
      return path;
    },
    edges,
    snapshots,
  };
}

/** A one-line summary for test output. */
export function summary(name: string, r: ExploreReport): string {
  return (
    `${name}: ${r.states} states, ${r.transitions} transitions explored; ` +
    `declared ${r.declaredStates} states / ${r.declaredTransitions} transitions; ` +
    `unreachable ${r.unreachableStates.length} / ${r.unreachableTransitions.length}; dead ends ${r.deadEnds.length}; trapped ${r.trapped.length}`
  );
}
