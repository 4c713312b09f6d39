// GPU-failure detection beyond reported faults: missed heartbeats (a GPU or a whole node went silent) and no step
// progress while work is in flight (a hung rank), or no load progress while a replica loads. Checks run as heartbeats
// arrive; a node that stops sending them entirely is caught by a timer re-armed on every heartbeat. A node silent as a
// whole and then back (a paused process, a stalled host) is one stall of the node: the time it was silent counts
// against none of its steps. Ranks whose step or load is overdue are suspects until they report.
import type { Clock, TimerId } from '../../runtime/clock.ts';
import type { DetectionConfig } from './config.ts';

/** How a failure was detected. */
export type DetectionPath = 'reported' | 'heartbeat' | 'progress';

/** A GPU the detector found failed. */
export interface Detected {
  gpu: number;
  code: string;
  path: DetectionPath;
  /** The stalled step's predicted time (progress path), for its bound. */
  stepMs?: number;
}

/** A step in flight on a replica, as the progress check sees it. */
export interface InflightStep {
  replica: string;
  devices: readonly number[];
  since: number;
  predictedMs: number;
  reported: readonly number[];
}

/** A replica loading on its devices, as the load-progress check sees it. */
export interface LoadingReplica {
  replica: string;
  devices: readonly number[];
}

/** What the detector reads from placement. */
export interface DetectorDeps {
  clock: Clock;
  config: DetectionConfig;
  /** Physical GPU of a device. */
  physical(device: number): number;
  /** Physical GPUs placement considers healthy and up. */
  live(): Iterable<number>;
  /** Steps in flight on replicas that are serving or draining. */
  inflight(): Iterable<InflightStep>;
  /** Replicas loading (their devices report load progress with each heartbeat: listed means progressing). */
  loading?(): Iterable<LoadingReplica>;
  /** Reports GPUs found failed. */
  onDetected(found: Detected[]): void;
  /** The physical GPUs suspected of hanging now (overdue step or load, or missing from the last heartbeat). */
  onSuspects?(gpus: ReadonlySet<number>): void;
  /** The node was silent as a whole from `since` and is back at `until` (ms). */
  onStall?(since: number, until: number): void;
}

/** The detector of one placement actor. */
export interface Detector {
  /** A node heartbeat arrived listing the GPUs that answered its health check (all when absent). */
  heartbeat(gpus: readonly number[] | undefined): void;
  /** A GPU came up (or back): its heartbeat clock starts now. */
  up(gpu: number): void;
  /** Bounds of each path, in ms, for a step predicted at `stepMs` (reports). */
  bounds(stepMs: number): Record<DetectionPath, number>;
}

/** Adds a detection of `g` unless one is already found (module-level: heartbeats call it every period). */
function addFound(found: Detected[], g: number, code: string, path: DetectionPath, stepMs?: number): void {
  if (!found.some((f) => f.gpu === g)) found.push({ gpu: g, code, path, ...(stepMs !== undefined ? { stepMs } : {}) });
}

/** How long past its prediction a step may run before it counts as stalled. */
function toleranceOf(c: { progressFactor: number; progressSlackMs: number }, stepMs: number): number {
  return c.progressFactor * stepMs + c.progressSlackMs;
}

/** Creates a detector. */
export function createDetector(d: DetectorDeps): Detector {
  const lastSeen = new Map<number, number>();
  const period = (): number => (d.config.heartbeatMs > 0 ? d.config.heartbeatMs : 500);
  let nodeTimer: TimerId | null = null;
  let lastBeat: number | null = null;
  let resumedAt = -Infinity;

  const nodeLost = (): void => {
    nodeTimer = null;
    const found: Detected[] = [];
    for (const g of d.live()) found.push({ gpu: g, code: 'node_lost', path: 'heartbeat' });
    if (found.length > 0) d.onDetected(found);
  };

  return {
    up: (gpu) => {
      lastSeen.set(gpu, d.clock.now());
    },
    heartbeat: (gpus) => {
      const now = d.clock.now();
      const silentMs = d.config.missedHeartbeats * period();
      // Silent as a whole for over two periods, now back: one stall of the node, not a fault of each rank.
      if (lastBeat !== null && now - lastBeat > 2 * period()) {
        resumedAt = now;
        d.onStall?.(lastBeat, now);
      }
      lastBeat = now;
      for (const g of gpus ?? d.live()) lastSeen.set(g, now);
      const found: Detected[] = [];
      const suspects = new Set<number>();
      for (const g of d.live()) {
        const seen = lastSeen.get(g) ?? now;
        if (now - seen > silentMs) addFound(found, g, 'heartbeat_missed', 'heartbeat');
        else if (seen < now) suspects.add(g);
      }
      for (const s of d.inflight()) {
        // The ranks that never reported are the hung ones; if none did, the whole step is stuck on all of them.
        const stuck = s.devices.filter((x) => !s.reported.includes(x));
        const ranks = stuck.length > 0 ? stuck : s.devices;
        const age = now - Math.max(s.since, resumedAt);
        if (age <= toleranceOf(d.config, s.predictedMs)) {
          if (age > s.predictedMs + period()) for (const x of ranks) suspects.add(d.physical(x));
          continue;
        }
        for (const x of ranks) addFound(found, d.physical(x), 'step_stalled', 'progress', s.predictedMs);
      }
      // A loading device makes no progress while it is missing from heartbeats: judged like a step of no length.
      for (const r of d.loading?.() ?? []) {
        for (const x of r.devices) {
          const g = d.physical(x);
          const seen = Math.max(lastSeen.get(g) ?? now, resumedAt);
          if (now - seen > toleranceOf(d.config, 0)) addFound(found, g, 'load_stalled', 'progress', 0);
        }
      }
      if (nodeTimer !== null) d.clock.clearTimeout(nodeTimer);
      nodeTimer = d.clock.setTimeout(nodeLost, (d.config.missedHeartbeats + 1) * period());
      if (found.length > 0) d.onDetected(found);
      for (const f of found) suspects.delete(f.gpu);
      d.onSuspects?.(suspects);
    },
    bounds: (stepMs) => ({
      reported: d.config.reportMs,
      // Last seen at most one period before it went silent; checked as each later heartbeat arrives.
      heartbeat: (d.config.missedHeartbeats + 1) * period() + d.config.reportMs,
      // The step started at most one step before the hang; checked as each heartbeat arrives.
      progress: stepMs + d.config.progressFactor * stepMs + d.config.progressSlackMs + period() + d.config.reportMs,
    }),
  };
}
