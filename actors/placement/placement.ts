// Placement: which replicas exist on which GPUs. Composes the GPU ledger (ownership: a GPU never belongs to two
// replicas), the modes (the placement machine and the layout each mode wants), the reconciler (creates and drains
// replicas to match, moves the node between modes without starving either model) and the watchdog (detection wiring:
// failed and stalled GPUs); publishes replica events (created, ready, failed, removed) to subscribers such as health.
import type { PlacementMode } from '../../machines/placement.machine.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { Msg, Runtime } from '../../runtime/system.ts';
import type { Scenario } from '../config.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';
import { loadMsOf, switchInMsOf, UNLOAD_MS } from './layout.ts';
import type { DetectionPath } from './detection.ts';
import { createGpuLedger, type GpuRecord } from './ledger.ts';
import { createModes, type Modes } from './modes.ts';
import { createReconciler, type PlacementHooks, type Reconciler } from './reconciler.ts';
import { createWatchdog } from './watchdog.ts';
import { adoptInventory, type Adoption } from './adopt.ts';
import {
  createTimeline,
  type FailureRecord,
  type InterruptionRecord,
  type PlacementEvent,
  type ReplicaEvent,
} from './timeline.ts';

export type { GpuRecord } from './ledger.ts';
export type { PlacementHooks } from './reconciler.ts';
export type { FailureRecord, InterruptionRecord, PlacementEvent, ReplicaEvent } from './timeline.ts';

/** The replicas by id, counting every change (the router keeps its list of replicas until the count moves). */
export class ReplicaMap extends Map<string, ReplicaHandle> {
  /** Changes so far: each set and delete counts one. */
  version = 0;
  override set(id: string, r: ReplicaHandle): this {
    this.version++;
    return super.set(id, r);
  }
  override delete(id: string): boolean {
    this.version++;
    return super.delete(id);
  }
  override clear(): void {
    this.version++;
    super.clear();
  }
}

/** The placement actor of a control plane. */
export interface Placement {
  readonly gpus: ReadonlyMap<number, GpuRecord>;
  readonly replicas: ReadonlyMap<string, ReplicaHandle> & { readonly version: number };
  /** Why `model` cannot be served now, or null. */
  unavailable(model: string): string | null;
  /** Why the model has no place now, also while its requests are held for a repair (null when it is placed). */
  unplaced(model: string): string | null;
  /** Predicted ms until a replica of model@version is ready, or null if none can come. */
  etaMs(model: string, version: string): number | null;
  readonly events: PlacementEvent[];
  readonly failures: FailureRecord[];
  readonly interruptions: InterruptionRecord[];
  /** Drains a replica (admin API); false if unknown. */
  drain(replica: string, deadlineMs?: number): boolean;
  /** True when the node is in a mode (no switch under way) and every replica of it is ready. */
  settled(): boolean;
  /** The control plane's demand signal: work of `model` was held, released or (rejected) refused for want of a
   * replica; a refused client was told to retry after `retryAfterMs`, so its demand lasts until then. */
  demand(model: string, rejected?: boolean, retryAfterMs?: number): void;
  /** Calls `fn` after placement handles anything (simulation stop checks, tests). */
  watch(fn: () => void): void;
  /** The placement machine's state, mode, target and switch count. */
  mode(): { state: string; mode: PlacementMode; target: PlacementMode; switches: number };
  /** Ownership and gang invariants that do not hold now (empty when all hold). */
  checkInvariants(): string[];
  /** Changes the policy while running (admin API); a Failure when it cannot. */
  setPolicy(policy: string): Failure | null;
  /** Milliseconds each detection path may take at most (for a step predicted at stepMs). */
  detectionBounds(stepMs: number): Record<DetectionPath, number>;
  /** Calls `fn` with every replica event (created, ready, failed, removed) as it happens. */
  subscribe(fn: (e: ReplicaEvent) => void): void;
  /** What each node inventory led to (replicas adopted, devices reclaimed), latest last. */
  readonly adoptions: Adoption[];
  /** Sets how many replicas of model@version the layout wants (rollouts): missing ones are placed as GPUs free up,
   * extra ones drain and finish what they hold. False if the model or version is unknown. */
  setReplicas(model: string, version: string, count: number): boolean;
  /** The replica counts rollouts set, by `model@version` (persisted in the operator state file). */
  replicaCounts(): Record<string, number>;
  /** The placement policy in force (the admin API may have changed it). */
  policy(): 'exclusive' | 'switch' | 'share';
}

/** Starts the placement actor for a scenario's models and placement policy. */
export function startPlacement(runtime: Runtime, scenario: Scenario, hooks: PlacementHooks): Placement {
  const pc = scenario.placement;
  const now = (): number => runtime.clock.now();
  const ledger = createGpuLedger(scenario.node.gpus);
  const replicas = new ReplicaMap();
  const timeline = createTimeline(now);
  const watchers: (() => void)[] = [];
  const notify = (): void => {
    for (const w of watchers) w();
  };
  // The modes and the reconciler call each other (a switch drains; a turn moves the machine): bound late.
  let rec: Reconciler | null = null;
  const schedule = (): void => rec!.schedule();
  const modes = createModes({
    runtime,
    scenario,
    ledger,
    timeline,
    schedule,
    drainExcept: (keep, deadlineMs) => {
      for (const r of replicas.values()) if (!keep.has(r.id)) rec!.drain(r, deadlineMs);
    },
  });
  const reconciler = createReconciler({ runtime, scenario, ledger, replicas, timeline, modes, hooks, notify });
  rec = reconciler;
  const watchdog = createWatchdog({
    runtime,
    scenario,
    ledger,
    replicas,
    timeline,
    schedule,
    together: reconciler.together,
    gpuFailed: (gpu) => modes.actor.send({ type: 'gpu.failed', gpu }),
    gpuRepaired: (gpu) => modes.actor.send({ type: 'gpu.repaired', gpu }),
  });

  const adoptions: Adoption[] = [];
  runtime.register('placement', (msg) => {
    if (msg.type === 'node.inventory') {
      const a = adoptInventory(
        { ledger, replicas, modes, timeline, now, watchdog, reconciler, adoptNothing: hooks.adoptNothing === true },
        msg,
      );
      if (adoptions.length >= 100) adoptions.shift();
      adoptions.push(a);
      schedule();
    } else if (!watchdog.handle(msg)) onReplicaMessage(msg);
    notify();
  });
  const onReplicaMessage = (msg: Msg): void => {
    switch (msg.type) {
      case 'replica.ready': {
        const r = replicas.get(msg.replica);
        if (!r) return;
        timeline.log({ kind: 'replica.ready', replica: r.id, model: r.model, gpus: [...r.gpus] });
        timeline.publish({ kind: 'replica.ready', t: now(), replica: r.id, model: r.model });
        reconciler.ready(r);
        return;
      }
      case 'replica.failed': {
        const detail = `gpu ${msg.failedGpus.map((d) => d % ledger.n).join(',')} failed`;
        timeline.log({ kind: 'replica.failed', replica: msg.replica, detail });
        timeline.publish({ kind: 'replica.failed', t: now(), replica: msg.replica, reason: detail });
        return;
      }
      case 'replica.stopped': {
        const id = msg.replica;
        const r = replicas.get(id);
        if (r) {
          for (const d of r.gpus) if (ledger.holderOf(d) === id) ledger.setHolder(d, null);
          replicas.delete(id);
          runtime.unregister(id);
        }
        timeline.log({ kind: 'replica.stopped', replica: id });
        timeline.publish({ kind: 'replica.removed', t: now(), replica: id });
        schedule();
        return;
      }
    }
  };
  runtime.supervise('placement', modes.actor);
  modes.actor.start();

  return {
    gpus: ledger.gpus,
    replicas,
    events: timeline.events,
    adoptions,
    failures: timeline.failures,
    interruptions: timeline.interruptions,
    unavailable: (model) => {
      const why = modes.reasonFor(model);
      return why && pc.waitForRepairMs > 0 && why.includes('healthy') ? null : why;
    },
    unplaced: (model) => modes.reasonFor(model),
    etaMs: (model, version) =>
      etaOf(scenario, modes, replicas, reconciler, ledger.healthyCount(), now(), model, version),
    drain: (replica, deadlineMs = pc.drainDeadlineMs) => {
      const r = replicas.get(replica);
      if (!r) return false;
      r.send({ type: 'replica.drain', deadlineMs });
      return true;
    },
    settled: () => {
      if (modes.state() !== 'steady') return false;
      const want = modes.desired();
      // Layout ids are distinct (a replica's id names its first device): as many replicas as entries, each entry's
      // replica present and ready, is the same set, ready. (No set built: a fleet router asks this per arrival.)
      if (replicas.size !== want.length) return false;
      for (const e of want) if (replicas.get(e.id)?.ready() !== true) return false;
      return true;
    },
    demand: (model, rejected = false, retryAfterMs = 0) => reconciler.demand(model, rejected, retryAfterMs),
    watch: (fn) => {
      watchers.push(fn);
    },
    mode: () => {
      const c = modes.actor.getSnapshot().context;
      return { state: modes.state(), mode: c.mode, target: c.target, switches: c.switches };
    },
    checkInvariants: () => ownershipViolations(scenario, ledger, replicas),
    setPolicy: (p) => setPolicy(modes, replicas, pc.policy, now(), p, schedule),
    detectionBounds: (stepMs) => watchdog.bounds(stepMs),
    subscribe: (fn) => timeline.subscribe(fn),
    setReplicas: (model, version, count) => {
      const m = scenario.models.find((x) => x.name === model);
      if (!m || !m.versions.includes(version) || !(count >= 0)) return false;
      modes.setCount(model, version, Math.floor(count));
      schedule();
      return true;
    },
    replicaCounts: () => modes.counts(),
    policy: () => modes.policy(),
  };
}

/** Changes the policy while running; a Failure when it cannot. */
function setPolicy(
  modes: Modes,
  replicas: ReadonlyMap<string, ReplicaHandle>,
  configured: string,
  t: number,
  p: string,
  schedule: () => void,
): Failure | null {
  if (p !== 'exclusive' && p !== 'switch' && p !== 'share')
    return failure('invalid_request', `unknown placement policy "${p}"`);
  if ((p === 'share') !== (configured === 'share')) {
    return failure('invalid_request', 'share needs co-location lanes on the node: set it in the config before start');
  }
  modes.setPolicy(p);
  const holdsLarge = [...replicas.values()].some((r) => r.model === modes.roles.large?.name);
  const mode: PlacementMode = p === 'exclusive' ? 'mixed' : p === 'share' ? 'share' : holdsLarge ? 'large' : 'small';
  modes.actor.send({ type: 'mode.forced', mode, t });
  schedule();
  return null;
}

/** Predicted ms until a replica of model@version is ready, or null if none can come. */
function etaOf(
  scenario: Scenario,
  modes: Modes,
  replicas: ReadonlyMap<string, ReplicaHandle>,
  reconciler: Reconciler,
  healthy: number,
  now: number,
  model: string,
  version: string,
): number | null {
  const pc = scenario.placement;
  const m = scenario.models.find((x) => x.name === model);
  if (!m) return null;
  let best: number | null = null;
  for (const r of replicas.values()) {
    if (r.model !== model || r.version !== version) continue;
    if (r.ready()) return 0;
    // Placed or loading: ready once its load is done.
    if (r.hasTag('live')) {
      const left = Math.max(0, (reconciler.createdAt(r.id) ?? now) + r.cost.loadS() * 1000 - now);
      if (best === null || left < best) best = left;
    }
  }
  if (best !== null) return best;
  if (!m.versions.includes(version) || modes.countOf(m, version) === 0) return null;
  if (modes.reasonFor(model)) return pc.waitForRepairMs > 0 && healthy < m.tp ? pc.waitForRepairMs : null;
  if (modes.policy() !== 'switch') return UNLOAD_MS + loadMsOf(scenario, m);
  // A switch brings a model in by waking its sleeping server where it has one (priced by its measured wake time).
  const load = UNLOAD_MS + switchInMsOf(scenario, m);
  const st = modes.state();
  const c = modes.actor.getSnapshot().context;
  const left = Math.max(0, c.deadlineAt - now);
  if (st !== 'steady' && modes.places(c.target, model)) return left + load;
  if (st !== 'steady') {
    const large = modes.roles.large;
    const other = large && c.target === 'large' ? switchInMsOf(scenario, large) : load;
    return left + UNLOAD_MS + other + pc.drainDeadlineMs + load;
  }
  return modes.places(c.mode, model) ? load : pc.drainDeadlineMs + load;
}

/** Ownership and gang invariants that do not hold now (empty when all hold). */
function ownershipViolations(
  scenario: Scenario,
  ledger: { holderOf(d: number): string | null },
  replicas: ReadonlyMap<string, ReplicaHandle>,
): string[] {
  const out: string[] = [];
  const seen = new Map<number, string>();
  for (const r of replicas.values()) {
    if (r.actor.getSnapshot().status === 'done') continue;
    const m = scenario.models.find((x) => x.name === r.model);
    if (m && r.gpus.length !== m.tp) out.push(`${r.id} holds ${r.gpus.length} GPUs, its model needs a gang of ${m.tp}`);
    if (new Set(r.gpus).size !== r.gpus.length) out.push(`${r.id} lists a GPU twice`);
    for (const d of r.gpus) {
      const other = seen.get(d);
      if (other) out.push(`device ${d} belongs to ${other} and ${r.id}`);
      seen.set(d, r.id);
      if (ledger.holderOf(d) !== r.id && !r.hasTag('failed'))
        out.push(`device ${d} is held by ${r.id} but placement records ${ledger.holderOf(d)}`);
    }
  }
  return out;
}
