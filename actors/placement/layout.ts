// Which replicas a placement mode wants on which GPUs: pure functions of the scenario and the healthy GPUs.
// A replica is one entry whatever its size: the large model's gang is one entry holding all its GPUs.
import type { ModelConfig, Scenario } from '../config.ts';
import type { CostModel } from '../gpu/cost-model.ts';
import { costModelFor, costModelKey, engineProfileAt } from '../gpu/profile-cost-model.ts';

/** A layout mode: the large gang (plus small replicas on what is left), small replicas only, a fixed split, or
 * co-location. */
export type LayoutMode = 'large' | 'small' | 'mixed' | 'share';

/** One replica a layout wants. Device d is lane floor(d / gpus) of GPU d % gpus (lane 1 is a co-location lane). */
export interface LayoutEntry {
  id: string;
  model: ModelConfig;
  version: string;
  devices: number[];
  lane: 0 | 1;
  /** Multiplies step times (co-location interference; a gang is as slow as its slowest shared GPU). */
  slowdown: number;
  /** KV blocks when memory is split with a co-located replica. */
  blocksTotal?: number;
}

/** The large model (the widest gang, tp > 1) and the others. */
export interface Roles {
  large: ModelConfig | null;
  small: ModelConfig[];
}

/** Mirrors the replica's fixed unload time (actors/replica.ts). */
export const UNLOAD_MS = 1000;

const costs = new Map<string, CostModel>();

/** The cost model of `model` on the scenario's GPU type, or of its calibrated engine (cached). */
export function costOf(scenario: Scenario, model: ModelConfig): CostModel {
  const key = `${costModelKey(model)}|${scenario.node.gpu}|${model.tp}`;
  let c = costs.get(key);
  if (!c) {
    c = costModelFor(costModelKey(model), scenario.node.gpu, model.tp);
    costs.set(key, c);
  }
  return c;
}

/** Milliseconds from creating a replica of `model` to it serving. */
export function loadMsOf(scenario: Scenario, model: ModelConfig): number {
  return costOf(scenario, model).loadS() * 1000;
}

/** Milliseconds from assigning a replica of `model` in a switch to it serving: the wake time its calibration measured
 * when its server sleeps instead of stopping (`engine: openai` with `upstream.sleep`), else its load time. */
export function switchInMsOf(scenario: Scenario, model: ModelConfig): number {
  if (model.engine?.upstream?.sleep && model.calibration) {
    const wake = (engineProfileAt(model.calibration) as { wakeS?: unknown }).wakeS;
    if (typeof wake === 'number' && Number.isFinite(wake) && wake >= 0) return wake * 1000;
  }
  return loadMsOf(scenario, model);
}

/** Splits the scenario's models into the large one and the small ones. */
export function rolesOf(models: readonly ModelConfig[]): Roles {
  let large: ModelConfig | null = null;
  for (const m of models) if (m.tp > 1 && (!large || m.tp > large.tp)) large = m;
  return { large, small: models.filter((m) => m !== large) };
}

/** Replicas wanted of model@version: the config's `replicas` unless a rollout changed the count. */
export type ReplicaCounts = (model: ModelConfig, version: string) => number;

/** A model's replica slots: each version times its count (`replicas` by default). */
function slotsOf(m: ModelConfig, counts?: ReplicaCounts): { model: ModelConfig; version: string }[] {
  const out: { model: ModelConfig; version: string }[] = [];
  for (const version of m.versions)
    for (let k = 0; k < (counts ? counts(m, version) : m.replicas); k++) out.push({ model: m, version });
  return out;
}

const entry = (
  model: ModelConfig,
  version: string,
  devices: number[],
  lane: 0 | 1,
  slowdown = 1,
  blocksTotal?: number,
): LayoutEntry => ({
  id: `replica.${model.name}@${version}#${devices[0]}`,
  model,
  version,
  devices,
  lane,
  slowdown,
  ...(blocksTotal !== undefined ? { blocksTotal } : {}),
});

/** Fills slots in order from `pool` (ascending GPU indices), tp GPUs each; slots that do not fit are left out. */
function fill(slots: { model: ModelConfig; version: string }[], pool: number[]): LayoutEntry[] {
  const out: LayoutEntry[] = [];
  for (const s of slots) {
    if (pool.length < s.model.tp) continue;
    out.push(entry(s.model, s.version, pool.splice(0, s.model.tp), 0));
  }
  return out;
}

/** KV blocks of the large shard and of a small guest sharing one GPU, or null when memory does not allow it. */
export function shareMemory(
  scenario: Scenario,
  large: ModelConfig,
  small: ModelConfig,
): { largeBlocks: number; smallBlocks: number } | null {
  if (small.tp !== 1) return null;
  const L = costOf(scenario, large);
  const S = costOf(scenario, small);
  const usable = L.params.gpuMemoryUtilization * L.gpu.memoryBytes;
  const left =
    usable -
    L.weightsBytesPerGpu -
    L.activationReserveBytesPerGpu -
    S.weightsBytesPerGpu -
    S.activationReserveBytesPerGpu;
  if (left <= 0) return null;
  const f = scenario.placement.shareKvFraction;
  const largeBlocks = Math.floor((f * left) / ((L.kvBytesPerToken / large.tp) * large.batching.blockTokens));
  const smallBlocks = Math.floor(((1 - f) * left) / (S.kvBytesPerToken * small.batching.blockTokens));
  const need = (m: ModelConfig): number => Math.ceil(m.batching.maxContext / m.batching.blockTokens);
  if (largeBlocks < need(large) || smallBlocks < need(small)) return null;
  return { largeBlocks, smallBlocks };
}

/** The replicas `mode` wants given the healthy GPUs (indices 0..gpus-1). */
export function layoutFor(
  scenario: Scenario,
  mode: LayoutMode,
  healthy: ReadonlySet<number>,
  counts?: ReplicaCounts,
): LayoutEntry[] {
  const n = scenario.node.gpus;
  const all = Array.from({ length: n }, (_, g) => g);
  const ok = all.filter((g) => healthy.has(g));
  const { large, small } = rolesOf(scenario.models);
  const smallSlots = small.flatMap((m) => slotsOf(m, counts));
  if (mode === 'mixed') {
    // A fixed split over all GPUs: a failed GPU removes the replica that holds it instead of reshuffling the others.
    return fill(
      scenario.models.flatMap((m) => slotsOf(m, counts)),
      all,
    ).filter((e) => e.devices.every((g) => healthy.has(g)));
  }
  if (mode === 'small' || !large) return fill(smallSlots, ok);
  const pool = [...ok];
  const gang = fill(slotsOf(large, counts), pool);
  if (mode === 'large') return [...gang, ...fill(smallSlots, pool)];
  // share: small replicas as guests beside the gang's shards (lane 1), then on whole GPUs left over.
  const guestModel = small[0];
  const mem = guestModel ? shareMemory(scenario, large, guestModel) : null;
  if (!mem) return [...gang, ...fill(smallSlots, pool)];
  const hosts = gang.length > 0 ? gang.flatMap((e) => e.devices) : ok;
  const guests: LayoutEntry[] = [];
  const rest: { model: ModelConfig; version: string }[] = [];
  for (const s of smallSlots) {
    const host = s.model === guestModel ? hosts.shift() : undefined;
    if (host === undefined) rest.push(s);
    else guests.push(entry(s.model, s.version, [host + n], 1, scenario.placement.interference, mem.smallBlocks));
  }
  const shared = guests.length > 0;
  const gangShared = gang.map((e) => ({
    ...e,
    slowdown:
      shared && e.devices.some((g) => guests.some((x) => x.devices[0] === g + n)) ? scenario.placement.interference : 1,
    ...(shared ? { blocksTotal: mem.largeBlocks } : {}),
  }));
  return [...gangShared, ...guests, ...fill(rest, pool)];
}

/** Physical GPU of a device. */
export const physicalOf = (device: number, gpus: number): number => device % gpus;
