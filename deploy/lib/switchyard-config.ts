// The switchyard config a pool's pods serve (the ConfigMap's config.yaml): one node, exclusive placement.
import { ConfigError, normalizeScenario } from '../../actors/config.ts';
import { FleetError, GPUS_PER_NODE, type Fleet, type FleetModel, type Pool } from './fleet.ts';
import { modelFileInPod } from './model-volumes.ts';

const DEFAULT_CLASSES = {
  interactive: { ttftMs: 2000, tpotMs: 100, maxQueueMs: 60000 },
  batch: { ttftMs: 60000, tpotMs: 1000, maxQueueMs: 120000 },
};

/** The serve config's engine fields of a model: none for the cost model; llama.cpp on its file in the pod otherwise. */
function engineEntry(pool: Pool, m: FleetModel): Record<string, unknown> {
  const e = m.engine;
  if (!e) return {};
  return {
    engine: 'llama.cpp',
    file: modelFileInPod(pool, m),
    gpu: e.gpu,
    ...(e.gpuLayers !== undefined ? { gpuLayers: e.gpuLayers } : {}),
    threads: e.threads,
    contextTokens: e.contextTokens,
    sequences: e.sequences,
  };
}

/** Classes as the config writes them: the fleet's, in order, else the defaults. */
function classesEntry(m: FleetModel): Record<string, unknown> {
  if (!m.classes) return DEFAULT_CLASSES;
  return Object.fromEntries([...m.classes].map(([name, limits]) => [name, Object.fromEntries(limits)]));
}

function modelEntry(pool: Pool, m: FleetModel): Record<string, unknown> {
  return {
    name: m.name,
    profile: m.profile,
    kind: 'generate',
    tp: pool.mode === 'large' ? GPUS_PER_NODE : 1,
    replicas: m.replicas,
    batching: { policy: 'chunked', maxRunning: 256, tokenBudget: 2048, blockTokens: 16 },
    classes: classesEntry(m),
    ...engineEntry(pool, m),
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

/**
 * Checks a pool's config with the schema `serve` loads it with (engine rules included: a context that is a multiple
 * of 256, `maxContext` within the engine's cells); an error names the fleet field it came from.
 */
export function checkPoolConfig(fleet: Fleet, pool: Pool): void {
  try {
    normalizeScenario(poolConfig(fleet, pool));
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    const at = `pools[${fleet.pools.indexOf(pool)}]`;
    const message = e.message.slice(e.path.length + 2);
    throw new FleetError(
      e.path.startsWith('models[') ? `${at}.${e.path}` : at,
      `the serve config refuses it: ${message}`,
    );
  }
}
