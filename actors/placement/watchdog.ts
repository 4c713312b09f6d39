// Placement's detection wiring: GPUs coming up, reported faults, node heartbeats and the detector's findings become
// GPU ledger changes, `gpu.failed` for the replicas holding them, and fences for the node (repeated on heartbeats until
// the node confirms them, since a fence may be lost in a partition, each with an id so that the node applies it once);
// suspected GPUs; stalls of the whole node; a lost node's GPUs failed as one event.
import type { Msg, Runtime } from '../../runtime/system.ts';
import type { Scenario } from '../config.ts';
import type { ReplicaHandle } from '../replica.ts';
import { createDetector, type Detected, type DetectionPath, type InflightStep } from './detection.ts';
import type { GpuLedger } from './ledger.ts';
import type { Timeline } from './timeline.ts';

/** What the watchdog works on. */
export interface WatchdogDeps {
  runtime: Runtime;
  scenario: Scenario;
  ledger: GpuLedger;
  replicas: ReadonlyMap<string, ReplicaHandle>;
  timeline: Timeline;
  /** A GPU failed or came back: the placement machine hears of it. */
  gpuFailed(gpu: number): void;
  gpuRepaired(gpu: number): void;
  /** Runs the reconciler on the next turn. */
  schedule(): void;
  /** Runs `fn` and hands on the requests it interrupted after it (Reconciler.together). */
  together(fn: () => void): void;
}

/** The watchdog of one placement actor. */
export interface Watchdog {
  /** Handles a node message addressed to placement (`gpu.ready`, `gpu.failed`, `node.heartbeat`); false if not one. */
  handle(msg: Msg): boolean;
  /** Milliseconds each detection path may take at most (for a step predicted at stepMs). */
  bounds(stepMs: number): Record<DetectionPath, number>;
  /** Takes GPU g out of service at the node without failing it here (a device a restarted control plane cannot
   * adopt): the node resets it and reports it ready again. A fence still pending for g is reused, not doubled. */
  reclaim(g: number): void;
  /** Fence ids continue past `applied` (the highest the node applied, from its inventory). */
  continueFences(applied: number): void;
  /** A device the node reports probed and free (or serving a replica adopted now). */
  deviceUp(d: number): void;
  /** A GPU the node reports failed (in its inventory). */
  failedAtNode(g: number): void;
}

/** The code of a fence that reclaims a device nobody adopted; its `gpu.failed` echo is not a fault. */
export const RECLAIM_CODE = 'reclaimed';

// Module-level generators, not written inline per watchdog: a generator object's hidden class comes from its function,
// so a generator per watchdog gave each simulation's iterators a class of their own (and V8 deoptimized the detector).
function* inflightOf(replicas: Iterable<ReplicaHandle>): Generator<InflightStep> {
  for (const r of replicas) {
    const f = r.inflight();
    if (f && r.hasTag('serving')) yield { replica: r.id, devices: r.gpus, ...f };
  }
}
function* loadingOf(replicas: Iterable<ReplicaHandle>): Generator<{ replica: string; devices: readonly number[] }> {
  for (const r of replicas) if (r.hasTag('loading')) yield { replica: r.id, devices: r.gpus };
}

/** Wires a detector to the ledger and the replicas. */
export function createWatchdog(d: WatchdogDeps): Watchdog {
  const { runtime, ledger, replicas, timeline } = d;
  const now = (): number => runtime.clock.now();
  // Fences the node has not confirmed, with the heartbeats heard since each was sent.
  const fencing = new Map<number, { code: string; beats: number; id: number }>();
  let nextFence = 1;
  const sendFence = (g: number, code: string): void => {
    const id = fencing.get(g)?.id ?? nextFence++;
    fencing.set(g, { code, beats: 0, id });
    runtime.send('node', { type: 'gpu.fence', gpu: g, code, fence: id });
  };

  const failGpu = (found: Detected): void => {
    const rec = ledger.gpus.get(found.gpu);
    if (!rec || !rec.healthy) return;
    ledger.setHealthy(rec.index, false);
    rec.up = false;
    const lanes = ledger.lanes(found.gpu);
    const holders = lanes.map(ledger.holderOf).filter((x): x is string => x !== null);
    const boundMs = detector.bounds(found.stepMs ?? 0)[found.path];
    timeline.recordFailure({
      t: now(),
      gpu: found.gpu,
      code: found.code,
      path: found.path,
      replicas: holders,
      boundMs,
    });
    timeline.log({ kind: 'gpu.failed', gpu: found.gpu, path: found.path, detail: found.code });
    for (const dev of lanes) {
      ledger.deviceDown(dev);
      const h = ledger.holderOf(dev);
      if (h && replicas.has(h)) runtime.send(h, { type: 'gpu.failed', gpu: dev, code: found.code });
    }
    // A GPU the control plane declared failed (rather than one that reported it) is taken out of service at the node;
    // the fence is repeated on later heartbeats until the node confirms it (it may be lost in a partition).
    if (found.path !== 'reported') sendFence(found.gpu, found.code);
    d.gpuFailed(found.gpu);
  };

  const detector = createDetector({
    clock: runtime.clock,
    config: d.scenario.detection,
    physical: (dev) => dev % ledger.n,
    live: ledger.live,
    inflight: () => inflightOf(replicas.values()),
    loading: () => loadingOf(replicas.values()),
    onDetected: (found) => {
      // Several GPUs at once (a lost node): all of them fail before any interrupted request is resumed elsewhere.
      if (found.length > 1) d.together(() => found.forEach(failGpu));
      else for (const f of found) failGpu(f);
      d.schedule();
    },
    onSuspects: (now) => {
      let cleared = false;
      for (const rec of ledger.gpus.values()) {
        const was = ledger.suspected(rec.index);
        if (was === now.has(rec.index)) continue;
        ledger.suspect(rec.index, !was);
        if (was && rec.healthy) cleared = true;
      }
      // A GPU no longer suspected may be given to the replica that waited for it.
      if (cleared) d.schedule();
    },
    onStall: (since, until) =>
      timeline.log({ kind: 'node.stalled', detail: `silent for ${Math.round(until - since)} ms, then back` }),
  });

  const gpuReady = (dev: number): void => {
    const rec = ledger.gpuOf(dev);
    if (!rec) return;
    ledger.deviceUp(dev);
    if (ledger.laneOf(dev) === 0) {
      // Probed and free: whatever it was suspected of, it answers now, and a fence still waiting for its
      // confirmation is moot (the node reset or restarted it); repeated later, it would reset a GPU given anew.
      ledger.suspect(rec.index, false);
      fencing.delete(rec.index);
      const back = !rec.healthy;
      rec.up = true;
      ledger.setHealthy(rec.index, true);
      detector.up(rec.index);
      timeline.log({ kind: 'gpu.ready', gpu: rec.index, ...(back ? { detail: 'repaired' } : {}) });
      if (back) d.gpuRepaired(rec.index);
    }
    d.schedule();
  };

  return {
    handle: (msg) => {
      switch (msg.type) {
        case 'gpu.ready':
          gpuReady(msg.gpu);
          return true;
        case 'gpu.failed':
          fencing.delete(msg.gpu % ledger.n);
          // A reclaimed device echoes its fence on its way to a reset: it is not broken, and gpu.ready follows.
          if (msg.code === RECLAIM_CODE) return true;
          failGpu({ gpu: msg.gpu % ledger.n, code: msg.code, path: 'reported' });
          d.schedule();
          return true;
        case 'node.lost':
          d.together(() => {
            for (const g of msg.gpus) failGpu({ gpu: g % ledger.n, code: msg.code, path: 'reported' });
          });
          d.schedule();
          return true;
        case 'node.heartbeat':
          // Repeated from the second heartbeat after it was sent: the first may have been sent before the node read
          // it (a node back from a stall sends its overdue heartbeat first, then reads the fences that waited).
          for (const [g, f] of fencing)
            if (++f.beats >= 2) runtime.send('node', { type: 'gpu.fence', gpu: g, code: f.code, fence: f.id });
          detector.heartbeat(msg.gpus);
          return true;
        default:
          return false;
      }
    },
    bounds: (stepMs) => detector.bounds(stepMs),
    reclaim: (g) => sendFence(g, fencing.get(g)?.code ?? RECLAIM_CODE),
    continueFences: (applied) => {
      nextFence = Math.max(nextFence, applied + 1);
    },
    deviceUp: (dev) => gpuReady(dev),
    failedAtNode: (g) => failGpu({ gpu: g, code: 'failed_at_node', path: 'reported' }),
  };
}
