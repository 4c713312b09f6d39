// The DST's system of one seed: one virtual clock, the node agent's runtime, and the control plane, which can crash
// and restart. A crashed control plane is gone as a killed process is: its timers never fire again and its link is
// cut (frames in flight are lost); the new one starts on a fresh runtime and a fresh link, and the node agent, which
// kept running, registers again (abandons the work in flight and reports what it holds) as the live worker does.
import type { Rng } from '../../runtime/rng.ts';
import { createRuntime, type Runtime } from '../../runtime/system.ts';
import type { Clock, TimerId, VirtualClock } from '../../runtime/clock.ts';
import { startNodeAgent, type NodeAgent } from '../worker/agent.ts';
import { startControlPlane, type ControlPlane, type ControlPlaneMutations } from '../control-plane.ts';
import type { Scenario } from '../config.ts';
import { connectSimLink, type SimLink } from '../../transport/sim-link.ts';
import { DECODE_RUN_MS } from './simulate.ts';

/** One seed's system: virtual clock, the node's runtime, and the current control plane with its runtime and link. */
export interface DstSystem {
  clock: VirtualClock;
  nodeRt: Runtime;
  scenario: Scenario;
  /** The control plane serving now (the last one started; null while it is down). */
  cp: ControlPlane | null;
  /** Every control plane started, in order (a restart adds one). */
  planes: ControlPlane[];
  agent(): NodeAgent | null;
  startAgent(): void;
  stopAgent(): void;
  /** The link to the node: cut, healed and slowed; the state carries over to a restarted control plane's link. */
  cut(direction: 'both' | 'aToB' | 'bToA'): void;
  heal(): void;
  setExtraLatency(ms: number): void;
  /** Kills the control plane (as `kill -9`): nothing of it runs again. */
  crashControl(): void;
  /** Starts a new control plane on the same scenario; the node agent registers with it. */
  startControl(): ControlPlane;
  /** Messages the links carried, over every incarnation. */
  messages(): number;
}

/** A clock over `base` whose timers stop firing once killed (a dead process's timers). */
function killableClock(base: VirtualClock): { clock: Clock; kill(): void } {
  let alive = true;
  return {
    clock: {
      now: () => base.now(),
      setTimeout: (fn, ms): TimerId => base.setTimeout(() => alive && fn(), ms),
      clearTimeout: (id) => base.clearTimeout(id),
    },
    kill: () => {
      alive = false;
    },
  };
}

/** Builds a seed's system and starts its first control plane and the node agent. */
export function buildDstSystem(
  clock: VirtualClock,
  rng: Rng,
  scenario: Scenario,
  mutations: ControlPlaneMutations,
  speed: { stepByStep: boolean } = { stepByStep: false },
): DstSystem {
  const nodeRt = createRuntime({ name: 'node', clock, rng: rng.fork('node') });
  const { stepByStep } = speed;
  const gpus = Array.from({ length: scenario.node.gpus }, (_, i) => i);
  let agent: NodeAgent | null = null;
  let current: { link: SimLink; kill(): void } | null = null;
  let cutState: { aToB: boolean; bToA: boolean } = { aToB: false, bToA: false };
  let extra = 0;
  let retired = 0;
  // A node registers only over a link that works both ways: a restart during a partition waits for the heal.
  let registerPending = false;
  const register = (): void => {
    registerPending = false;
    if (!agent) return;
    agent.orphan();
    agent.announce();
  };
  const applyLink = (l: SimLink): void => {
    l.heal();
    if (cutState.aToB && cutState.bToA) l.cut('both');
    else if (cutState.aToB) l.cut('aToB');
    else if (cutState.bToA) l.cut('bToA');
    l.setExtraLatency(extra);
  };

  const sys: DstSystem = {
    clock,
    nodeRt,
    scenario,
    cp: null,
    planes: [],
    agent: () => agent,
    startAgent: () => {
      agent = startNodeAgent(nodeRt, {
        gpus,
        steps: { decodeRunMs: DECODE_RUN_MS },
        repairMs: scenario.node.repairMs,
        heartbeatMs: scenario.detection.heartbeatMs,
      });
    },
    stopAgent: () => {
      agent?.stop();
      agent = null;
      registerPending = false;
    },
    cut: (direction) => {
      if (direction !== 'bToA') cutState.aToB = true;
      if (direction !== 'aToB') cutState.bToA = true;
      if (current) applyLink(current.link);
    },
    heal: () => {
      cutState = { aToB: false, bToA: false };
      if (current) applyLink(current.link);
      if (registerPending && current) register();
    },
    setExtraLatency: (ms) => {
      extra = ms;
      current?.link.setExtraLatency(ms);
    },
    crashControl: () => {
      if (!current) return;
      current.kill();
      current.link.cut('both');
      retired += current.link.stats.messages;
      current = null;
      sys.cp = null;
    },
    startControl: () => {
      const n = sys.planes.length;
      // The first incarnation forks as the single control plane always did, so seeds without restarts are unchanged.
      const fork = n === 0 ? rng.fork('control') : rng.fork(`control#${n}`);
      const k = killableClock(clock);
      const name = n === 0 ? 'control' : `control#${n}`;
      const control = createRuntime({ name, clock: k.clock, rng: fork, stepByStep });
      const link = connectSimLink(control, nodeRt, clock, n === 0 ? rng.fork('link') : rng.fork(`link#${n}`), {
        latencyMs: 0.05,
        jitterMs: 0.02,
      });
      const cp = startControlPlane(control, scenario, { checkInvariants: true, keepTraces: true, mutations });
      current = { link, kill: k.kill };
      applyLink(link);
      sys.cp = cp;
      sys.planes.push(cp);
      // The node registers with the new control plane: the work in flight was the old one's; what is loaded stays.
      if (n > 0 && agent) {
        if (cutState.aToB || cutState.bToA) registerPending = true;
        else register();
      }
      return cp;
    },
    messages: () => retired + (current?.link.stats.messages ?? 0),
  };
  sys.startControl();
  sys.startAgent();
  return sys;
}
