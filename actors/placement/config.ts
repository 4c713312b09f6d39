// The placement, failure-detection and capacity-planner sections of a scenario: schema, defaults, cross-checks.
import { MODEL_PROFILES } from '../gpu/profiles.ts';
import { arr, bool, int, num, obj, oneOf, optional, str, type Infer } from '../../transport/schema.ts';

const ms = num({ min: 0, max: 1e12 });

/** Schema of `placement:`. */
export const placementSchema = obj({
  policy: optional(oneOf('exclusive', 'switch', 'share')),
  drainDeadlineMs: optional(ms),
  minResidencyMs: optional(ms),
  hysteresisMs: optional(ms),
  interference: optional(num({ min: 1, max: 10 })),
  largeWaitReservation: optional(bool()),
  initialMode: optional(oneOf('large', 'small')),
  shareKvFraction: optional(num({ min: 0.05, max: 0.95 })),
  waitForRepairMs: optional(ms),
});

/** Schema of `detection:` (the three GPU-failure detection paths and their bounds). */
export const detectionSchema = obj({
  reportMs: optional(ms),
  heartbeatMs: optional(ms),
  missedHeartbeats: optional(int({ min: 1, max: 100 })),
  progressFactor: optional(num({ min: 1, max: 1000 })),
  progressSlackMs: optional(ms),
});

const variantSchema = obj({
  name: str({ min: 1, max: 100 }),
  model: str({ min: 1, max: 100 }),
  profile: oneOf(...(Object.keys(MODEL_PROFILES) as [string, ...string[]])),
  tp: int({ min: 1, max: 64 }),
});

/** Schema of `planner:` (targets and the candidates `switchyard plan` tries beyond the built-in ones). */
export const plannerSchema = obj({
  attainment: optional(num({ min: 0, max: 1 })),
  residenciesMs: optional(arr(ms, { max: 8 })),
  variants: optional(arr(variantSchema, { max: 8 })),
  maxExtraGpus: optional(int({ min: 0, max: 56 })),
});

/** `placement:` with defaults filled in. */
export interface PlacementConfig {
  policy: 'exclusive' | 'switch' | 'share';
  /** Longest a mode keeps its GPUs once the other model's work waits (drain included). */
  drainDeadlineMs: number;
  /** Service a mode gets before a reservation may start draining it (spent inside the deadline). */
  minResidencyMs: number;
  /** How long waiting work must persist before a reservation drains anything. */
  hysteresisMs: number;
  interference: number;
  /** true: reserve the gang as soon as work waits; false: the naive policy (switch only when the node is idle). */
  largeWaitReservation: boolean;
  initialMode: 'large' | 'small';
  /** Share of the KV memory left on a co-located GPU that goes to the large model's shard. */
  shareKvFraction: number;
  /** With too few healthy GPUs, hold new requests this long for a repair instead of rejecting them (0: reject). */
  waitForRepairMs: number;
}

/** `detection:` with defaults filled in. */
export interface DetectionConfig {
  /** Bound on a reported fault reaching placement. */
  reportMs: number;
  /** Heartbeat period of a node agent (0: no heartbeats). */
  heartbeatMs: number;
  missedHeartbeats: number;
  /** A step in flight longer than factor x predicted + slack fails the ranks that have not reported. */
  progressFactor: number;
  progressSlackMs: number;
}

/** A smaller or quantized variant of a model the planner may place instead. */
export type VariantConfig = Infer<typeof variantSchema>;

/** `planner:` with defaults filled in. */
export interface PlannerConfig {
  /** Fraction of each model's requests that must meet its TTFT and TPOT targets. */
  attainment: number;
  residenciesMs: number[];
  variants: VariantConfig[];
  maxExtraGpus: number;
}

/** Fills placement defaults. */
export function placementDefaults(p: Infer<typeof placementSchema> = {}): PlacementConfig {
  return {
    policy: p.policy ?? 'exclusive',
    drainDeadlineMs: p.drainDeadlineMs ?? 30_000,
    minResidencyMs: p.minResidencyMs ?? 10_000,
    hysteresisMs: p.hysteresisMs ?? 250,
    interference: p.interference ?? 1.3,
    largeWaitReservation: p.largeWaitReservation ?? true,
    initialMode: p.initialMode ?? 'small',
    shareKvFraction: p.shareKvFraction ?? 0.5,
    waitForRepairMs: p.waitForRepairMs ?? 0,
  };
}

/** Fills detection defaults. */
export function detectionDefaults(d: Infer<typeof detectionSchema> = {}): DetectionConfig {
  return {
    reportMs: d.reportMs ?? 1000,
    heartbeatMs: d.heartbeatMs ?? 500,
    missedHeartbeats: d.missedHeartbeats ?? 3,
    progressFactor: d.progressFactor ?? 10,
    progressSlackMs: d.progressSlackMs ?? 2000,
  };
}

/** Fills planner defaults. */
export function plannerDefaults(p: Infer<typeof plannerSchema> = {}): PlannerConfig {
  return {
    attainment: p.attainment ?? 0.9,
    residenciesMs: p.residenciesMs ?? [0, 10_000, 20_000],
    variants: p.variants ?? [],
    maxExtraGpus: p.maxExtraGpus ?? 24,
  };
}

/** Cross-field checks; returns the offending field and why, or null. */
export function checkPlacementSections(
  models: readonly { name: string; tp: number }[],
  gpus: number,
  planner: PlannerConfig,
): { path: string; message: string } | null {
  for (const [i, m] of models.entries()) {
    if (m.tp > gpus) return { path: `models[${i}].tp`, message: `${m.name} needs ${m.tp} GPUs; the node has ${gpus}` };
  }
  for (const [i, v] of planner.variants.entries()) {
    if (!models.some((m) => m.name === v.model))
      return { path: `planner.variants[${i}].model`, message: `unknown model "${v.model}"` };
    if (v.tp > gpus) return { path: `planner.variants[${i}].tp`, message: `the node has ${gpus} GPUs` };
  }
  return null;
}
