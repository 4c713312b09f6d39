// The switchyard config a pool's pods serve (the ConfigMap's config.yaml): one node, exclusive placement.
import { GPUS_PER_NODE, type Fleet, type FleetModel, type Pool } from './fleet.ts';

const DEFAULT_CLASSES = {
  interactive: { ttftMs: 2000, tpotMs: 100, maxQueueMs: 60000 },
  batch: { ttftMs: 60000, tpotMs: 1000, maxQueueMs: 120000 },
};

function modelEntry(pool: Pool, m: FleetModel): Record<string, unknown> {
  return {
    name: m.name,
    profile: m.profile,
    kind: 'generate',
    tp: pool.mode === 'large' ? GPUS_PER_NODE : 1,
    replicas: m.replicas,
    batching: { policy: 'chunked', maxRunning: 256, tokenBudget: 2048, blockTokens: 16 },
    classes: m.classes ?? DEFAULT_CLASSES,
  };
}

/**
 * The scenario/config object for one pool, in the format of bin/default-config.yaml: at fleet scale a node never
 * switches modes (Kubernetes resizes pools instead), so placement is `exclusive` with the pool's fixed split.
 */
export function poolConfig(fleet: Fleet, pool: Pool): Record<string, unknown> {
  return {
    name: `${fleet.name}-${pool.name}`,
    seed: 1,
    node: { gpu: pool.gpu, gpus: GPUS_PER_NODE },
    routing: { policy: 'cost' },
    placement: {
      policy: 'exclusive',
      initialMode: pool.mode,
      drainDeadlineMs: fleet.shutdown.drainDeadlineSeconds * 1000,
    },
    detection: { heartbeatMs: 1000, missedHeartbeats: 5 },
    models: pool.models.map((m) => modelEntry(pool, m)),
  };
}
