// A fleet in the simulator: pools of full switchyard nodes on one virtual clock behind a cluster router, with node
// loss (a pod dies; its requests are resumed on another node of the pool or end typed) and rescheduling (a new pod
// boots and loads after a delay). The same seed gives the same report, byte for byte.
import { createVirtualClock, type VirtualClock } from '../../runtime/clock.ts';
import { createRng, type Rng } from '../../runtime/rng.ts';
import type { Scenario } from '../config.ts';
import type { ClientListener } from '../control-plane.ts';
import { summarize, type Summary } from '../metrics/histogram.ts';
import { createArrivalStream, type Arrival } from '../sim/traffic.ts';
import type { FleetSpec } from './config.ts';
import { startFleetNode, type FleetNode } from './node.ts';
import { createFleetRouter, type FleetRouter, type FleetRouterPolicy } from './router.ts';

/** The outcome of one request at the fleet's edge. */
type FleetOutcome = 'done' | 'rejected' | 'expired' | 'failed' | 'cancelled';

/** The report of a fleet simulation. */
export interface FleetReport {
  scenario: string;
  seed: number;
  router: FleetRouterPolicy;
  pools: Record<string, { nodes: number; models: string[] }>;
  requests: Record<string, number> & { total: number };
  models: Record<string, { requests: Record<string, number>; ttftMs: Summary; tpotMs: Summary }>;
  /** The requests live on a lost node when it died, by their final outcome (and how many were resumed). */
  lostNode: { node: string; at: number; live: number; resumed: number; outcomes: Record<string, number> }[];
  /** Nodes started after a loss, with the virtual time (s, from the fleet's start) each became ready. */
  rescheduled: { node: string; readyAtS: number | null }[];
  /** Every node's invariant violations and actor faults (a lost node's until its pod died), node by node. */
  invariants: { violations: string[] };
  sim: { requests: number; simulatedSeconds: number; wallSeconds?: number };
}

/** Options of a fleet run. */
export interface FleetOptions {
  seed?: number;
  router?: FleetRouterPolicy;
  /** Include wall time in the report (breaks byte-identity across runs). */
  wall?: boolean;
  /** The reference run: every frame through the codec and every step through the replica machines (see simulate). */
  stepByStep?: boolean;
}

/** One request as the fleet's edge sees it across the nodes it visits. */
interface FleetRequest {
  arrival: Arrival;
  node: FleetNode | null;
  /** Bumped when the request leaves a node, so that node's late callbacks are ignored. */
  generation: number;
  nodeRequestId: string;
  streamed: number;
  receivedAt: number;
  firstTokenAt: number;
  lastTokenAt: number;
  resumes: number;
  outcome: FleetOutcome | null;
  code: string | null;
  /** Index into the report's lostNode list, when it was live on a node that died. */
  lostOn: number;
}

/** Longest the fleet's initial nodes may take to load (virtual ms). */
const BOOT_LIMIT_MS = 600_000;
/** How many times a request may be resumed on another node after its node died. */
const MAX_RESUMES = 2;

/** The scenario of one node of `pool`: the pool's models only, placed exclusively, filling the node. */
export function nodeScenario(base: Scenario, pool: FleetSpec['pools'][number]): Scenario {
  const models = base.models
    .filter((m) => pool.models.includes(m.name))
    .map((m) => ({ ...m, replicas: pool.models.length === 1 ? Math.floor(base.node.gpus / m.tp) : m.replicas }));
  const placement =
    pool.placement === 'switch'
      ? { ...base.placement, policy: 'switch' as const }
      : { ...base.placement, policy: 'exclusive' as const };
  return {
    ...base,
    name: `${base.name}/${pool.name}`,
    models,
    placement,
    traffic: base.traffic.filter((t) => pool.models.includes(t.model)),
    faults: [],
  };
}

/** Runs a fleet to completion in virtual time and returns its report. */
export function simulateFleet(base: Scenario, fleet: FleetSpec, opts: FleetOptions = {}): FleetReport {
  const wallStart = performance.now();
  const seed = opts.seed ?? base.seed;
  const policy = opts.router ?? fleet.router;
  const clock = createVirtualClock();
  const rng = createRng(seed);
  const router = createFleetRouter(policy, rng.fork('fleet-router'));
  const run = createFleetRun(base, fleet, clock, rng, { router, stepByStep: opts.stepByStep === true });
  const origin = run.boot();
  run.start(origin);
  clock.run(origin + base.sim.maxSimSeconds * 1000);
  const report = run.report(policy, seed, clock.now() - origin, origin);
  if (opts.wall) report.sim.wallSeconds = Math.round((performance.now() - wallStart) / 10) / 100;
  return report;
}

/** The fleet's edge router, and whether its nodes run step by step (see FleetOptions). */
interface FleetEdge {
  router: FleetRouter;
  stepByStep: boolean;
}

/** The state of one fleet run: its nodes, the edge's requests, arrivals, losses and rescheduling. */
function createFleetRun(base: Scenario, fleet: FleetSpec, clock: VirtualClock, rng: Rng, edge: FleetEdge) {
  const { router } = edge;
  const nodes: FleetNode[] = [];
  const scenarios = new Map(fleet.pools.map((p) => [p.name, nodeScenario(base, p)]));
  const poolsOf = (model: string): Set<string> =>
    new Set(fleet.pools.filter((p) => p.models.includes(model)).map((p) => p.name));
  const requests: FleetRequest[] = [];
  const lost: FleetReport['lostNode'] = [];
  const rescheduled: { node: string; startedAt: number; readyAt: number | null }[] = [];
  const modelNames = base.models.map((m) => m.name);
  let pending = 0;
  let live = 0;
  let origin = 0;
  const nodeCount = new Map<string, number>();

  const maybeStop = (): void => {
    if (pending === 0 && live === 0 && nodes.every((n) => !n.alive || n.cp.placement.settled())) clock.stop();
  };
  const addNode = (pool: string): FleetNode => {
    const k = nodeCount.get(pool) ?? 0;
    nodeCount.set(pool, k + 1);
    const id = `${pool}-${k}`;
    const n = startFleetNode(id, pool, scenarios.get(pool)!, clock, rng.fork(`node:${id}`), maybeStop, edge);
    n.cp.placement.watch(maybeStop);
    nodes.push(n);
    return n;
  };
  const finish = (r: FleetRequest, outcome: FleetOutcome, code: string | null): void => {
    if (r.outcome !== null) return;
    r.outcome = outcome;
    r.code = code;
    live--;
    if (r.lostOn >= 0) {
      const o = lost[r.lostOn]!.outcomes;
      o[outcome] = (o[outcome] ?? 0) + 1;
    }
    maybeStop();
  };
  const send = (r: FleetRequest, allowed: Set<string>): boolean => {
    const a = r.arrival;
    const candidates = nodes.filter((n) => allowed.has(n.pool) && n !== r.node && n.ready());
    const node = router.pick(a.model, a.promptTokens + r.streamed, a.maxTokens - r.streamed, candidates);
    if (!node) return false;
    const gen = ++r.generation;
    r.node = node;
    const spec = {
      model: a.model,
      priority: a.priority,
      promptTokens: a.promptTokens + r.streamed,
      maxTokens: a.maxTokens - r.streamed,
      outputTokens: a.outputTokens - r.streamed,
    };
    const res = node.cp.submit(spec, visitListener(r, gen, edge.stepByStep, finish));
    r.nodeRequestId = res.id;
    if (!res.ok) finish(r, 'rejected', res.failure.code);
    return true;
  };
  const admit = (a: Arrival): void => {
    const r: FleetRequest = {
      arrival: a,
      node: null,
      generation: 0,
      nodeRequestId: '',
      streamed: 0,
      receivedAt: clock.now(),
      firstTokenAt: -1,
      lastTokenAt: -1,
      resumes: 0,
      outcome: null,
      code: null,
      lostOn: -1,
    };
    requests.push(r);
    live++;
    if (!send(r, poolsOf(a.model))) finish(r, 'rejected', 'model_unavailable');
  };
  const loseNode = (node: FleetNode): void => {
    node.kill();
    const idx = lost.push({ node: node.id, at: (clock.now() - origin) / 1000, live: 0, resumed: 0, outcomes: {} }) - 1;
    for (const r of requests) {
      if (r.outcome !== null || r.node !== node) continue;
      lost[idx]!.live++;
      r.lostOn = idx;
      // The tokens it streamed on the dead node (the last one's time matters only to a visit that ends done).
      if (!edge.stepByStep) {
        const p = node.cp.progress(r.nodeRequestId);
        if (p) addVisit(r, p.tokens, p.firstTokenAt, r.lastTokenAt);
      }
      r.generation++; // the dead node's late callbacks are ignored from here on
      node.cp.cancel(r.nodeRequestId);
      const canResume = r.resumes < MAX_RESUMES && r.streamed < r.arrival.outputTokens;
      if (canResume && send(r, new Set([node.pool]))) {
        r.resumes++;
        lost[idx]!.resumed++;
      } else finish(r, 'failed', 'replica_failed');
    }
    // Kubernetes reschedules the pod: a new node of the pool boots after the delay and loads its models.
    pending++;
    clock.at(clock.now() + fleet.rescheduleS * 1000, () => {
      pending--;
      const n = addNode(node.pool);
      const entry = { node: n.id, startedAt: clock.now(), readyAt: null as number | null };
      rescheduled.push(entry);
      n.cp.placement.watch(() => {
        if (entry.readyAt === null && n.ready()) entry.readyAt = clock.now();
      });
    });
  };

  return {
    /** Starts every pool's nodes and runs until they serve; returns the fleet's time 0. */
    boot: (): number => {
      for (const p of fleet.pools) for (let i = 0; i < p.nodes; i++) addNode(p.name);
      clock.run(BOOT_LIMIT_MS);
      if (!nodes.every((n) => n.ready())) throw new Error('the fleet did not load: a node has no placement');
      origin = clock.now();
      return origin;
    },
    /** Schedules arrivals, node losses and the gauges' scrapes from `t0`. */
    start: (t0: number): void => {
      scheduleArrivals(base, clock, rng.fork('traffic'), t0, {
        before: () => pending++,
        arrive: (a) => {
          pending--;
          admit(a);
          maybeStop();
        },
      });
      for (const l of fleet.nodeLoss) {
        pending++;
        clock.at(t0 + l.at * 1000, () => {
          pending--;
          const victim = nodes.filter((n) => n.pool === l.pool && n.alive)[l.node];
          if (victim) loseNode(victim);
          maybeStop();
        });
      }
      const scrape = (): void => {
        router.scrape(nodes, modelNames);
        if (pending > 0 || live > 0) clock.at(clock.now() + fleet.scrapeMs, scrape);
      };
      scrape();
    },
    report: (policy: FleetRouterPolicy, seed: number, simMs: number, t0: number): FleetReport =>
      buildFleetReport(base, fleet, {
        ...{ policy, seed, simMs, t0, requests, lost, rescheduled, nodeCount },
        violations: nodes.flatMap((n) => n.violations()),
      }),
  };
}

/** Adds a visit's `tokens` (the first at `first`, the last at `last`) to the request (the fast run). */
function addVisit(r: FleetRequest, tokens: number, first: number, last: number): void {
  if (tokens <= 0) return;
  if (r.firstTokenAt < 0) r.firstTokenAt = first;
  r.lastTokenAt = last;
  r.streamed += tokens;
}

/** What the edge hears of a request's visit `gen` to a node. The fast run takes the visit's tokens from its terminal
 * outcome (and from the control plane's `progress` when the node dies) rather than token by token; the reference run
 * (`perToken`, step by step) counts every token as it streams. The same report either way. */
function visitListener(
  r: FleetRequest,
  gen: number,
  perToken: boolean,
  finish: (r: FleetRequest, outcome: FleetOutcome, code: string | null) => void,
): ClientListener {
  if (perToken)
    return {
      tokens: (_id, _seq, n, t) => {
        if (r.generation !== gen) return;
        if (r.firstTokenAt < 0) r.firstTokenAt = t;
        r.lastTokenAt = t;
        r.streamed += n;
      },
      terminal: (_id, o) => {
        if (r.generation === gen) finish(r, o.outcome, o.code);
      },
    };
  return {
    terminal: (_id, o) => {
      if (r.generation !== gen) return;
      addVisit(r, o.tokens, o.timings.firstTokenAt, o.timings.finishedAt);
      finish(r, o.outcome, o.code);
    },
  };
}

/** Feeds every traffic stream's arrivals to `on.arrive` at their times from `t0`, one pending arrival per stream. */
function scheduleArrivals(
  base: Scenario,
  clock: VirtualClock,
  rng: Rng,
  t0: number,
  on: { before(): void; arrive(a: Arrival): void },
): void {
  base.traffic.forEach((_, i) => {
    const s = createArrivalStream(base, i, rng);
    const pump = (): void => {
      const a = s.next();
      if (!a) return;
      on.before();
      clock.at(t0 + a.t, () => {
        pump();
        on.arrive(a);
      });
    };
    pump();
  });
}

function buildFleetReport(
  base: Scenario,
  fleet: FleetSpec,
  run: {
    policy: FleetRouterPolicy;
    seed: number;
    simMs: number;
    t0: number;
    requests: FleetRequest[];
    lost: FleetReport['lostNode'];
    rescheduled: { node: string; startedAt: number; readyAt: number | null }[];
    nodeCount: Map<string, number>;
    violations: string[];
  },
): FleetReport {
  const count = (rs: FleetRequest[]): Record<string, number> & { total: number } => {
    const out: Record<string, number> & { total: number } = { total: rs.length };
    for (const r of rs) if (r.outcome) out[r.outcome] = (out[r.outcome] ?? 0) + 1;
    return out;
  };
  // Keyed by configured model names: made into an object from its entries, so any name is a key like another.
  const models = Object.fromEntries(
    base.models.map((m): [string, FleetReport['models'][string]] => {
      const rs = run.requests.filter((r) => r.arrival.model === m.name);
      const served = rs.filter((r) => r.outcome === 'done' && r.firstTokenAt >= 0);
      return [
        m.name,
        {
          requests: count(rs),
          ttftMs: summarize(served.map((r) => r.firstTokenAt - r.receivedAt)),
          tpotMs: summarize(
            served.filter((r) => r.streamed > 1).map((r) => (r.lastTokenAt - r.firstTokenAt) / (r.streamed - 1)),
          ),
        },
      ];
    }),
  );
  return {
    scenario: base.name,
    seed: run.seed,
    router: run.policy,
    pools: Object.fromEntries(fleet.pools.map((p) => [p.name, { nodes: p.nodes, models: p.models }])),
    requests: count(run.requests),
    models,
    lostNode: run.lost,
    rescheduled: run.rescheduled.map((r) => ({
      node: r.node,
      readyAtS: r.readyAt === null ? null : Math.round(r.readyAt - run.t0) / 1000,
    })),
    invariants: { violations: run.violations },
    sim: { requests: run.requests.length, simulatedSeconds: Math.round(run.simMs) / 1000 },
  };
}
