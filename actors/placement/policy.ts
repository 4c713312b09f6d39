// The `switch` policy's decisions as a pure function: which mode the node should move to, when draining starts,
// and by when the replicas in the way must be gone. Placement feeds it the demand it sees and sends what it returns.
import type { PlacementContext, PlacementEvent, PlacementMode } from '../../machines/placement.machine.ts';
import type { PlacementConfig } from './config.ts';

/** What the switch policy looks at. */
export interface SwitchInput {
  now: number;
  /** The placement machine's state (`steady`, `reserving`, `draining`, `switching`) and context. */
  state: string;
  context: PlacementContext;
  config: PlacementConfig;
  /** Models with waiting work and no accepting replica, and since when (ms). */
  demandSince: ReadonlyMap<string, number>;
  /** Whether `mode`'s layout places a replica of `model` (with today's healthy GPUs). */
  places(mode: PlacementMode, model: string): boolean;
  /** True when the large gang cannot be placed (too few healthy GPUs). */
  largeImpossible: boolean;
  /** Nothing runs, waits or loads for the current mode's models (only the naive policy asks). */
  idle(): boolean;
}

/** The other mode of the switch policy. */
export const otherMode = (m: PlacementMode): PlacementMode => (m === 'large' ? 'small' : 'large');

/** Decides the next placement event, or null to stay as is. */
export function decideSwitch(x: SwitchInput): PlacementEvent | null {
  const { now, state, context: ctx, config: pc } = x;
  if (x.largeImpossible && (ctx.mode === 'large' || (state !== 'steady' && ctx.target === 'large'))) {
    return { type: 'mode.forced', mode: 'small', t: now };
  }
  if (state === 'steady') {
    const other = otherMode(ctx.mode);
    let since = Infinity;
    for (const [model, t] of x.demandSince) {
      if (!x.places(ctx.mode, model) && x.places(other, model)) since = Math.min(since, t);
    }
    if (since === Infinity) return null;
    if (!pc.largeWaitReservation) {
      // Naive: switch only once the node has nothing left to do in its current mode.
      if (!x.idle()) return null;
      return {
        type: 'demand.shifted',
        target: other,
        t: now,
        reservedAt: now,
        deadlineAt: now + pc.drainDeadlineMs,
        drainDelayMs: 0,
      };
    }
    // Reserved: the deadline counts from when the work started waiting; hysteresis and residency only delay the
    // start of draining inside that window, so the wait stays bounded by deadline + unload + load + one step.
    const deadlineAt = since + pc.drainDeadlineMs;
    const startAt = Math.min(deadlineAt, Math.max(now + pc.hysteresisMs, ctx.since + pc.minResidencyMs));
    return {
      type: 'demand.shifted',
      target: other,
      t: now,
      reservedAt: since,
      deadlineAt,
      drainDelayMs: Math.max(0, startAt - now),
    };
  }
  if (state === 'reserving' || state === 'draining') {
    for (const model of x.demandSince.keys()) {
      if (!x.places(ctx.mode, model) && x.places(ctx.target, model)) return null;
    }
    return { type: 'demand.subsided', t: now };
  }
  return null;
}
