// The placement, failure-detection and capacity-planner sections of a scenario: schema, defaults, cross-checks.
import { MODEL_PROFILES } from '../gpu/profiles.ts';
import {
  arr,
  bool,
  dflt,
  fieldPath,
  int,
  num,
  obj,
  oneOf,
  str,
  validate,
  type DefaultInput,
  type Infer,
} from '../../transport/schema.ts';

const ms = num({ min: 0, max: 1e12 });

/** Schema of `placement:`, with its defaults. */
export const placementSchema = obj({
  policy: dflt(oneOf('exclusive', 'switch', 'share'), 'exclusive'),
  /** Longest a mode keeps its GPUs once the other model's work waits (drain included). */
  drainDeadlineMs: dflt(ms, 30_000),
  /** Service a mode gets before a reservation may start draining it (spent inside the deadline). */
  minResidencyMs: dflt(ms, 10_000),
  /** How long waiting work must persist before a reservation drains anything. */
  hysteresisMs: dflt(ms, 250),
  /** How long requests refused for want of a replica must keep coming before they count as demand for a switch
   * (a single refusal, or refusals that alternate between the models, are not demand); held requests count at once. */
  sustainedDemandMs: dflt(ms, 0),
  interference: dflt(num({ min: 1, max: 10 }), 1.3),
  /** true: reserve the gang as soon as work waits; false: the naive policy (switch only when the node is idle). */
  largeWaitReservation: dflt(bool(), true),
  initialMode: dflt(oneOf('large', 'small'), 'small'),
  /** Share of the KV memory left on a co-located GPU that goes to the large model's shard. */
  shareKvFraction: dflt(num({ min: 0.05, max: 0.95 }), 0.5),
  /** With too few healthy GPUs, hold new requests this long for a repair instead of rejecting them (0: reject). */
  waitForRepairMs: dflt(ms, 0),
});

/** Schema of `detection:` (the three GPU-failure detection paths and their bounds), with its defaults. */
export const detectionSchema = obj({
  /** Bound on a reported fault reaching placement. */
  reportMs: dflt(ms, 1000),
  /** Heartbeat period of a node agent (0: no heartbeats). */
  heartbeatMs: dflt(ms, 500),
  missedHeartbeats: dflt(int({ min: 1, max: 100 }), 3),
  /** A step in flight longer than factor x predicted + slack fails the ranks that have not reported. */
  progressFactor: dflt(num({ min: 1, max: 1000 }), 10),
  progressSlackMs: dflt(ms, 2000),
});

const variantSchema = obj({
  name: str({ min: 1, max: 100 }),
  model: str({ min: 1, max: 100 }),
  profile: oneOf(...(Object.keys(MODEL_PROFILES) as [string, ...string[]])),
  tp: int({ min: 1, max: 64 }),
});

/** Schema of `planner:` (targets and the candidates `switchyard plan` tries beyond the built-in ones). */
export const plannerSchema = obj({
  /** Fraction of each model's requests that must meet its TTFT and TPOT targets. */
  attainment: dflt(num({ min: 0, max: 1 }), 0.9),
  residenciesMs: dflt(arr(ms, { max: 8 }), [0, 10_000, 20_000]),
  variants: dflt(arr(variantSchema, { max: 8 }), []),
  maxExtraGpus: dflt(int({ min: 0, max: 56 }), 24),
});

/** `placement:` with defaults filled in. */
export type PlacementConfig = Infer<typeof placementSchema>;

/** `detection:` with defaults filled in. */
export type DetectionConfig = Infer<typeof detectionSchema>;

/** A smaller or quantized variant of a model the planner may place instead. */
export type VariantConfig = Infer<typeof variantSchema>;

/** `planner:` with defaults filled in. */
export type PlannerConfig = Infer<typeof plannerSchema>;

/** Cross-field checks; returns the offending field and why, or null. */
export function checkPlacementSections(
  models: readonly { name: string; tp: number; replicas: number; versions: readonly string[] }[],
  gpus: number,
  placement: PlacementConfig,
  planner: PlannerConfig,
): { path: string; message: string } | null {
  for (const [i, m] of models.entries()) {
    if (m.tp > gpus) return { path: `models[${i}].tp`, message: `${m.name} needs ${m.tp} GPUs; the node has ${gpus}` };
  }
  if (placement.policy === 'exclusive') {
    // A fixed split places the models in order: unless one version's replicas of every model fit, a later model
    // never gets a GPU. (Further versions may overflow: a rollout moves replicas between them.)
    const need = models.reduce((n, m) => n + m.tp * m.replicas, 0);
    if (need > gpus) {
      const parts = models.map((m) => `${m.name} ${m.replicas} x tp ${m.tp}`).join(' + ');
      return {
        path: 'placement.policy',
        message: `exclusive placement needs ${need} GPUs (${parts}); the node has ${gpus}`,
      };
    }
  }
  for (const [i, v] of planner.variants.entries()) {
    if (!models.some((m) => m.name === v.model))
      return { path: `planner.variants[${i}].model`, message: `unknown model "${v.model}"` };
    if (v.tp > gpus) return { path: `planner.variants[${i}].tp`, message: `the node has ${gpus} GPUs` };
  }
  return null;
}

/** `placement:` with defaults filled in from a partial section (for tests and tools that build configs in code). */
export function placementDefaults(p: DefaultInput<PlacementConfig> = {}): PlacementConfig {
  const v = validate(placementSchema, p);
  if (!v.ok) throw new RangeError(`placement.${fieldPath(v.error.path)}: ${v.error.message}`);
  return v.value;
}
