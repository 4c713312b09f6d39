// The node's mode as placement drives it: the placement machine (steady → reserving → draining → switching), the
// policy in force, the layout each mode wants on today's healthy GPUs, and why a model cannot be served.
import { createActor, type ActorRefFrom } from 'xstate';
import { placementMachine, type PlacementMode } from '../../machines/placement.machine.ts';
import type { Scenario } from '../config.ts';
import type { PlacementConfig } from './config.ts';
import type { GpuLedger } from './ledger.ts';
import type { Timeline } from './timeline.ts';
import { layoutFor, rolesOf, type LayoutEntry, type LayoutMode, type Roles } from './layout.ts';
import type { Runtime } from '../../runtime/system.ts';

/** A placement policy. */
export type PlacementPolicy = PlacementConfig['policy'];

/** What the modes need from the rest of placement. */
export interface ModeDeps {
  runtime: Runtime;
  scenario: Scenario;
  ledger: GpuLedger;
  timeline: Timeline;
  /** Drains every replica whose id `keep` does not hold, by `deadlineMs` from now. */
  drainExcept(keep: Set<string>, deadlineMs: number): void;
  /** Runs the reconciler on the next turn. */
  schedule(): void;
}

/** The mode half of placement. */
export interface Modes {
  readonly actor: ActorRefFrom<typeof placementMachine>;
  readonly roles: Roles;
  policy(): PlacementPolicy;
  setPolicy(p: PlacementPolicy): void;
  /** The placement machine's state name (`steady`, `reserving`, `draining`, `switching`). */
  state(): string;
  /** The replicas `mode` wants on today's healthy GPUs. */
  layout(mode: LayoutMode | PlacementMode): LayoutEntry[];
  /** Whether `mode`'s layout places a replica of `model`. */
  places(mode: PlacementMode, model: string): boolean;
  /** The layout the node is heading for now: the target while switching, else the current mode. */
  desired(): LayoutEntry[];
  /** Replicas wanted of model@version (a rollout's count, else the config's). */
  countOf(m: { name: string; replicas: number }, version: string): number;
  setCount(model: string, version: string, count: number): void;
  /** The counts a rollout changed, by `model@version`. */
  counts(): Record<string, number>;
  /** Why `name` cannot be served with today's GPUs and policy, or null. */
  reasonFor(name: string): string | null;
  /** True when the large gang cannot be placed (too few healthy GPUs). */
  largeImpossible(): boolean;
}

/** Starts the placement machine for the scenario's policy. */
export function createModes(d: ModeDeps): Modes {
  const { scenario, ledger, timeline } = d;
  const pc = scenario.placement;
  const now = (): number => d.runtime.clock.now();
  const roles = rolesOf(scenario.models);
  const modelByName = new Map(scenario.models.map((m) => [m.name, m]));
  let policy = pc.policy;
  const replicaCounts = new Map<string, number>();
  const countOf = (m: { name: string; replicas: number }, version: string): number =>
    replicaCounts.get(`${m.name}@${version}`) ?? m.replicas;
  // A mode's layout, and which models it places, per mode, healthy GPUs and replica counts: admission asks for every
  // request (through reasonFor), the fleet's router asks whether each node is settled, and a layout only changes
  // with those. Callers only read a layout (it is shared).
  let countsVersion = 0;
  const layouts = new Map<string, { entries: LayoutEntry[]; names: Set<string> }>();
  const cachedLayout = (mode: LayoutMode | PlacementMode): { entries: LayoutEntry[]; names: Set<string> } => {
    const key = `${mode}|${countsVersion}|${ledger.healthVersion()}`;
    let l = layouts.get(key);
    if (!l) {
      if (layouts.size >= 64) layouts.clear();
      const entries = layoutFor(scenario, mode as LayoutMode, ledger.healthy(), countOf);
      l = { entries, names: new Set(entries.map((e) => e.model.name)) };
      layouts.set(key, l);
    }
    return l;
  };
  const layout = (mode: LayoutMode | PlacementMode): LayoutEntry[] => cachedLayout(mode).entries;
  const places = (mode: PlacementMode, model: string): boolean => cachedLayout(mode).names.has(model);

  const initialMode = (): PlacementMode =>
    policy === 'exclusive' ? 'mixed' : policy === 'share' ? 'share' : roles.large ? pc.initialMode : 'small';
  const actor = createActor(
    placementMachine.provide({
      actions: {
        raiseReservation: ({ context }) =>
          timeline.log({
            kind: 'reservation.raised',
            mode: context.target,
            detail: `deadline in ${Math.round(context.deadlineAt - now())} ms`,
          }),
        releaseReservation: ({ context }) => timeline.log({ kind: 'reservation.released', mode: context.mode }),
        drainForTarget: ({ context }) =>
          d.drainExcept(new Set(layout(context.target).map((e) => e.id)), Math.max(0, context.deadlineAt - now())),
        loadTarget: ({ context }) => {
          timeline.log({ kind: 'loading.started', mode: context.target });
          d.schedule();
        },
        completeSwitch: ({ context }) =>
          timeline.log({ kind: 'mode.switched', mode: context.mode, detail: `switch ${context.switches}` }),
        handleGpuFailure: () => d.schedule(),
        handleGpuRepair: () => d.schedule(),
      },
    }),
    { input: { mode: initialMode(), t: now() }, clock: d.runtime.clock, id: 'placement' },
  );
  const state = (): string => String(actor.getSnapshot().value);

  // Admission asks for every request; the answer only changes with the policy, the replica counts and GPU health.
  const memo = { policy: '', counts: -1, health: -1 };
  const reasons = new Map<string, string | null>();
  const reasonFor = (name: string): string | null => {
    const health = ledger.healthVersion();
    if (policy !== memo.policy || countsVersion !== memo.counts || health !== memo.health || reasons.size >= 1024) {
      reasons.clear();
      memo.policy = policy;
      memo.counts = countsVersion;
      memo.health = health;
    }
    let why = reasons.get(name);
    if (why === undefined) reasons.set(name, (why = reasonNow(name)));
    return why;
  };
  const reasonNow = (name: string): string | null => {
    const m = modelByName.get(name);
    if (!m) return null;
    const healthy = ledger.healthyCount();
    if (healthy < m.tp) return `${m.name} needs ${m.tp} healthy GPU${m.tp > 1 ? 's' : ''}, ${healthy} available`;
    const modes: LayoutMode[] = policy === 'switch' ? ['large', 'small'] : [policy === 'share' ? 'share' : 'mixed'];
    if (!modes.some((mode) => places(mode, name))) {
      const gpus = `${m.tp} free GPU${m.tp > 1 ? 's' : ''}`;
      return `${m.name} needs ${gpus}; the ${policy} placement gives them to other replicas`;
    }
    return null;
  };

  return {
    actor,
    roles,
    policy: () => policy,
    setPolicy: (p) => {
      policy = p;
    },
    state,
    layout,
    places,
    desired: () => {
      const c = actor.getSnapshot().context;
      return layout(state() === 'switching' ? c.target : c.mode);
    },
    countOf,
    setCount: (model, version, count) => {
      replicaCounts.set(`${model}@${version}`, count);
      countsVersion++;
    },
    counts: () => Object.fromEntries(replicaCounts),
    reasonFor,
    largeImpossible: () => roles.large !== null && ledger.healthyCount() < roles.large.tp,
  };
}
