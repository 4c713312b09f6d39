// Placement's timeline: the events it records for reports and the inspector, the GPU failures it detected, the
// requests replicas gave up, and the replica events it publishes to subscribers (health, the control plane).
import type { DetectionPath } from './detection.ts';

/** A timeline event of placement (for reports and the inspector). */
export interface PlacementEvent {
  t: number;
  kind:
    | 'replica.created'
    | 'replica.ready'
    | 'replica.failed'
    | 'replica.stopped'
    | 'gpu.failed'
    | 'gpu.ready'
    | 'unavailable'
    | 'available'
    | 'reservation.raised'
    | 'reservation.released'
    | 'drain.started'
    | 'loading.started'
    | 'mode.switched'
    | 'mode.forced'
    | 'node.stalled'
    | 'replica.adopted'
    | 'gpu.reclaimed';
  replica?: string;
  model?: string;
  gpu?: number;
  gpus?: number[];
  mode?: string;
  path?: DetectionPath;
  detail?: string;
}

/** What placement publishes about a replica: created on its GPUs, ready, failed (with why), removed (stopped). */
export type ReplicaEvent =
  | { kind: 'replica.created'; t: number; replica: string; model: string; gpus: readonly number[] }
  | { kind: 'replica.ready'; t: number; replica: string; model: string }
  | { kind: 'replica.failed'; t: number; replica: string; reason: string }
  | { kind: 'replica.removed'; t: number; replica: string };

/** A GPU failure as detected: when, how, and which replica held it. */
export interface FailureRecord {
  t: number;
  gpu: number;
  code: string;
  path: DetectionPath;
  replicas: string[];
  /** Bound of the path that found it (ms). */
  boundMs: number;
}

/** Requests a replica gave up at once (failure or drain deadline), with the tokens each had streamed. */
export interface InterruptionRecord {
  t: number;
  replica: string;
  reason: string;
  requests: { id: string; tokens: number }[];
}

/** The timeline of one placement actor. */
export interface Timeline {
  readonly events: PlacementEvent[];
  readonly failures: FailureRecord[];
  readonly interruptions: InterruptionRecord[];
  /** Records an event at the current time. */
  log(e: Omit<PlacementEvent, 't'>): void;
  recordFailure(f: FailureRecord): void;
  recordInterruption(i: InterruptionRecord): void;
  /** Tells every subscriber about a replica, at once. */
  publish(e: ReplicaEvent): void;
  /** Calls `fn` with every replica event from now on. */
  subscribe(fn: (e: ReplicaEvent) => void): void;
}

const MAX_RECORDS = 10_000;

/** Creates an empty timeline reading time from `now`. */
export function createTimeline(now: () => number): Timeline {
  const events: PlacementEvent[] = [];
  const failures: FailureRecord[] = [];
  const interruptions: InterruptionRecord[] = [];
  const subscribers: ((e: ReplicaEvent) => void)[] = [];
  return {
    events,
    failures,
    interruptions,
    log: (e) => {
      events.push({ t: now(), ...e });
    },
    recordFailure: (f) => {
      if (failures.length < MAX_RECORDS) failures.push(f);
    },
    recordInterruption: (i) => {
      if (interruptions.length < MAX_RECORDS) interruptions.push(i);
    },
    publish: (e) => {
      for (const fn of subscribers) fn(e);
    },
    subscribe: (fn) => {
      subscribers.push(fn);
    },
  };
}
