// The router: resolve model@version, choose a ready replica by predicted work and KV headroom, and admit or
// reject at once with a typed outcome. Every decision records its inputs (DecisionTrace).
import type { Rng } from '../../runtime/rng.ts';
import type { Failure } from '../../machines/outcomes.ts';
import type { Registry, ResolvedBy } from './registry.ts';
import type { HeldWork, ReplicaLoad, WaitEstimate, WorkSpec } from './estimate.ts';
import { createRouterCore } from './core.ts';
import { admit, classOf } from './admit.ts';
import type { ReplicaView } from './view.ts';
import type { SubmitSpec } from '../control/types.ts';
import type { PrefixIndex } from './prefix-index.ts';

export { isReady, viewOf, type ReplicaView } from './view.ts';

/** How the router picks among compatible ready replicas. */
export type RoutingPolicy = 'cost' | 'round-robin' | 'least-requests' | 'power-of-two';

/** Every routing policy, for CLIs and benchmarks. */
export const ROUTING_POLICIES: readonly RoutingPolicy[] = ['cost', 'round-robin', 'least-requests', 'power-of-two'];

/** Latency targets and queue bounds of one priority class of one model. */
export interface ClassLimits {
  /** Rank of the class: 0 is served first and shed last. */
  rank: number;
  ttftMs: number;
  tpotMs: number;
  /** Hard bound on queueing before the first token. */
  maxQueueMs: number;
  /** Bounds of the class's queue across the model's replicas. */
  maxQueued: number;
  maxQueuedTokens: number;
  /**
   * Shed this class once a top-class request would wait more than this fraction of the top class's maxQueueMs
   * (default 1 for rank 0, 0.5 below it): lower classes are refused while the top class still gets in.
   */
  shedAt?: number;
}

/** Per-model admission settings. */
export interface ModelLimits {
  maxContext: number;
  /** Its priority classes by name (names come from clients: a Map, never an object's properties). */
  classes: ReadonlyMap<string, ClassLimits>;
}

/** What the router reads of a submitted request: its id, resolved class and output estimate added. */
export type RouteRequest = Pick<SubmitSpec, 'model' | 'version' | 'promptTokens' | 'maxTokens' | 'deadlineMs'> & {
  id: string;
  priority: string;
  /** Output length the ledger assumes (maxTokens unless a predictor is configured). */
  estOutputTokens: number;
  /** Chain hashes of its prompt's full blocks, for a model whose replicas keep a prefix cache. */
  hashes?: readonly number[];
};

/** A replica of the resolved model@version the router did not consider, and why. */
export interface Excluded {
  replica: string;
  why: string;
}

/** Why a request went where it went, or why it was refused or ended. */
export interface DecisionTrace {
  t: number;
  /** What was decided: first admission, a resume after interruption or hold, or the request's expiry. */
  kind: 'admit' | 'resume' | 'expire';
  policy: RoutingPolicy;
  model: string;
  version: string | null;
  /** How the version was chosen (exact, alias, split, default), and the version it fell back from, if any. */
  resolvedBy?: ResolvedBy;
  fallbackFrom?: string;
  priority: string;
  budgetMs: number;
  candidates: WaitEstimate[];
  excluded: Excluded[];
  chosen: string | null;
  outcome: 'routed' | 'held' | 'rejected' | 'expired';
  reason: string;
  /** An admitted request's predicted wait before its prefill starts (ms from the decision): the load time plus the
   * work held ahead when held, the chosen replica's estimate when routed. */
  predictedWaitMs?: number;
  /** A routed request of a model with a prefix cache: the prompt tokens its replica really held cached when it was
   * scheduled (the chosen candidate's `cachedTokens` is what the router expected). */
  cachedTokens?: number;
}

/** The router's answer: a replica (or a bounded hold until one is ready), or a typed rejection. */
export type Admission =
  | {
      ok: true;
      model: string;
      version: string;
      replica: ReplicaView | null;
      budgetMs: number;
      rank: number;
      trace: DecisionTrace;
    }
  | { ok: false; failure: Failure; trace: DecisionTrace };

/** What the router depends on. */
export interface RouterDeps {
  registry: Registry;
  limits(model: string): ModelLimits | undefined;
  /** Every replica of the node (any state); the router only routes to ready ones. */
  replicas(): Iterable<ReplicaView>;
  /** Why the model cannot be served at all now (e.g. too few healthy GPUs), or null. */
  unavailable(model: string): string | null;
  /** Predicted ms until a replica of model@version is ready when none is, or null if none is coming. */
  etaMs(model: string, version: string): number | null;
  /** Requests of the model held at the router (waiting for a replica) in the class of this rank. */
  held(model: string, rank: number): { count: number; tokens: number };
  /** Requests of model@version held at the router in this class or a higher one (ahead of a new one). */
  heldAhead?(model: string, version: string, rank: number): HeldWork;
  /** An empty replica of model@version as it will be once loaded, and how many of them the held work will share. */
  prospect?(
    model: string,
    version: string,
  ): { replica: Pick<ReplicaLoad, 'id' | 'limits' | 'cost'> & { blocksTotal: number }; replicas: number } | null;
  policy: RoutingPolicy;
  rng: Rng;
  now(): number;
  /** Why a replica is ejected from routing now (slow or failing steps), or null. */
  ejected?(replica: string): string | null;
  /** How much slower than the cost model a replica's steps really run (1 when on time or unknown). */
  slowdown?(replica: string): number;
  /** What each replica holds in its prefix cache, as its core reported it: the cost policy prices a candidate's
   * cached prompt tokens as not prefilled (absent: prefixes are not routed on). */
  prefix?: Pick<PrefixIndex, 'cachedBlocks'>;
}

/** The router of one control plane. */
export interface Router {
  route(req: RouteRequest): Admission;
  /** Refuses, before anything is admitted or drawn, a request naming a model, version or priority class the router
   * does not know (the edge's check; admission makes the same one). */
  check(req: { model: string; version?: string | undefined; priority?: string | undefined }): Failure | null;
  /**
   * Picks a ready replica to resume an interrupted or held request on (cost policy), with the decision's trace;
   * `exclude` is a replica never to pick (the failing one the request is resumed from: it still reads as ready
   * while its failure transition runs).
   */
  resume(
    model: string,
    version: string,
    priority: string,
    work: WorkSpec,
    exclude?: string,
  ): { replica: ReplicaView | null; trace: DecisionTrace };
  setPolicy(p: RoutingPolicy): void;
  readonly policy: RoutingPolicy;
  /** The model table (rollouts move aliases and splits in it). */
  readonly registry: Registry;
}

/** Creates the router. */
export function createRouter(deps: RouterDeps): Router {
  const core = createRouterCore(deps);

  const resume: Router['resume'] = (model, version, priority, work, exclude) => {
    const trace = core.newTrace('resume', model, priority);
    trace.version = version;
    trace.policy = 'cost';
    const cands = core.candidatesOf(model, version, trace.excluded, exclude);
    let best = -1;
    const ests = cands.map((r) => core.estimate(r, work));
    trace.candidates = ests;
    // Headroom first, then any replica that can hold it at all (a resumed request must not be dropped for KV).
    for (const needHeadroom of [true, false]) {
      for (let i = 0; i < cands.length; i++) {
        if (!core.fits(cands[i]!, ests[i]!) || (needHeadroom && !ests[i]!.headroom)) continue;
        if (best < 0 || ests[i]!.ttftMs < ests[best]!.ttftMs) best = i;
      }
      if (best >= 0) break;
    }
    if (best < 0) {
      trace.outcome = 'held';
      trace.reason =
        cands.length === 0
          ? `no ready replica of ${model}@${version}; held within its budget`
          : 'no ready replica can hold it; held within its budget';
      return { replica: null, trace };
    }
    trace.chosen = ests[best]!.replica;
    trace.outcome = 'routed';
    trace.reason = `resumed on ${trace.chosen}: predicted first token ${Math.round(ests[best]!.ttftMs)} ms`;
    return { replica: cands[best]!, trace };
  };

  return {
    route: (req) => admit(core, req),
    check: (req) => {
      const unknown = deps.registry.check(req.model, req.version);
      if (unknown || req.priority === undefined) return unknown;
      const cls = classOf(deps.limits(req.model), req.priority);
      return 'code' in cls ? cls : null;
    },
    resume,
    setPolicy: (p) => {
      core.policy = p;
    },
    get policy() {
      return core.policy;
    },
    registry: deps.registry,
  };
}
