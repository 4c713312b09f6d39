// A rolling version update, one replica at a time: an old replica drains (it takes no new work and finishes what it
// holds) and a new one loads on the GPUs it frees; the next step starts when the new one is ready. Unpinned traffic
// is split between the versions in proportion to their ready replicas, and at the end the alias moves to the new
// version, so the model keeps serving throughout with at most one replica out of service (`steps` fewer than the
// replicas moves several per step). A step whose new replica cannot come (its GPU failed and nothing is loading or
// draining) does not hold the rollout up: the next step goes on to the GPUs that remain.
import type { Clock } from '../../runtime/clock.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { Registry } from './registry.ts';
import { isReady } from './view.ts';

/** What to roll out. */
export interface RolloutSpec {
  model: string;
  from: string;
  to: string;
  /** Replicas of `to` at the end (default: as many as `from` has when the rollout starts). */
  replicas?: number;
  /** Alias pointed at `to` when done (default `stable`). */
  alias?: string;
  /** How often progress is checked (ms). */
  pollMs?: number;
  /** Steps to take (default one per replica). */
  steps?: number;
}

/** A step of a rollout, for reports and tests. */
export interface RolloutEvent {
  t: number;
  what: string;
}

/** A running rollout. */
export interface Rollout {
  readonly spec: RolloutSpec;
  readonly done: boolean;
  readonly events: readonly RolloutEvent[];
}

/** What a rollout drives: placement's replica counts and the router's model table. */
export interface RolloutDeps {
  clock: Clock;
  placement: {
    readonly replicas: ReadonlyMap<string, ReplicaHandle>;
    setReplicas(model: string, version: string, count: number): boolean;
  };
  registry: Registry;
}

/** Starts a rollout now; throws if the model or a version is unknown (a programming error of the caller). */
export function startRollout(deps: RolloutDeps, spec: RolloutSpec): Rollout {
  const entry = deps.registry.get(spec.model);
  if (!entry || !entry.versions.includes(spec.from) || !entry.versions.includes(spec.to)) {
    throw new Error(`rollout: unknown ${spec.model}@${spec.from} or @${spec.to}`);
  }
  const events: RolloutEvent[] = [];
  const log = (what: string): void => void events.push({ t: deps.clock.now(), what });
  const of = (version: string): ReplicaHandle[] =>
    [...deps.placement.replicas.values()].filter((r) => r.model === spec.model && r.version === version);
  const live = (version: string): ReplicaHandle[] => of(version).filter((r) => r.hasTag('live'));

  let fromTarget = live(spec.from).length;
  let toTarget = live(spec.to).length;
  const finalTo = spec.replicas ?? Math.max(1, fromTarget);
  const pollMs = spec.pollMs ?? 500;
  const perStep = Math.max(1, Math.ceil(Math.max(finalTo, fromTarget) / Math.max(1, spec.steps ?? Infinity)));
  let done = false;
  log(`rolling ${spec.model} from ${spec.from} (${fromTarget} replicas) to ${spec.to} (${toTarget} -> ${finalTo})`);

  const tick = (): void => {
    const readyFrom = live(spec.from).filter(isReady).length;
    const readyTo = of(spec.to).filter(isReady).length;
    // Unpinned requests follow capacity: each version gets traffic in proportion to its ready replicas.
    if (readyFrom + readyTo > 0) deps.registry.setSplit(spec.model, { [spec.from]: readyFrom, [spec.to]: readyTo });
    // Wait for the step's new replicas while the step is still under way: an old replica still draining, or a new
    // one loading. Neither, and still short of new ones: they cannot be placed now (a failed GPU), so go on.
    const moving = of(spec.from).length > fromTarget || of(spec.to).some((r) => r.hasTag('live') && !isReady(r));
    if (readyTo < toTarget && moving) {
      deps.clock.setTimeout(tick, pollMs);
      return;
    }
    if (fromTarget > 0 || toTarget < finalTo) {
      // Both counts change together so the new replica takes the place the old one leaves (no reshuffling).
      fromTarget = Math.max(0, fromTarget - perStep);
      toTarget = Math.min(finalTo, toTarget + perStep);
      deps.placement.setReplicas(spec.model, spec.from, fromTarget);
      deps.placement.setReplicas(spec.model, spec.to, toTarget);
      log(`${spec.from}: ${fromTarget} replicas, ${spec.to}: ${toTarget}/${finalTo}`);
      deps.clock.setTimeout(tick, pollMs);
      return;
    }
    deps.registry.setAlias(spec.model, spec.alias ?? 'stable', spec.to);
    deps.registry.setSplit(spec.model, null);
    done = true;
    log(`done: ${spec.alias ?? 'stable'} -> ${spec.to}`);
  };
  tick();
  return {
    spec: { ...spec, replicas: finalTo },
    get done() {
      return done;
    },
    events,
  };
}
