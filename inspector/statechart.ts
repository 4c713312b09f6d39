// Statecharts for the page, read from the machine definitions themselves (state nodes and their transitions), so
// the drawing can never disagree with the code that runs.
import type { AnyStateMachine } from 'xstate';
import { gpuMachine } from '../machines/gpu.machine.ts';
import { placementMachine } from '../machines/placement.machine.ts';
import { replicaMachine } from '../machines/replica.machine.ts';
import { requestMachine } from '../machines/request.machine.ts';

/** One state of a machine: its dotted path ('' for the root), kind and children. */
export interface StateDef {
  path: string;
  key: string;
  type: 'atomic' | 'compound' | 'parallel' | 'final' | 'history';
  initial: string | null;
  tags: string[];
  children: StateDef[];
}

/** A transition between two states: the event (or `after <delay>` / `always`) and its guard. */
export interface EdgeDef {
  from: string;
  to: string;
  label: string;
  guard: string | null;
}

/** A machine as the page draws it. */
export interface MachineDef {
  id: string;
  root: StateDef;
  edges: EdgeDef[];
}

/** Minimal view of XState's StateNode that this module reads. */
interface NodeLike {
  key: string;
  path: string[];
  type: StateDef['type'];
  tags: string[];
  states: Record<string, NodeLike>;
  initial?: { target: readonly NodeLike[] };
  transitions: Map<string, readonly TransitionLike[]>;
  always?: readonly TransitionLike[];
  after: readonly (TransitionLike & { delay: string | number })[];
}
interface TransitionLike {
  eventType: string;
  target?: readonly NodeLike[];
  guard?: unknown;
}

const guardName = (g: unknown): string | null => {
  if (!g) return null;
  if (typeof g === 'string') return g;
  if (typeof g === 'object' && 'type' in g && typeof (g as { type: unknown }).type === 'string')
    return (g as { type: string }).type;
  return 'guard';
};

/** Describes a machine: its state tree and every transition that changes state. */
export function describeMachine(machine: AnyStateMachine): MachineDef {
  const edges: EdgeDef[] = [];
  const seen = new Set<string>();
  const addEdges = (
    from: string,
    ts: readonly TransitionLike[] | undefined,
    label: (t: TransitionLike) => string,
  ): void => {
    for (const t of ts ?? []) {
      for (const target of t.target ?? []) {
        const e = { from, to: target.path.join('.'), label: label(t), guard: guardName(t.guard) };
        const key = `${e.from}|${e.to}|${e.label}|${e.guard}`;
        if (seen.has(key)) continue;
        seen.add(key);
        edges.push(e);
      }
    }
  };
  const walk = (n: NodeLike): StateDef => {
    const path = n.path.join('.');
    const afterTypes = new Set(n.after.map((a) => a.eventType));
    for (const [ev, ts] of n.transitions) if (!afterTypes.has(ev)) addEdges(path, ts, () => ev);
    for (const a of n.after) addEdges(path, [a], () => `after ${String(a.delay)}`);
    addEdges(path, n.always, () => 'always');
    return {
      path,
      key: n.key,
      type: n.type,
      initial: n.initial?.target[0]?.key ?? null,
      tags: [...n.tags],
      children: Object.values(n.states).map(walk),
    };
  };
  const root = walk(machine.root as unknown as NodeLike);
  return { id: machine.id, root, edges };
}

/** The machines the inspector shows, by machine id. */
export function inspectedMachines(): Record<string, MachineDef> {
  return Object.fromEntries(
    [gpuMachine, replicaMachine, requestMachine, placementMachine].map((m) => [
      m.id,
      describeMachine(m as AnyStateMachine),
    ]),
  );
}
