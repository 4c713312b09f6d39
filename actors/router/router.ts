// The router: resolve model@version, choose a ready replica by predicted work and KV headroom, and admit or
// reject at once with a typed outcome. Every decision records its inputs (DecisionTrace).
import type { ReplicaHandle } from '../replica.ts';
import type { Rng } from '../../runtime/rng.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';
import type { Registry, ResolvedBy } from './registry.ts';
import { estimateWait, type WaitEstimate, type WorkSpec } from './estimate.ts';

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
  classes: Readonly<Record<string, ClassLimits>>;
}

/** A request as the router sees it. */
export interface RouteRequest {
  id: string;
  model: string;
  version?: string;
  priority: string;
  promptTokens: number;
  maxTokens: number;
  /** Output length the ledger assumes (maxTokens unless a predictor is configured). */
  estOutputTokens: number;
  /** A client deadline (ms from receipt) that may shorten the class's maxQueueMs. */
  deadlineMs?: number;
}

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
}

/** The router's answer: a replica (or a bounded hold until one is ready), or a typed rejection. */
export type Admission =
  | {
      ok: true;
      model: string;
      version: string;
      replica: ReplicaHandle | null;
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
  replicas(): Iterable<ReplicaHandle>;
  /** Why the model cannot be served at all now (e.g. too few healthy GPUs), or null. */
  unavailable(model: string): string | null;
  /** Predicted ms until a replica of model@version is ready when none is, or null if none is coming. */
  etaMs(model: string, version: string): number | null;
  /** Requests of the model held at the router (waiting for a replica) in the class of this rank. */
  held(model: string, rank: number): { count: number; tokens: number };
  policy: RoutingPolicy;
  rng: Rng;
  now(): number;
  /** Why a replica is ejected from routing now (slow or failing steps), or null. */
  ejected?(replica: string): string | null;
  /** How much slower than the cost model a replica's steps really run (1 when on time or unknown). */
  slowdown?(replica: string): number;
}

/** The router of one control plane. */
export interface Router {
  route(req: RouteRequest): Admission;
  /** Picks a ready replica to resume an interrupted or held request on (cost policy), with the decision's trace. */
  resume(
    model: string,
    version: string,
    priority: string,
    work: { promptTokens: number; estOutputTokens: number; priority: number },
  ): { replica: ReplicaHandle | null; trace: DecisionTrace };
  /** resume() without the trace. */
  pickForResume(
    model: string,
    version: string,
    work: { promptTokens: number; estOutputTokens: number; priority: number },
  ): ReplicaHandle | null;
  setPolicy(p: RoutingPolicy): void;
  readonly policy: RoutingPolicy;
  /** The model table (rollouts move aliases and splits in it). */
  readonly registry: Registry;
}

/** Only `ready` replicas (idle, busy or saturated) take new work; placing, loading, draining and failed ones do not. */
export function isReady(r: ReplicaHandle): boolean {
  return r.actor.getSnapshot().matches('ready');
}

/** A retryAfterMs that is always a positive whole number of milliseconds. */
function retryMs(ms: number): number {
  return Number.isFinite(ms) ? Math.max(1, Math.ceil(ms)) : 1000;
}

/** Creates the router. */
export function createRouter(deps: RouterDeps): Router {
  let policy = deps.policy;
  let rr = 0;

  const candidatesOf = (model: string, version: string, excluded: Excluded[] | null): ReplicaHandle[] => {
    const out: ReplicaHandle[] = [];
    const ejected: ReplicaHandle[] = [];
    for (const r of deps.replicas()) {
      if (r.model !== model || r.version !== version) continue;
      if (!isReady(r)) {
        excluded?.push({ replica: r.id, why: `not ready (${r.state()})` });
        continue;
      }
      const ej = deps.ejected?.(r.id) ?? null;
      if (ej) {
        excluded?.push({ replica: r.id, why: `ejected: ${ej}` });
        ejected.push(r);
        continue;
      }
      out.push(r);
    }
    // Every ready replica ejected: a slow replica still beats none (requests would only wait for a ready event).
    if (out.length === 0 && ejected.length > 0) {
      excluded?.splice(0, excluded.length, ...excluded.filter((x) => !x.why.startsWith('ejected')));
      return ejected;
    }
    return out;
  };

  const fits = (r: ReplicaHandle, e: WaitEstimate): boolean => e.needBlocks <= r.batcher.limits.blocksTotal;
  // Measured step-time ratio, kept within sane bounds so one odd sample cannot zero or explode an estimate.
  const estimate = (r: ReplicaHandle, work: WorkSpec): WaitEstimate =>
    estimateWait(r, work, Math.min(20, Math.max(0.5, deps.slowdown?.(r.id) ?? 1)));

  /** The policy's choice, or -1 if no candidate can hold the request. */
  const choose = (cands: ReplicaHandle[], ests: WaitEstimate[]): number => {
    if (policy === 'round-robin') {
      for (let k = 0; k < cands.length; k++) {
        const i = (rr + k) % cands.length;
        if (fits(cands[i]!, ests[i]!)) {
          rr = i + 1;
          return i;
        }
      }
      return -1;
    }
    if (policy === 'least-requests') {
      let best = -1;
      for (let i = 0; i < cands.length; i++) {
        if (!fits(cands[i]!, ests[i]!)) continue;
        const load = ests[i]!.queued + ests[i]!.running;
        if (best < 0 || load < ests[best]!.queued + ests[best]!.running) best = i;
      }
      return best;
    }
    if (policy === 'power-of-two') {
      if (cands.length === 1) return fits(cands[0]!, ests[0]!) ? 0 : -1;
      const a = deps.rng.int(cands.length);
      let b = deps.rng.int(cands.length - 1);
      if (b >= a) b++;
      const ok = [a, b].filter((i) => fits(cands[i]!, ests[i]!));
      if (ok.length === 0) return -1;
      return ok.reduce((x, y) => (ests[y]!.queued < ests[x]!.queued ? y : x));
    }
    // cost: lowest predicted time to first token among replicas with KV headroom; KV is a hard limit, then time decides.
    let best = -1;
    for (let i = 0; i < cands.length; i++) {
      if (!ests[i]!.headroom || !fits(cands[i]!, ests[i]!)) continue;
      if (best < 0 || ests[i]!.ttftMs < ests[best]!.ttftMs) best = i;
    }
    return best;
  };

  /** Queue totals of a model's class across all its replicas (any version) and the router's hold. */
  const classTotals = (model: string, rank: number): { count: number; tokens: number } => {
    const h = deps.held(model, rank);
    let count = h.count;
    let tokens = h.tokens;
    for (const r of deps.replicas()) {
      if (r.model !== model) continue;
      const st = r.batcher.stats();
      count += st.waitingByClass[rank] ?? 0;
      tokens += st.waitingTokensByClass[rank] ?? 0;
    }
    return { count, tokens };
  };

  const newTrace = (kind: DecisionTrace['kind'], model: string, priority: string): DecisionTrace => ({
    t: deps.now(),
    kind,
    policy,
    model,
    version: null,
    priority,
    budgetMs: 0,
    candidates: [],
    excluded: [],
    chosen: null,
    outcome: 'rejected',
    reason: '',
  });

  const route = (req: RouteRequest): Admission => {
    const trace = newTrace('admit', req.model, req.priority);
    const reject = (f: Failure): Admission => {
      trace.outcome = 'rejected';
      trace.reason = `${f.code}: ${f.message}`;
      return { ok: false, failure: f, trace };
    };
    const overloaded = (message: string, afterMs: number): Admission =>
      reject(failure('overloaded', message, { retryAfterMs: retryMs(afterMs) }));

    const res = deps.registry.resolve(req.model, req.version, deps.rng);
    if (!res.ok) return reject(res.failure);
    trace.version = res.version;
    trace.resolvedBy = res.by;
    const lim = deps.limits(req.model);
    const cls = lim?.classes[req.priority];
    if (!lim || !cls) {
      const known = lim ? Object.keys(lim.classes).join(', ') : '';
      return reject(failure('invalid_request', `unknown priority class "${req.priority}"; known: ${known}`));
    }
    if (
      !Number.isInteger(req.promptTokens) ||
      !Number.isInteger(req.maxTokens) ||
      req.maxTokens < 1 ||
      req.promptTokens < 1
    ) {
      return reject(failure('invalid_request', 'promptTokens and maxTokens must be whole numbers of at least 1'));
    }
    if (req.deadlineMs !== undefined && !(req.deadlineMs >= 0)) {
      return reject(failure('invalid_request', 'deadlineMs must be a number of milliseconds >= 0'));
    }
    if (req.promptTokens + req.maxTokens > lim.maxContext) {
      return reject(
        failure(
          'invalid_request',
          `prompt (${req.promptTokens}) + max_tokens (${req.maxTokens}) exceeds the model's context of ${lim.maxContext}`,
        ),
      );
    }
    const budgetMs = Math.max(0, Math.min(cls.maxQueueMs, req.deadlineMs ?? Infinity));
    trace.budgetMs = budgetMs;
    const why = deps.unavailable(req.model);
    if (why) return reject(failure('model_unavailable', why));

    // Only replicas of the resolved version; an unpinned request may fall back to another advertised version
    // that has ready replicas (a rollout in progress), never to one the client did not ask for by name.
    let version = res.version;
    let cands = candidatesOf(res.model, version, trace.excluded);
    for (const v of res.fallbacks) {
      if (cands.length > 0) break;
      const alt = candidatesOf(res.model, v, null);
      if (alt.length > 0) {
        trace.fallbackFrom = version;
        version = v;
        trace.version = v;
        cands = alt;
      }
    }

    const queue = classTotals(res.model, cls.rank);
    const queueFull = queue.count + 1 > cls.maxQueued || queue.tokens + req.promptTokens > cls.maxQueuedTokens;
    if (cands.length === 0) {
      const eta = deps.etaMs(res.model, version);
      if (eta === null)
        return reject(
          failure('model_unavailable', `no replica of ${res.model}@${version} is ready, loading or placed`),
        );
      if (eta > budgetMs)
        return overloaded(
          `no ready replica of ${res.model}@${version}; one is expected in ${Math.round(eta)} ms, over the budget of ${Math.round(budgetMs)} ms`,
          eta - budgetMs,
        );
      if (queueFull)
        return overloaded(
          `the ${req.priority} queue of ${res.model} is full (${queue.count} requests, ${queue.tokens} tokens)`,
          eta,
        );
      trace.outcome = 'held';
      trace.reason = `held until a replica of ${res.model}@${version} is ready (expected in ${Math.round(eta)} ms, budget ${Math.round(budgetMs)} ms)`;
      return { ok: true, model: res.model, version, replica: null, budgetMs, rank: cls.rank, trace };
    }

    const work = { promptTokens: req.promptTokens, estOutputTokens: req.estOutputTokens, priority: cls.rank };
    const ests = cands.map((r) => estimate(r, work));
    trace.candidates = ests;
    let minWait = Infinity;
    let minTop = Infinity;
    let minKv = Infinity;
    let drainPerMs = 0;
    for (const e of ests) {
      minWait = Math.min(minWait, e.waitMs);
      minTop = Math.min(minTop, e.topWaitMs);
      if (!e.headroom) minKv = Math.min(minKv, e.kvWaitMs);
      if (e.queued > 0 && e.waitMs > 0) drainPerMs += e.queued / e.waitMs;
    }
    if (!cands.some((r, i) => fits(r, ests[i]!))) {
      return reject(
        failure('invalid_request', `request needs more KV cache than any replica of ${res.model}@${version} has`),
      );
    }
    // Queue bounds per model and class: the queue drains at the rate its replicas schedule it.
    if (queueFull) {
      const excess = Math.max(1, queue.count + 1 - cls.maxQueued);
      return overloaded(
        `the ${req.priority} queue of ${res.model} is full (${queue.count} requests, ${queue.tokens} tokens; bounds ${cls.maxQueued}, ${cls.maxQueuedTokens})`,
        drainPerMs > 0 ? excess / drainPerMs : minWait,
      );
    }
    // Lower classes are shed first: refused once the top class's queue is past their share of its budget.
    const topBudget = topClassBudget(lim);
    const shedAt = cls.shedAt ?? (cls.rank === 0 ? 1 : 0.5);
    if (cls.rank > 0 && minTop > shedAt * topBudget) {
      return overloaded(
        `shedding ${req.priority}: the top class would wait ${Math.round(minTop)} ms, past ${Math.round(shedAt * 100)} % of its ${Math.round(topBudget)} ms budget`,
        minTop - shedAt * topBudget,
      );
    }
    const i = choose(cands, ests);
    if (i < 0) {
      return overloaded(
        `no replica of ${res.model}@${version} has KV headroom for ${ests[0]!.needBlocks} blocks`,
        minKv,
      );
    }
    const est = ests[i]!;
    trace.chosen = est.replica;
    if (est.waitMs > budgetMs) {
      // The work ahead drains at one second per second: retry when the best replica's wait fits the budget.
      return overloaded(
        `predicted wait ${Math.round(est.waitMs)} ms exceeds the queue budget of ${Math.round(budgetMs)} ms`,
        minWait - budgetMs,
      );
    }
    trace.outcome = 'routed';
    trace.reason = `${policy}: ${est.replica} predicted wait ${Math.round(est.waitMs)} ms, first token ${Math.round(est.ttftMs)} ms, within budget ${Math.round(budgetMs)} ms`;
    return { ok: true, model: res.model, version, replica: cands[i]!, budgetMs, rank: cls.rank, trace };
  };

  const resume: Router['resume'] = (model, version, priority, work) => {
    const trace = newTrace('resume', model, priority);
    trace.version = version;
    trace.policy = 'cost';
    const cands = candidatesOf(model, version, trace.excluded);
    let best = -1;
    const ests = cands.map((r) => estimate(r, work));
    trace.candidates = ests;
    // Headroom first, then any replica that can hold it at all (a resumed request must not be dropped for KV).
    for (const needHeadroom of [true, false]) {
      for (let i = 0; i < cands.length; i++) {
        if (!fits(cands[i]!, ests[i]!) || (needHeadroom && !ests[i]!.headroom)) continue;
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
    route,
    resume,
    pickForResume: (model, version, work) => resume(model, version, '', work).replica,
    setPolicy: (p) => {
      policy = p;
    },
    get policy() {
      return policy;
    },
    registry: deps.registry,
  };
}

/** The maxQueueMs of a model's highest class (rank 0). */
function topClassBudget(lim: ModelLimits): number {
  for (const c of Object.values(lim.classes)) if (c.rank === 0) return c.maxQueueMs;
  return Infinity;
}
