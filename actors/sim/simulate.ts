// `switchyard simulate`: a scenario through request → router → replica → GPU actors in virtual time, with the
// node agent behind the real codec, and a report that is byte-identical for the same scenario and seed.
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime } from '../../runtime/system.ts';
import { startNodeAgent } from '../worker/agent.ts';
import { startControlPlane, type ControlPlane } from '../control-plane.ts';
import { createArrivalStream, type ArrivalStream } from './traffic.ts';
import { connectSimLink } from '../../transport/sim-link.ts';
import type { Scenario } from '../config.ts';
import type { Summary } from '../metrics/histogram.ts';
import type { EstimateError, PrefixReport } from '../metrics/collector.ts';
import type { DecisionTrace } from '../router/router.ts';
import type { PlacementEvent } from '../placement/placement.ts';
import { failureReport, type FaultReport } from '../placement/report.ts';
import { createRollouts } from '../placement/rollouts.ts';

/** The JSON report of a simulation. */
export interface SimReport {
  scenario: string;
  seed: number;
  requests: Record<string, number> & { total: number };
  throughput: { requestsPerS: number; outputTokensPerS: number };
  ttftMs: Summary;
  tpotMs: Summary;
  tbtMs: Summary;
  e2eMs: Summary;
  queueWaitMs: Summary;
  models: Record<
    string,
    { requests: Record<string, number>; ttftMs: Summary; tpotMs: Summary; tbtMs: Summary; queueWaitMs: Summary }
  >;
  batch: { meanSize: number; steps: number; preemptions: number };
  gpus: { utilisation: number[]; meanUtilisation: number };
  placement: PlacementEvent[];
  invariants: { violations: string[]; overBudget: number; withoutOneOutcome: number };
  /** Estimate error of the one ledger: the router's predicted queue wait and the replicas' predicted step times. */
  estimates: Record<string, EstimateError>;
  /** originMs: virtual time at which scenario time 0 began (after boot); placement event times are absolute. */
  sim: {
    requests: number;
    simulatedSeconds: number;
    wallSeconds?: number;
    events: number;
    messages: number;
    originMs?: number;
  };
  explain?: Record<string, DecisionTrace[]>;
  /** Prefix reuse, when a model keeps a prefix cache: prompt tokens found cached (prefill saved) and the hit rate. */
  prefix?: PrefixReport;
  /** Per injected fault: detection, interrupted requests' outcomes, recovery times (scenarios with faults). */
  failures?: FaultReport[];
}

/** Options of a simulation run. */
export interface SimOptions {
  seed?: number;
  /** Include wall time in the report (breaks byte-identity across runs). */
  wall?: boolean;
  explain?: string[];
  /** Keep every request's decision traces (tests read them with `cp.explain`). */
  keepTraces?: boolean;
  /** Called with the control plane before traffic starts (tests, tracing). */
  onStart?(cp: ControlPlane): void;
  /** Every frame between control plane and node crosses the codec (encode, pre-scan, decode, schema check); by
   * default frames travel as envelope arrays; the report is the same, byte for byte. */
  wireCheck?: boolean;
  /** The reference run: wireCheck, and every request's event through its interpreted machine. */
  stepByStep?: boolean;
  /** The cores' decode runs: the longest a core holds its reports back while its running set only decodes (ms);
   * 0: a report after every step (default DECODE_RUN_MS). Steps, tokens and their times are the same either way;
   * the control plane hears of them later, so its decisions may differ. */
  decodeRunMs?: number;
}

/** How long an engine core may hold its reports back in a decode run (virtual ms): well inside P15's slack. */
export const DECODE_RUN_MS = 200;

/** Longest the initial placement may take to load (virtual ms) before simulate gives up. */
const BOOT_LIMIT_MS = 600_000;

/** Runs a scenario to completion in virtual time and returns its report. */
export function simulate(scenario: Scenario, opts: SimOptions = {}): SimReport {
  const wallStart = performance.now();
  const seed = opts.seed ?? scenario.seed;
  const clock = createVirtualClock();
  const rng = createRng(seed);
  const stepByStep = opts.stepByStep === true;
  const control = createRuntime({ name: 'control', clock, rng: rng.fork('control'), stepByStep });
  const nodeRt = createRuntime({ name: 'node', clock, rng: rng.fork('node') });
  const link = connectSimLink(control, nodeRt, clock, rng.fork('link'), {
    latencyMs: scenario.sim.latencyMs,
    jitterMs: scenario.sim.jitterMs,
    codec: opts.wireCheck === true || stepByStep,
  });
  const gpuList = Array.from({ length: scenario.node.gpus }, (_, i) => i);

  let pendingArrivals = 0;
  let pendingFaults = 0;
  // A rollout under way keeps the run going (the node is settled between its steps).
  let rolling = (): boolean => false;
  const maybeStop = (): void => {
    if (pendingArrivals === 0 && pendingFaults === 0 && cp.live() === 0 && cp.placement.settled() && !rolling())
      clock.stop();
  };
  const cp = startControlPlane(control, scenario, {
    checkInvariants: scenario.sim.checkInvariants,
    keepTraces: opts.keepTraces === true || (opts.explain?.length ?? 0) > 0,
    onIdle: () => maybeStop(),
  });
  const agent = startNodeAgent(nodeRt, {
    gpus: gpuList,
    steps: { decodeRunMs: opts.decodeRunMs ?? DECODE_RUN_MS },
    repairMs: scenario.node.repairMs,
    heartbeatMs: scenario.detection.heartbeatMs,
    lanes: scenario.placement.policy === 'share' ? 2 : 1,
  });
  // Heartbeats keep the clock busy forever: the run ends when placement, requests and faults are all done.
  cp.placement.watch(maybeStop);
  opts.onStart?.(cp);

  const trafficRng = rng.fork('traffic');
  const streams: ArrivalStream[] = scenario.traffic.map((_, i) => createArrivalStream(scenario, i, trafficRng));
  const pump = (s: ArrivalStream): void => {
    const a = s.next();
    if (!a) return;
    pendingArrivals++;
    clock.at(origin + a.t, () => {
      pendingArrivals--;
      pump(s);
      cp.submit({
        model: a.model,
        ...(a.version ? { version: a.version } : {}),
        priority: a.priority,
        promptTokens: a.promptTokens,
        maxTokens: a.maxTokens,
        outputTokens: a.outputTokens,
        ...(a.deadlineMs !== undefined ? { deadlineMs: a.deadlineMs } : {}),
        ...(a.segments ? { segments: a.segments } : {}),
      });
      maybeStop();
    });
  };

  // Boot: GPUs probe and the initial placement loads; scenario time 0 is when the node is ready to serve.
  let events = clock.run(BOOT_LIMIT_MS);
  const origin = clock.now();
  if (!cp.placement.settled() || cp.placement.replicas.size === 0)
    throw new Error('the initial placement did not load');
  const bootBusy = gpuList.map((g) => agent.busyMs(g));
  const startFaults = (): void => {
    for (const f of scenario.faults) {
      pendingFaults++;
      clock.at(origin + f.at * 1000, () => {
        pendingFaults--;
        nodeRt.send('node', {
          type: 'gpu.inject',
          gpu: f.gpu,
          fault: f.kind === 'crash' ? 'silent' : f.kind,
          ...(f.factor ? { factor: f.factor } : {}),
        });
        maybeStop();
      });
      if (f.repairAt !== undefined) {
        pendingFaults++;
        clock.at(origin + f.repairAt * 1000, () => {
          pendingFaults--;
          nodeRt.send('node', { type: 'gpu.inject', gpu: f.gpu, fault: 'repair' });
          maybeStop();
        });
      }
    }
  };
  startFaults();
  const rollouts = createRollouts(cp, () => maybeStop());
  rolling = () => rollouts.running().length > 0;
  for (const r of scenario.rollout) {
    pendingFaults++;
    clock.at(origin + r.at * 1000, () => {
      pendingFaults--;
      const started = rollouts.start(r);
      if (!started.ok) cp.violations.push(`rollout of ${r.model}: ${started.failure.message}`);
    });
  }
  for (const s of streams) pump(s);
  events += clock.run(origin + scenario.sim.maxSimSeconds * 1000);
  const simMs = clock.now() - origin;
  const report = buildReport(
    scenario,
    seed,
    cp,
    (g) => agent.busyMs(g) - bootBusy[g]!,
    gpuList,
    simMs,
    events,
    link.stats.messages,
  );
  report.sim.originMs = origin;
  if (scenario.faults.length > 0) report.failures = failureReport(scenario, origin, cp.placement, cp.collector.records);
  if (opts.explain?.length) report.explain = Object.fromEntries(opts.explain.map((id) => [id, cp.explain(id) ?? []]));
  if (opts.wall) report.sim.wallSeconds = Math.round((performance.now() - wallStart) / 10) / 100;
  for (const f of [...control.faults, ...nodeRt.faults])
    report.invariants.violations.push(`${f.actor}: ${String(f.error)}`);
  return report;
}

function buildReport(
  scenario: Scenario,
  seed: number,
  cp: ControlPlane,
  busyMs: (g: number) => number,
  gpus: number[],
  simMs: number,
  events: number,
  messages: number,
): SimReport {
  const c = cp.collector;
  const outcomes = c.outcomes();
  const total = c.records.length;
  const lat = c.latency();
  const prefix = c.prefix();
  const simS = simMs / 1000;
  let steps = 0;
  let sizeSum = 0;
  let preemptions = 0;
  for (const r of cp.placement.replicas.values()) {
    steps += r.steps.count;
    sizeSum += r.steps.batchSizeSum;
    preemptions += r.work.stats().preemptions;
  }
  const util = gpus.map((g) => (simMs > 0 ? Math.round((busyMs(g) / simMs) * 1000) / 1000 : 0));
  // Keyed by configured model names: made into an object from its entries, so any name is a key like another.
  const models: [string, SimReport['models'][string]][] = [];
  for (const m of scenario.models) {
    const l = c.latency(m.name);
    const reqs = new Map<string, number>();
    for (const r of c.records) {
      if (r.model !== m.name) continue;
      const k = r.outcome === 'done' ? 'done' : (r.code ?? r.outcome);
      reqs.set(k, (reqs.get(k) ?? 0) + 1);
    }
    const { ttftMs, tpotMs, tbtMs, queueWaitMs } = l;
    models.push([m.name, { requests: Object.fromEntries(reqs), ttftMs, tpotMs, tbtMs, queueWaitMs }]);
  }
  const round = (x: number): number => Math.round(x * 1000) / 1000;
  return {
    scenario: scenario.name,
    seed,
    requests: { total, ...outcomes },
    throughput: {
      requestsPerS: simS > 0 ? round((outcomes['done'] ?? 0) / simS) : 0,
      outputTokensPerS: simS > 0 ? round(c.outputTokens() / simS) : 0,
    },
    ttftMs: lat.ttftMs,
    tpotMs: lat.tpotMs,
    tbtMs: lat.tbtMs,
    e2eMs: lat.e2eMs,
    queueWaitMs: lat.queueWaitMs,
    models: Object.fromEntries(models),
    batch: { meanSize: steps > 0 ? round(sizeSum / steps) : 0, steps, preemptions },
    gpus: { utilisation: util, meanUtilisation: round(util.reduce((a, b) => a + b, 0) / Math.max(1, util.length)) },
    placement: cp.placement.events,
    invariants: { violations: [...cp.violations], overBudget: c.overBudget(), withoutOneOutcome: cp.live() },
    estimates: c.estimates(),
    ...(prefix ? { prefix: { ...prefix, hitRate: round(prefix.hitRate) } } : {}),
    sim: { requests: total, simulatedSeconds: round(simS), events, messages },
  };
}
