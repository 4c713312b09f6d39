// Adoption: what a node reports holding after it registers (`node.inventory`) becomes this control plane's, so that a
// restarted control plane keeps every replica the node still serves instead of reloading it. A replica is adopted
// when the layout the node is heading for wants exactly it (same id, same GPUs), every GPU of it reports it at one
// epoch, and this control plane holds none of those GPUs; anything else the node holds is reclaimed (fenced: reset
// to free at the node, no repair time). Epochs and fence ids continue from what the node reports.
import type { MessageOf, NodeInventoryDevice } from '../../machines/messages.ts';
import type { PlacementMode } from '../../machines/placement.machine.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { GpuLedger } from './ledger.ts';
import type { LayoutEntry } from './layout.ts';
import type { Modes } from './modes.ts';
import type { Timeline } from './timeline.ts';

/** What adoption works on. */
export interface AdoptDeps {
  ledger: GpuLedger;
  replicas: ReadonlyMap<string, ReplicaHandle>;
  modes: Modes;
  timeline: Timeline;
  now(): number;
  watchdog: {
    reclaim(g: number): void;
    continueFences(applied: number): void;
    deviceUp(d: number): void;
    failedAtNode(g: number): void;
  };
  reconciler: { seeEpoch(id: string, epoch: number): void; adopt(e: LayoutEntry, epoch: number): void };
  /** Mutation tests only: adopt nothing. */
  adoptNothing?: boolean;
}

/** What one inventory led to. */
export interface Adoption {
  adopted: string[];
  reclaimed: number[];
}

/** Replicas the node holds: per replica id, its epoch and devices (loading or serving), or null when they disagree. */
function heldReplicas(
  devices: readonly NodeInventoryDevice[],
): Map<string, { epoch: number; devices: number[] } | null> {
  const out = new Map<string, { epoch: number; devices: number[] } | null>();
  for (const dev of devices) {
    if (dev.replica === undefined || dev.epoch === undefined) continue;
    if (dev.state !== 'serving' && dev.state !== 'loading') continue;
    const g = out.get(dev.replica);
    if (g === undefined) out.set(dev.replica, { epoch: dev.epoch, devices: [dev.gpu] });
    else if (g !== null && g.epoch === dev.epoch) g.devices.push(dev.gpu);
    else out.set(dev.replica, null);
  }
  return out;
}

const sameDevices = (a: readonly number[], b: readonly number[]): boolean =>
  a.length === b.length && [...a].sort((x, y) => x - y).every((x, i) => x === [...b].sort((p, q) => p - q)[i]);

/** The mode whose layout holds the most of what the node serves (switch policy, nothing placed here yet). */
function modeToAdopt(d: AdoptDeps, held: ReadonlyMap<string, { epoch: number; devices: number[] } | null>): void {
  if (d.modes.policy() !== 'switch' || d.replicas.size > 0 || d.modes.state() !== 'steady') return;
  const matches = (mode: PlacementMode): number =>
    d.modes.layout(mode).filter((e) => {
      const h = held.get(e.id);
      return h && sameDevices(h.devices, e.devices);
    }).length;
  const current = d.modes.actor.getSnapshot().context.mode;
  const other: PlacementMode = current === 'large' ? 'small' : 'large';
  if (matches(other) > matches(current)) {
    d.timeline.log({ kind: 'mode.forced', mode: other, detail: 'the node serves this mode: adopted as it is' });
    d.modes.actor.send({ type: 'mode.forced', mode: other, t: d.now() });
  }
}

/** Adopts what the node reports that the desired layout wants, reclaims the rest; marks free GPUs up. */
export function adoptInventory(d: AdoptDeps, inv: MessageOf<'node.inventory'>): Adoption {
  const result: Adoption = { adopted: [], reclaimed: [] };
  d.watchdog.continueFences(inv.fence);
  for (const dev of inv.devices)
    if (dev.replica !== undefined && dev.epoch !== undefined) d.reconciler.seeEpoch(dev.replica, dev.epoch);
  const held = heldReplicas(inv.devices);
  modeToAdopt(d, held);
  const desired = new Map(d.modes.desired().map((e) => [e.id, e]));
  const adopted = new Set<number>();
  for (const [id, h] of held) {
    const e = desired.get(id);
    const ok =
      !d.adoptNothing &&
      h !== null &&
      e !== undefined &&
      !d.replicas.has(id) &&
      sameDevices(e.devices, h.devices) &&
      h.devices.every((x) => d.ledger.holderOf(x) === null && d.ledger.gpuOf(x)?.healthy === true);
    if (!ok || !e || !h) continue;
    for (const x of h.devices) {
      d.watchdog.deviceUp(x);
      adopted.add(x);
    }
    d.reconciler.adopt(e, h.epoch);
    result.adopted.push(id);
  }
  for (const dev of inv.devices) {
    if (adopted.has(dev.gpu)) continue;
    const lane0 = d.ledger.laneOf(dev.gpu) === 0;
    if (dev.state === 'free') d.watchdog.deviceUp(dev.gpu);
    else if ((dev.state === 'failed' || dev.state === 'repairing') && lane0) d.watchdog.failedAtNode(dev.gpu);
    else if (dev.state === 'loading' || dev.state === 'serving' || dev.state === 'unloading') {
      // Held for a replica this control plane does not adopt (or one it runs itself, at another epoch): reset it.
      const holder = d.ledger.holderOf(dev.gpu);
      const r = holder !== null && holder === dev.replica ? d.replicas.get(holder) : undefined;
      if (r && r.epoch === dev.epoch && !r.hasTag('failed') && d.ledger.gpuOf(dev.gpu)?.healthy) continue;
      if (lane0) d.watchdog.reclaim(dev.gpu);
      result.reclaimed.push(dev.gpu);
      d.timeline.log({ kind: 'gpu.reclaimed', gpu: dev.gpu, ...(dev.replica ? { replica: dev.replica } : {}) });
    }
  }
  return result;
}
