// One node of a simulated fleet: a full switchyard node (control plane, node agent, the simulated link between them)
// on the fleet's shared virtual clock, with the metrics a cluster router reads and a way to lose the node.
import type { VirtualClock } from '../../runtime/clock.ts';
import type { Rng } from '../../runtime/rng.ts';
import { createRuntime } from '../../runtime/system.ts';
import { connectSimLink, type SimLink } from '../../transport/sim-link.ts';
import type { Scenario } from '../config.ts';
import { startControlPlane, type ControlPlane } from '../control-plane.ts';
import { viewOf } from '../router/router.ts';
import { startNodeAgent, type NodeAgent } from '../worker/agent.ts';

/** The gauges a Gateway API Inference Extension endpoint picker scrapes from a model server, for one model. */
export interface NodeGauges {
  /** Requests waiting: queued on replicas plus held for a replica. */
  waiting: number;
  running: number;
  /** KV-cache blocks in use over blocks in all, 0..1. */
  kvUsage: number;
}

/** A node of the fleet. */
export interface FleetNode {
  readonly id: string;
  readonly pool: string;
  readonly cp: ControlPlane;
  readonly agent: NodeAgent;
  /** False once the node's pod died. */
  alive: boolean;
  /** True once its initial placement has loaded and it serves. */
  ready(): boolean;
  /** The node's gauges for `model` as they are now. */
  gauges(model: string): NodeGauges;
  /** Predicted time to first token of a request of `model` on this node's best ready replica (ms), or null. */
  predictTtftMs(model: string, promptTokens: number, maxTokens: number): number | null;
  /** The pod dies: the link is cut both ways and the node takes no more work. */
  kill(): void;
  /** Invariant violations and actor faults on this node (each prefixed with its id), up to its death if it died. */
  violations(): string[];
  readonly link: SimLink;
}

/** Starts a node of pool `pool` on the fleet's clock; `scenario` is the node's own (its pool's models, exclusive). */
export function startFleetNode(
  id: string,
  pool: string,
  scenario: Scenario,
  clock: VirtualClock,
  rng: Rng,
  onIdle: () => void,
  opts: { stepByStep?: boolean } = {},
): FleetNode {
  const stepByStep = opts.stepByStep === true;
  const control = createRuntime({ name: `control.${id}`, clock, rng: rng.fork('control'), stepByStep });
  const nodeRt = createRuntime({ name: `node.${id}`, clock, rng: rng.fork('node') });
  const link = connectSimLink(control, nodeRt, clock, rng.fork('link'), {
    latencyMs: scenario.sim.latencyMs,
    jitterMs: scenario.sim.jitterMs,
    // The reference run keeps every frame through the codec; otherwise frames are envelope arrays (same report).
    codec: stepByStep,
  });
  const cp = startControlPlane(control, scenario, { checkInvariants: scenario.sim.checkInvariants, onIdle });
  const agent = startNodeAgent(nodeRt, {
    gpus: Array.from({ length: scenario.node.gpus }, (_, i) => i),
    repairMs: scenario.node.repairMs,
    heartbeatMs: scenario.detection.heartbeatMs,
  });
  const violations = (): string[] => [
    ...cp.violations.map((v) => `${id}: ${v}`),
    ...[...control.faults, ...nodeRt.faults].map((f) => `${id}: ${f.actor}: ${String(f.error)}`),
  ];
  let atDeath: string[] | null = null;
  const node: FleetNode = {
    id,
    pool,
    cp,
    agent,
    link,
    alive: true,
    ready: () => node.alive && cp.placement.settled() && cp.placement.replicas.size > 0,
    gauges: (model) => gaugesOf(cp, model),
    predictTtftMs: (model, promptTokens, maxTokens) => predictTtft(cp, model, promptTokens, maxTokens),
    kill: () => {
      // What it found until its pod died: after that its control plane runs on without its node, which is not a fault.
      atDeath = violations();
      node.alive = false;
      link.cut('both');
    },
    violations: () => atDeath ?? violations(),
  };
  return node;
}

function gaugesOf(cp: ControlPlane, model: string): NodeGauges {
  let waiting = 0;
  let running = 0;
  let used = 0;
  let total = 0;
  for (const r of cp.placement.replicas.values()) {
    if (r.model !== model) continue;
    const st = r.work.gauges();
    waiting += st.waiting;
    running += st.running;
    used += st.blocksUsed;
    total += st.blocksTotal;
  }
  return { waiting, running, kvUsage: total > 0 ? used / total : 0 };
}

function predictTtft(cp: ControlPlane, model: string, promptTokens: number, maxTokens: number): number | null {
  let best: number | null = null;
  for (const r of cp.placement.replicas.values()) {
    if (r.model !== model) continue;
    const v = viewOf(r);
    if (!v.ready() || cp.health.ejected(r.id)) continue;
    const est = v.estimate({ promptTokens, estOutputTokens: maxTokens, priority: 0 }, cp.health.ratio(r.id));
    if (!est.headroom && est.kvWaitMs === Infinity) continue;
    const ttft = est.ttftMs + est.kvWaitMs;
    if (best === null || ttft < best) best = ttft;
  }
  return best;
}
