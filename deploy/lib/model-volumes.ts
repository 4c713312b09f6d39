// The volumes a pool's GGUF files come from: one pod volume per distinct claim or host folder, mounted read-only
// under the worker's model root, and the path each llama.cpp model's file has inside the pod.
import type { IVolume, IVolumeMount } from 'kubernetes-models/v1';
import { posix } from 'node:path';
import type { FleetModel, ModelVolume, Pool } from './fleet.ts';
import { dnsName } from './names.ts';
import { MODELS_DIR } from './switchyard-cli.ts';

/** One pod volume of model files: its name, where it is mounted, and what it mounts. */
export interface PodModelVolume {
  name: string;
  mountPath: string;
  source: ModelVolume;
}

const sourceKey = (v: ModelVolume): string => ('claim' in v ? `claim:${v.claim}` : `host:${v.hostPath}`);

/**
 * The pool's model volumes, in the order its models first name them. Two models reading one claim (or one host
 * folder) share one volume, named and mounted after the first of them: `model-<name>` at /models/<name>.
 */
export function poolModelVolumes(pool: Pool): PodModelVolume[] {
  const byKey = new Map<string, PodModelVolume>();
  for (const m of pool.models) {
    if (!m.engine) continue;
    const key = sourceKey(m.engine.volume);
    if (byKey.has(key)) continue;
    const dir = dnsName(m.name);
    byKey.set(key, { name: `model-${dir}`, mountPath: posix.join(MODELS_DIR, dir), source: m.engine.volume });
  }
  return [...byKey.values()];
}

/** Where a llama.cpp model's GGUF file is inside the pod (under the worker's model root), or null for the cost model. */
export function modelFileInPod(pool: Pool, model: FleetModel): string | null {
  if (!model.engine) return null;
  const key = sourceKey(model.engine.volume);
  const volume = poolModelVolumes(pool).find((v) => sourceKey(v.source) === key)!;
  return posix.join(volume.mountPath, model.engine.file);
}

/** The pod volumes: a claim mounted read-only, or a node folder that must already exist. */
export function modelPodVolumes(pool: Pool): IVolume[] {
  return poolModelVolumes(pool).map((v) =>
    'claim' in v.source
      ? { name: v.name, persistentVolumeClaim: { claimName: v.source.claim, readOnly: true } }
      : { name: v.name, hostPath: { path: v.source.hostPath, type: 'Directory' } },
  );
}

/** The read-only mounts of the model volumes (both containers: `serve` checks each file's GGUF header at start). */
export function modelVolumeMounts(pool: Pool): IVolumeMount[] {
  return poolModelVolumes(pool).map((v) => ({ name: v.name, mountPath: v.mountPath, readOnly: true }));
}
