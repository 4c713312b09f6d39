// The GPU ledger of placement: each GPU's health, whether its node reported it up, and which replica holds each of its
// lanes (a GPU never belongs to two replicas; under `share` a co-location lane may hold one guest). Pure bookkeeping:
// no messages, no timers.

/** One GPU as placement sees it. */
export interface GpuRecord {
  index: number;
  /** Set through the ledger's setHealthy (which counts the changes). */
  readonly healthy: boolean;
  /** Probed and reported ready by its node agent. */
  up: boolean;
  /** The replica holding the GPU (lane 0). */
  owner: string | null;
  /** A co-located replica on the GPU's second lane (`share` only). */
  guest: string | null;
}

/** The GPU ledger of one placement actor. Device d is lane floor(d / n) of GPU d % n. */
export interface GpuLedger {
  readonly n: number;
  readonly gpus: ReadonlyMap<number, GpuRecord>;
  /** The record of the GPU under device `d`, if the node has it. */
  gpuOf(d: number): GpuRecord | undefined;
  /** Lane of a device: 0 (the GPU itself) or 1 (its co-location lane). */
  laneOf(d: number): 0 | 1;
  /** The replica holding device `d`, or null. */
  holderOf(d: number): string | null;
  setHolder(d: number, id: string | null): void;
  /** Every lane (device) of GPU `g`. */
  lanes(g: number): number[];
  /** A device's node reported it probed and free (it may be given to a replica). */
  deviceUp(d: number): void;
  deviceDown(d: number): void;
  /** GPUs that are healthy. */
  healthy(): Set<number>;
  /** Marks GPU `g` healthy or not. */
  setHealthy(g: number, on: boolean): void;
  /** Changes of any GPU's health so far: a cache key for what depends on which GPUs are healthy (a number compared
   * per request, where building a key from every GPU cost a string per admission). */
  healthVersion(): number;
  /** healthy().size, without building the set. */
  healthyCount(): number;
  /** GPUs that are healthy and up (the ones detection watches). */
  live(): number[];
  /** True when every device is on a healthy GPU, up, held by no replica and not suspected of hanging. */
  free(devices: readonly number[]): boolean;
  /** GPUs detection suspects (their step or load is overdue): not given to a new replica until cleared. */
  suspect(g: number, on: boolean): void;
  suspected(g: number): boolean;
}

/** Creates the ledger of `n` GPUs, all healthy, none up yet. */
export function createGpuLedger(n: number): GpuLedger {
  type Writable = { -readonly [K in keyof GpuRecord]: GpuRecord[K] };
  const gpus = new Map<number, Writable>();
  for (let g = 0; g < n; g++) gpus.set(g, { index: g, healthy: true, up: false, owner: null, guest: null });
  let healthVersion = 0;
  const devUp = new Set<number>();
  const suspects = new Set<number>();
  const laneOf = (d: number): 0 | 1 => (d >= n ? 1 : 0);
  const holderOf = (d: number): string | null => {
    const rec = gpus.get(d % n);
    return rec ? (laneOf(d) === 0 ? rec.owner : rec.guest) : null;
  };
  return {
    n,
    gpus,
    gpuOf: (d) => gpus.get(d % n),
    laneOf,
    holderOf,
    setHolder: (d, id) => {
      const rec = gpus.get(d % n)!;
      if (laneOf(d) === 0) rec.owner = id;
      else rec.guest = id;
    },
    lanes: (g) => [g, g + n],
    deviceUp: (d) => {
      devUp.add(d);
    },
    deviceDown: (d) => {
      devUp.delete(d);
    },
    healthy: () => {
      const s = new Set<number>();
      for (const g of gpus.values()) if (g.healthy) s.add(g.index);
      return s;
    },
    healthyCount: () => {
      let n = 0;
      for (const g of gpus.values()) if (g.healthy) n++;
      return n;
    },
    setHealthy: (g, on) => {
      const rec = gpus.get(g);
      if (!rec || rec.healthy === on) return;
      rec.healthy = on;
      healthVersion++;
    },
    healthVersion: () => healthVersion,
    live: () => {
      const out: number[] = [];
      for (const g of gpus.values()) if (g.healthy && g.up) out.push(g.index);
      return out;
    },
    free: (devices) =>
      devices.every((d) => gpus.get(d % n)!.healthy && devUp.has(d) && holderOf(d) === null && !suspects.has(d % n)),
    suspect: (g, on) => {
      if (on) suspects.add(g);
      else suspects.delete(g);
    },
    suspected: (g) => suspects.has(g),
  };
}
