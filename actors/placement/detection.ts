// GPU-failure detection beyond reported faults: missed heartbeats (a GPU or a whole node went silent) and no step
// progress while work is in flight (a hung rank). Checks run as heartbeats arrive; a node that stops sending them
// entirely is caught by a timer re-armed on every heartbeat.
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
  /** Reports GPUs found failed. */
  onDetected(found: Detected[]): void;
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

/** Creates a detector. */
export function createDetector(d: DetectorDeps): Detector {
  const lastSeen = new Map<number, number>();
  const period = (): number => (d.config.heartbeatMs > 0 ? d.config.heartbeatMs : 500);
  let nodeTimer: TimerId | null = null;

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
      for (const g of gpus ?? d.live()) lastSeen.set(g, now);
      const found: Detected[] = [];
      for (const g of d.live()) {
        if (now - (lastSeen.get(g) ?? now) > silentMs)
          found.push({ gpu: g, code: 'heartbeat_missed', path: 'heartbeat' });
      }
      for (const s of d.inflight()) {
        if (now - s.since <= d.config.progressFactor * s.predictedMs + d.config.progressSlackMs) continue;
        // The ranks that never reported are the hung ones; if none did, the whole step is stuck on all of them.
        const stuck = s.devices.filter((x) => !s.reported.includes(x));
        for (const x of stuck.length > 0 ? stuck : s.devices) {
          const g = d.physical(x);
          if (!found.some((f) => f.gpu === g))
            found.push({ gpu: g, code: 'step_stalled', path: 'progress', stepMs: s.predictedMs });
        }
      }
      if (nodeTimer !== null) d.clock.clearTimeout(nodeTimer);
      nodeTimer = d.clock.setTimeout(nodeLost, (d.config.missedHeartbeats + 1) * period());
      if (found.length > 0) d.onDetected(found);
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
