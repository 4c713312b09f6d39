// The router: resolve model@version, choose a ready replica by predicted work and KV headroom, and admit or
// reject at once with a typed outcome. Every decision records its inputs.
import type { ReplicaHandle } from '../replica.ts';
import type { Rng } from '../runtime/rng.ts';
import { failure, type Failure } from '../outcomes.ts';
import type { Registry } from './registry.ts';
import { estimateWait, type WaitEstimate } from './estimate.ts';

/** How the router picks among compatible ready replicas. */
export type RoutingPolicy = 'cost' | 'round-robin' | 'least-requests' | 'power-of-two';

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

/** Why a request went where it went, or why it was refused. */
export interface DecisionTrace {
  t: number;
  policy: RoutingPolicy;
  model: string;
  version: string | null;
  priority: string;
  budgetMs: number;
  candidates: WaitEstimate[];
  chosen: string | null;
  outcome: 'routed' | 'held' | 'rejected';
  reason: string;
}

/** The router's answer: a replica (or a bounded hold until one is ready), or a typed rejection. */
export type Admission =
  | { ok: true; model: string; version: string; replica: ReplicaHandle | null; budgetMs: number; rank: number; trace: DecisionTrace }
  | { ok: false; failure: Failure; trace: DecisionTrace };

/** What the router depends on. */
export interface RouterDeps {
  registry: Registry;
  limits(model: string): ModelLimits | undefined;
  /** Every replica of the node (any state); the router only routes to accepting ones. */
  replicas(): Iterable<ReplicaHandle>;
  /** Why the model cannot be served at all now (e.g. too few healthy GPUs), or null. */
  unavailable(model: string): string | null;
  /** Predicted ms until a replica of model@version is ready when none is, or null if none is coming. */
  etaMs(model: string, version: string): number | null;
  /** Requests of model@version held at the router (waiting for a replica), per class rank. */
  held(model: string, rank: number): { count: number; tokens: number };
  policy: RoutingPolicy;
  rng: Rng;
  now(): number;
  /** Replicas currently ejected for running slow or failing steps. */
  ejected?(replica: string): boolean;
}

/** The router of one control plane. */
export interface Router {
  route(req: RouteRequest): Admission;
  /** Picks a replica to resume an interrupted request on (the cost policy, ready replicas only). */
  pickForResume(model: string, version: string, work: { promptTokens: number; estOutputTokens: number; priority: number }): ReplicaHandle | null;
  setPolicy(p: RoutingPolicy): void;
  readonly policy: RoutingPolicy;
}

/** Creates the router. */
export function createRouter(deps: RouterDeps): Router {
  let policy = deps.policy;
  let rr = 0;

  const candidatesOf = (model: string, version: string): ReplicaHandle[] => {
    const out: ReplicaHandle[] = [];
    for (const r of deps.replicas()) {
      if (r.model === model && r.version === version && r.accepting() && !deps.ejected?.(r.id)) out.push(r);
    }
    return out;
  };

  const choose = (cands: ReplicaHandle[], ests: WaitEstimate[]): number => {
    const fits = (i: number): boolean => ests[i]!.needBlocks <= cands[i]!.batcher.limits.blocksTotal;
    if (policy === 'round-robin') {
      for (let k = 0; k < cands.length; k++) {
        const i = (rr + k) % cands.length;
        if (fits(i)) {
          rr = i + 1;
          return i;
        }
      }
      return -1;
    }
    if (policy === 'least-requests') {
      let best = -1;
      for (let i = 0; i < cands.length; i++) {
        if (!fits(i)) continue;
        const load = ests[i]!.queued + ests[i]!.running;
        if (best < 0 || load < ests[best]!.queued + ests[best]!.running) best = i;
      }
      return best;
    }
    if (policy === 'power-of-two') {
      if (cands.length === 1) return fits(0) ? 0 : -1;
      const a = deps.rng.int(cands.length);
      let b = deps.rng.int(cands.length - 1);
      if (b >= a) b++;
      const ok = [a, b].filter(fits);
      if (ok.length === 0) return -1;
      return ok.reduce((x, y) => (ests[y]!.queued < ests[x]!.queued ? y : x));
    }
    // cost: lowest predicted completion among replicas with KV headroom; KV is a hard limit, then time decides.
    let best = -1;
    for (const needHeadroom of [true, false]) {
      for (let i = 0; i < cands.length; i++) {
        if (!fits(i) || (needHeadroom && !ests[i]!.headroom)) continue;
        if (best < 0 || ests[i]!.ttftMs < ests[best]!.ttftMs) best = i;
      }
      if (best >= 0) return best;
    }
    return -1;
  };

  const route = (req: RouteRequest): Admission => {
    const t = deps.now();
    const trace: DecisionTrace = {
      t,
      policy,
      model: req.model,
      version: null,
      priority: req.priority,
      budgetMs: 0,
      candidates: [],
      chosen: null,
      outcome: 'rejected',
      reason: '',
    };
    const reject = (f: Failure): Admission => {
      trace.reason = `${f.code}: ${f.message}`;
      return { ok: false, failure: f, trace };
    };
    const res = deps.registry.resolve(req.model, req.version, deps.rng);
    if (!res.ok) return reject(res.failure);
    trace.version = res.version;
    const lim = deps.limits(req.model);
    const cls = lim?.classes[req.priority];
    if (!lim || !cls) {
      const known = lim ? Object.keys(lim.classes).join(', ') : '';
      return reject(failure('invalid_request', `unknown priority class "${req.priority}"; known: ${known}`));
    }
    if (!(req.maxTokens >= 1) || !(req.promptTokens >= 1)) {
      return reject(failure('invalid_request', 'promptTokens and maxTokens must be at least 1'));
    }
    if (req.promptTokens + req.maxTokens > lim.maxContext) {
      return reject(
        failure('invalid_request', `prompt (${req.promptTokens}) + max_tokens (${req.maxTokens}) exceeds the model's context of ${lim.maxContext}`),
      );
    }
    const budgetMs = Math.max(0, Math.min(cls.maxQueueMs, req.deadlineMs ?? Infinity));
    trace.budgetMs = budgetMs;
    const why = deps.unavailable(req.model);
    if (why) return reject(failure('model_unavailable', why));

    const work = { promptTokens: req.promptTokens, estOutputTokens: req.estOutputTokens, priority: cls.rank };
    const cands = candidatesOf(res.model, res.version);
    if (cands.length === 0) {
      const eta = deps.etaMs(res.model, res.version);
      if (eta === null) return reject(failure('model_unavailable', `no replica of ${res.model}@${res.version} is placed or loading`));
      const held = deps.held(res.model, cls.rank);
      if (eta > budgetMs || held.count >= cls.maxQueued || held.tokens + req.promptTokens > cls.maxQueuedTokens) {
        return reject(
          failure('overloaded', `no ready replica of ${res.model}@${res.version}; one is expected in ${Math.round(eta)} ms`, {
            retryAfterMs: Math.max(1, Math.ceil(eta - budgetMs)),
          }),
        );
      }
      trace.outcome = 'held';
      trace.reason = `held until a replica is ready (expected in ${Math.round(eta)} ms)`;
      return { ok: true, model: res.model, version: res.version, replica: null, budgetMs, rank: cls.rank, trace };
    }
    const ests = cands.map((r) => estimateWait(r, work));
    trace.candidates = ests;
    let queued = 0;
    for (const e of ests) queued += e.queued;
    const i = choose(cands, ests);
    if (i < 0) {
      return reject(failure('invalid_request', `request needs more KV cache than any replica of ${res.model}@${res.version} has`));
    }
    const est = ests[i]!;
    trace.chosen = est.replica;
    // Queue bounds per class; lower classes see more work ahead (everything of their rank and above), so they shed first.
    const byClass = classTotals(cands, cls.rank);
    if (byClass.count >= cls.maxQueued || byClass.tokens + req.promptTokens > cls.maxQueuedTokens) {
      return reject(
        failure('overloaded', `the ${req.priority} queue of ${res.model} is full (${byClass.count} requests)`, {
          retryAfterMs: Math.max(1, Math.ceil(est.waitMs / Math.max(1, queued))),
        }),
      );
    }
    if (est.waitMs > budgetMs) {
      return reject(
        failure('overloaded', `predicted wait ${Math.round(est.waitMs)} ms exceeds the queue budget of ${Math.round(budgetMs)} ms`, {
          retryAfterMs: Math.max(1, Math.ceil(est.waitMs - budgetMs)),
        }),
      );
    }
    trace.outcome = 'routed';
    trace.reason = `${policy}: predicted wait ${Math.round(est.waitMs)} ms within budget ${Math.round(budgetMs)} ms`;
    return { ok: true, model: res.model, version: res.version, replica: cands[i]!, budgetMs, rank: cls.rank, trace };
  };

  return {
    route,
    pickForResume: (model, version, work) => {
      const cands = candidatesOf(model, version);
      if (cands.length === 0) return null;
      let best: ReplicaHandle | null = null;
      let bestMs = Infinity;
      for (const r of cands) {
        const e = estimateWait(r, work);
        if (e.needBlocks > r.batcher.limits.blocksTotal) continue;
        if (e.ttftMs < bestMs) {
          bestMs = e.ttftMs;
          best = r;
        }
      }
      return best;
    },
    setPolicy: (p) => {
      policy = p;
    },
    get policy() {
      return policy;
    },
  };
}

function classTotals(cands: ReplicaHandle[], rank: number): { count: number; tokens: number } {
  let count = 0;
  let tokens = 0;
  for (const r of cands) {
    const st = r.batcher.stats();
    count += st.waitingByClass[rank] ?? 0;
    tokens += st.waitingTokensByClass[rank] ?? 0;
  }
  return { count, tokens };
}
