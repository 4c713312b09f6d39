// A simulated node whose worker process can be paused as SIGSTOP/SIGCONT pauses it: while stalled, none of the
// worker's timers run (steps, heartbeats, loads, probes) and messages to it wait unread; when it resumes, its overdue
// timers run first and then it reads what arrived, as a resumed Node.js process does (timers phase before I/O).
import { normalizeScenario, type Scenario } from '../../../actors/config.ts';
import { startControlPlane, type ControlPlane } from '../../../actors/control-plane.ts';
import { startNodeAgent } from '../../../actors/worker/agent.ts';
import { createVirtualClock, type Clock, type TimerId, type VirtualClock } from '../../../runtime/clock.ts';
import { createRng } from '../../../runtime/rng.ts';
import { createRuntime, type Msg, type Runtime } from '../../../runtime/system.ts';
import { connectSimLink } from '../../../transport/sim-link.ts';

/** A worker that can be paused. */
interface Pausable {
  clock: Clock;
  /** The runtime the link delivers into: its `send` waits while the worker is paused. */
  inbox(rt: Runtime): Runtime;
  pause(ms: number): void;
}

function pausable(inner: VirtualClock): Pausable {
  let until = -Infinity;
  const timers: (() => void)[] = [];
  const mail: (() => void)[] = [];
  const paused = (): boolean => inner.now() < until;
  const cancelled = new Set<TimerId>();
  const clock: Clock = {
    now: () => inner.now(),
    setTimeout: (fn, ms) => {
      const id: TimerId = inner.setTimeout(() => {
        if (paused()) timers.push(() => !cancelled.has(id) && fn());
        else fn();
      }, ms);
      return id;
    },
    clearTimeout: (id) => {
      cancelled.add(id);
      inner.clearTimeout(id);
    },
  };
  return {
    clock,
    inbox: (rt) => ({
      ...rt,
      send: (to: string, msg: Msg) => {
        if (paused()) mail.push(() => rt.send(to, msg));
        else rt.send(to, msg);
      },
    }),
    pause: (ms) => {
      until = inner.now() + ms;
      inner.setTimeout(() => {
        until = -Infinity;
        for (const run of timers.splice(0)) run();
        for (const read of mail.splice(0)) read();
      }, ms);
    },
  };
}

/** One request's stream as the client saw it. */
export interface Stream {
  tokens: number;
  gaps: number;
  outcome: string | null;
  code: string | null;
  terminals: number;
}

/** A control plane and a pausable worker on one virtual clock. */
export interface StallWorld {
  clock: VirtualClock;
  cp: ControlPlane;
  /** Pauses the worker for `ms` (SIGSTOP now, SIGCONT after ms). */
  pause(ms: number): void;
  /** Submits a request and records its stream. */
  submit(model: string, promptTokens: number, outputTokens: number): Stream;
  /** Runs the clock until `ms` from now, or until every request ended if `untilIdle`. */
  run(ms: number): void;
}

/** Boots the node for `scenario` and returns once its placement is settled. */
export function stallWorld(scenario: Scenario): StallWorld {
  const clock = createVirtualClock();
  const rng = createRng(scenario.seed);
  const control = createRuntime({ name: 'control', clock, rng: rng.fork('control') });
  const worker = pausable(clock);
  const nodeRt = createRuntime({ name: 'node', clock: worker.clock, rng: rng.fork('node') });
  connectSimLink(control, worker.inbox(nodeRt), clock, rng.fork('link'), { latencyMs: 0.05, jitterMs: 0 });
  const cp = startControlPlane(control, scenario, { checkInvariants: true });
  startNodeAgent(nodeRt, {
    gpus: Array.from({ length: scenario.node.gpus }, (_, i) => i),
    repairMs: scenario.node.repairMs,
    heartbeatMs: scenario.detection.heartbeatMs,
  });
  let stopAt = Infinity;
  cp.placement.watch(() => {
    if (stopAt === Infinity && cp.placement.settled()) clock.stop();
  });
  clock.run(600_000);
  if (!cp.placement.settled()) throw new Error('the initial placement did not load');
  stopAt = 0;
  return {
    clock,
    cp,
    pause: worker.pause,
    submit: (model, promptTokens, outputTokens) => {
      const s: Stream = { tokens: 0, gaps: 0, outcome: null, code: null, terminals: 0 };
      cp.submit(
        { model, promptTokens, maxTokens: outputTokens, outputTokens },
        {
          tokens: (_id, seq, n) => {
            if (seq !== s.tokens) s.gaps++;
            s.tokens = seq + n;
          },
          terminal: (_id, o) => {
            s.terminals++;
            s.outcome = o.outcome;
            s.code = o.code;
          },
        },
      );
      return s;
    },
    run: (ms) => {
      clock.run(clock.now() + ms);
    },
  };
}

/** Eight single-GPU replicas of llama-3-8b under `exclusive` placement, with the given detection settings. */
export function smallNode(detection: Record<string, number>, repairMs = 60_000): Scenario {
  return normalizeScenario({
    name: 'stall',
    seed: 3,
    node: { gpu: 'H100-SXM', gpus: 8, repairMs },
    placement: { policy: 'exclusive' },
    detection,
    routing: { ejection: { failures: 1000 } },
    models: [
      {
        name: 'small',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: 8,
        classes: { interactive: { ttftMs: 60_000, tpotMs: 1000, maxQueueMs: 120_000 } },
        resume: { maxResumes: 3, budgetMs: 120_000 },
      },
    ],
    traffic: [],
  });
}
