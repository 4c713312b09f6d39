// The control plane: requests, router, placement and replicas of one node, wired on one runtime. The same code
// serves live traffic (wall clock, WebSocket link to the node agent) and runs simulations (virtual clock). Its
// parts live in actors/control/: the request table, the hold, resume, stateless dispatch, submit, invariants.
import { createProfileFits, type ProfileFits } from './profile-fit.ts';
import type { Scenario } from './config.ts';
import { withoutEngines } from './engine-config.ts';
import { createCollector, type Collector } from './metrics/collector.ts';
import { startPlacement, type Placement } from './placement/placement.ts';
import type { ReplicaEvent } from './placement/timeline.ts';
import type { ProgressDelta, ReplicaHandle } from './replica.ts';
import { createRegistry } from './router/registry.ts';
import {
  createRouter,
  viewOf,
  type DecisionTrace,
  type ReplicaView,
  type Router,
  type RouterDeps,
} from './router/router.ts';
import { createHealth, type Health } from './router/health.ts';
import { expiryTrace } from './router/explain.ts';
import { createPrefixIndex, type PrefixIndex } from './router/prefix-index.ts';
import type { CacheReport } from '../machines/core-messages.ts';
import { costOf } from './placement/layout.ts';
import type { Runtime } from '../runtime/system.ts';
import { createDeadlineWheel } from '../runtime/deadlines.ts';
import { createRequestTable } from './control/request-table.ts';
import { createHeldQueue } from './control/held-queue.ts';
import { createResumer } from './control/resume.ts';
import { createStatelessDispatch } from './control/stateless.ts';
import { createSubmit } from './control/submit.ts';
import { createConservationMonitor, createInvariantChecker } from './control/invariants.ts';
import type { ClientListener, Live, SubmitResult, SubmitSpec } from './control/types.ts';

export type { ClientListener, SubmitResult, SubmitSpec, TerminalOutcome } from './control/types.ts';

/** The control plane of one node. */
export interface ControlPlane {
  readonly runtime: Runtime;
  readonly scenario: Scenario;
  readonly router: Router;
  readonly placement: Placement;
  readonly collector: Collector;
  /** Admits (and routes or holds) a request, answering the model version it resolved to, or refuses it. */
  submit(spec: SubmitSpec, listener?: ClientListener): SubmitResult;
  cancel(id: string): boolean;
  /** Ends a live request whose handling threw with `internal`, releasing what it held (RequestTable.fail). */
  fail(id: string, message: string): boolean;
  /** A live request's progress: tokens streamed to its client and when the first was produced (-1: none yet). */
  progress(id: string): { tokens: number; firstTokenAt: number } | null;
  /** Requests not yet terminal. */
  live(): number;
  /** The decision trace of a request (kept for finished ones when `keepTraces`). */
  explain(id: string): DecisionTrace[] | undefined;
  /** Invariant violations seen (simulation checks). */
  readonly violations: string[];
  /** Work conservation (P10), sampled now: waits with room that outlasted their bound since the last sample. */
  checkWorkConservation(): string[];
  /** After each progress report of a replica's core that covered steps. */
  onProgress?: (r: ReplicaHandle, delta: ProgressDelta) => void;
  /** Outlier ejection: replicas out of routing for slow or failing steps. */
  readonly health: Health;
  /** Whether each real engine's calibrated profile fits this machine (predicted vs measured first steps). */
  readonly profileFits: ProfileFits;
  /** What each replica's core reported its prefix cache holds (routing's prefix index). */
  readonly prefix: PrefixIndex;
}

/** Faults a test injects into the production objects on purpose, to show that a promise's check catches them. */
export interface ControlPlaneMutations {
  /** Lose every GPU release the control plane sends: a failed replica never gives its GPUs back (P9). */
  dropGpuReleases?: boolean;
  /** Lose every twentieth `seq.submit` on its way to the node: those requests wait at a core that never heard of
   * them, and the replica's view of its work goes stale (P15). */
  loseSubmits?: boolean;
  /** Forget the requests a failed replica hands back (P1). */
  dropInterrupted?: boolean;
  /** The old hold: a resume may choose the failing replica, held requests leave only on replica-ready (P10). */
  heldOnReadyOnly?: boolean;
  /** A restarted control plane adopts nothing its node reports: every loaded replica is reclaimed and reloaded (P12). */
  adoptNothing?: boolean;
  /** Request actors run a compiled machine that ignores the root's transitions (interrupted, failed, cancel): a
   * request whose replica fails never gets its outcome (P1). */
  flatDropsRootTransitions?: boolean;
  /** The prefix index keeps what a replica reported after it failed or reloaded: routing then counts on a cache the
   * replica no longer has (P16). */
  keepPrefixOnFailure?: boolean;
}

/** Options of a control plane. */
export interface ControlPlaneOptions {
  checkInvariants?: boolean;
  /** Keep decision traces of finished requests (for `--explain`). */
  keepTraces?: boolean;
  /** Called when no request is live any more. */
  onIdle?(): void;
  /** The collector to record into (serving passes a bounded one: a long-running server cannot keep every record). */
  collector?: Collector;
  /** Run llama.cpp models on their engines (serving); otherwise the cost model stands in (simulation, DST, plan). */
  realEngines?: boolean;
  /** Deliberate faults for mutation tests (never set outside tests and the DST). */
  mutations?: ControlPlaneMutations;
  /** The operator's log: what failed while handling one request (that request alone ends, with `internal`). */
  log?(line: string): void;
}

/** The runtime as the control plane's replicas use it, with a mutation's lost messages, if any. */
function mutatedRuntime(runtime: Runtime, m: ControlPlaneMutations): Runtime {
  if (!m.dropGpuReleases && !m.loseSubmits) return runtime;
  const rt = Object.create(runtime) as Runtime & { send: Runtime['send'] };
  let submits = 0;
  rt.send = (to, msg) => {
    if (m.dropGpuReleases && msg.type === 'gpu.release') return;
    if (m.loseSubmits && msg.type === 'seq.submit' && ++submits % 20 === 0) return;
    runtime.send(to, msg);
  };
  return rt;
}

/**
 * The router's views of the placed replicas, as an array kept until the replica map changes: admission walks it a few
 * times per request, and an array's iteration allocates nothing once optimized, where a generator made one result
 * object per replica per walk. (Before that, a generator written inline per control plane gave each simulation's
 * iterators a hidden class of their own, and V8 threw away the router's optimized code in every new simulation.)
 */
function replicaViews(replicas: Placement['replicas']): () => readonly ReplicaView[] {
  let views: ReplicaView[] = [];
  let at = -1;
  return () => {
    if (at !== replicas.version) {
      views = [];
      for (const r of replicas.values()) views.push(viewOf(r));
      at = replicas.version;
    }
    return views;
  };
}

/**
 * For each generative model, an empty replica of model@version as it will be once loaded (for the estimate of a
 * held request's wait), and how many replicas will share the held work: those placed, loading or ready, or the
 * configured count when more.
 */
function prospectsOf(
  scenario: Scenario,
  replicas: () => Iterable<ReplicaHandle>,
): Map<string, NonNullable<RouterDeps['prospect']>> {
  const out = new Map<string, NonNullable<RouterDeps['prospect']>>();
  for (const m of scenario.models) {
    if (m.kind === 'stateless') continue;
    const cost = costOf(scenario, m);
    const b = m.batching;
    const blocksTotal = b.kvBlocks ?? cost.kvBlocks(b.blockTokens);
    out.set(m.name, (_, v) => {
      let n = 0;
      for (const r of replicas()) if (r.model === m.name && r.version === v && r.hasTag('live')) n++;
      return { replica: { id: `${m.name}@${v}`, limits: b, cost, blocksTotal }, replicas: Math.max(1, n, m.replicas) };
    });
  }
  return out;
}

/** Starts a control plane on `runtime` for `scenario`. */
export function startControlPlane(runtime: Runtime, given: Scenario, opts: ControlPlaneOptions = {}): ControlPlane {
  const scenario = opts.realEngines ? given : withoutEngines(given);
  const { clock } = runtime;
  const mutations = opts.mutations ?? {};
  const collector = opts.collector ?? createCollector();
  const modelByName = new Map(scenario.models.map((m) => [m.name, m]));
  const invariants = createInvariantChecker(opts.checkInvariants === true);
  const health: Health = createHealth(
    {
      now: () => clock.now(),
      modelOf: (id) => placement.replicas.get(id)?.model,
      replicasOf: (m) => [...placement.replicas.values()].filter((r) => r.model === m).length,
    },
    scenario.routing.ejection,
  );
  const table = createRequestTable({
    runtime,
    collector,
    deadlines: createDeadlineWheel(clock),
    keepTraces: opts.keepTraces === true,
    oracle: (m) => modelByName.get(m)?.estimate === 'oracle',
    expiryTrace: (l, c) => expiryTrace(router.policy, l, c, placement.replicas.get(c.replica ?? ''), clock.now()),
    scheduled: (l, t) => {
      invariants.scheduled(l, t);
      const predicted = l.traces[0]?.candidates.find((c) => c.replica === l.traces[0]!.chosen);
      if (predicted) collector.estimate('queueWaitMs', predicted.waitMs, t - l.receivedAt);
    },
    ...(opts.onIdle ? { onIdle: opts.onIdle } : {}),
    ...(opts.log ? { log: opts.log } : {}),
    ...(mutations.flatDropsRootTransitions ? { flatMutation: 'drop-root-transitions' as const } : {}),
  });
  const held = createHeldQueue(runtime, (model) => placement.demand(model));
  const profileFits = createProfileFits(
    new Map(scenario.models.flatMap((m) => (m.engine && m.calibration ? [[m.name, m.calibration] as const] : []))),
    opts.log ?? (() => {}),
  );
  const stateless = createStatelessDispatch({
    clock,
    replicas: () => placement.replicas.values(),
    ejected: (id) => health.ejected(id),
    markScheduled: table.markScheduled,
    deliver: table.deliver,
  });
  const handTo = (l: Live, r: ReplicaHandle, generated: number, atHead: boolean): void => {
    if (modelByName.get(l.model)?.kind === 'stateless') r.submitItem(stateless.item(l, r));
    else r.enqueue(table.newSequence(l, generated), atHead);
  };
  const replica = (id: string): ReplicaHandle | undefined => placement.replicas.get(id);
  const prefix = createPrefixIndex();
  const placement = startPlacement(mutatedRuntime(runtime, mutations), scenario, {
    onInterrupted: (seqs, reason) => (mutations.dropInterrupted ? undefined : resumer.interrupted(seqs, reason)),
    onReplicaReady: (r) => resumer.replicaReady(r),
    held: (model) => held.count(model),
    // A sequence its core refused fails alone (the control plane checked it first: a broken invariant in simulation).
    onRefused: (s, message) => {
      if (opts.checkInvariants === true) invariants.violations.push(`${s.id}: refused by its core: ${message}`);
      table.fail(s.id, `refused by the replica's engine core: ${message}`);
    },
    ...(opts.checkInvariants === true ? { checkCore: true } : {}),
    onProgress: (r, d) => {
      // A real engine's steps are judged only against a calibrated profile: the roofline is not the engine's time.
      stepTimes(collector, health, r.id, d, !r.engine || Boolean(modelByName.get(r.model)?.calibration));
      profileFits.observe(r.model, d);
      cp.onProgress?.(r, d);
      resumer.stepCompleted(r);
    },
    onCache: (r, c) => mirrorCache(prefix, r.id, c),
    ...(mutations.adoptNothing ? { adoptNothing: true } : {}),
  });
  // Replica failures and re-creations reach health as placement publishes them.
  placement.subscribe(health.observe);
  // A replica that failed, was removed or is loading again (a new epoch) holds no prefix: its index goes.
  if (!mutations.keepPrefixOnFailure) placement.subscribe((e) => e.kind !== 'replica.ready' && prefix.drop(e.replica));

  const router = createRouter({
    registry: createRegistry(
      scenario.models.map((m) => ({
        name: m.name,
        versions: m.versions,
        aliases: m.aliases,
        ...(m.split ? { split: m.split } : {}),
      })),
    ),
    limits: (m) => limits.get(m),
    replicas: replicaViews(placement.replicas),
    unavailable: (m) => placement.unavailable(m),
    etaMs: (m, v) => placement.etaMs(m, v),
    held: (m, rank) => held.classTotals(m, rank),
    heldAhead: (m, v, rank) => held.ahead(m, v, rank),
    prospect: (m, v) => prospects.get(m)?.(m, v) ?? null,
    policy: scenario.routing.policy,
    rng: runtime.rng.fork('router'),
    now: () => clock.now(),
    ejected: (id) => health.ejected(id),
    slowdown: (id) => health.ratio(id),
    ...(scenario.routing.prefix ? { prefix } : {}),
  });
  const limits = new Map(
    scenario.models.map((m) => [
      m.name,
      { maxContext: m.batching.maxContext, classes: new Map(m.classes.map((c) => [c.name, c])) },
    ]),
  );
  const prospects = prospectsOf(scenario, () => placement.replicas.values());
  const resumer = createResumer({
    clock,
    router,
    table,
    held,
    replica,
    handTo,
    demand: (m) => placement.demand(m),
    ...(mutations.heldOnReadyOnly ? { heldOnReadyOnly: true } : {}),
    ...(opts.log ? { log: opts.log } : {}),
  });
  if (opts.log) placement.subscribe(replicaLog(opts.log));
  const conservation = createConservationMonitor({
    held: () => held.all(),
    replicas: () => placement.replicas.values(),
  });
  const submit = createSubmit({
    runtime,
    model: (name) => modelByName.get(name),
    router,
    table,
    held,
    stateless,
    replica,
    handTo,
    demand: (m, rejected, after) => placement.demand(m, rejected, after),
    ...(opts.log ? { log: opts.log } : {}),
  });
  const cp: ControlPlane = {
    runtime,
    scenario,
    router,
    placement,
    collector,
    submit,
    cancel: table.cancel,
    fail: table.fail,
    progress: table.progress,
    live: () => table.size,
    explain: table.explain,
    violations: invariants.violations,
    checkWorkConservation: () => conservation.sample(clock.now()),
    health,
    profileFits,
    prefix,
  };
  return cp;
}

/** A report's steps against their predicted times: a report covers one step, or a few when they were coalesced, each
 * counted at their mean; `judged`: they also count for the replica's health (outlier ejection). */
function stepTimes(collector: Collector, health: Health, replica: string, d: ProgressDelta, judged: boolean): void {
  const predicted = d.predictedMs / d.steps;
  const actual = d.busyMs / d.steps;
  for (let i = 0; i < d.steps; i++) {
    collector.estimate('stepMs', predicted, actual);
    if (judged) health.step(replica, predicted, actual);
  }
}

/** Mirrors a core's report of its prefix cache's changes in the index. */
function mirrorCache(prefix: PrefixIndex, replica: string, c: CacheReport): void {
  if (c.reset) prefix.drop(replica);
  prefix.add(replica, c.add);
  prefix.remove(replica, c.evict);
}

/** The operator's log lines of replicas' lives: each (re)load placed, ready, failed (with why) and removed. */
function replicaLog(log: (line: string) => void): (e: ReplicaEvent) => void {
  return (e) => {
    if (e.kind === 'replica.created') log(`${e.replica} loading on GPU ${e.gpus.join(',')}`);
    else if (e.kind === 'replica.ready') log(`${e.replica} ready`);
    else if (e.kind === 'replica.failed') log(`${e.replica} failed: ${e.reason}`);
    else log(`${e.replica} removed`);
  };
}
