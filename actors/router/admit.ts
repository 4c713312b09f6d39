// Admission: resolve model@version, check the request, then route it to a ready replica, hold it (bounded) for one
// that is loading, or refuse it at once with a typed outcome. A hold is admitted only if the load time plus the
// work already held ahead of it, at the replica's predicted rate, brings the start of its prefill within its queue
// budget (the same test as on a ready replica's queue).
import { failure, type Failure } from '../../machines/outcomes.ts';
import type { RouterCore } from './core.ts';
import { estimateLoad, heldLoad, type WaitEstimate } from './estimate.ts';
import type { Admission, ClassLimits, DecisionTrace, ModelLimits, RouteRequest } from './router.ts';
import type { ReplicaView } from './view.ts';

/** A retryAfterMs that is always a positive whole number of milliseconds. */
function retryMs(ms: number): number {
  return Number.isFinite(ms) ? Math.max(1, Math.ceil(ms)) : 1000;
}

/** The maxQueueMs of a model's highest class (rank 0). */
function topClassBudget(lim: ModelLimits): number {
  for (const c of lim.classes.values()) if (c.rank === 0) return c.maxQueueMs;
  return Infinity;
}

/** A model's priority class by name, or the typed refusal naming the classes it has (admission and the edge). */
export function classOf(lim: ModelLimits | undefined, priority: string): ClassLimits | Failure {
  const cls = lim?.classes.get(priority);
  if (cls) return cls;
  const known = lim ? [...lim.classes.keys()].join(', ') : '';
  return failure('invalid_request', `unknown priority class "${priority}"; known: ${known}`);
}

/** Why the request itself is invalid, or null. */
function invalid(req: RouteRequest, lim: ModelLimits): Failure | null {
  if (
    !Number.isInteger(req.promptTokens) ||
    !Number.isInteger(req.maxTokens) ||
    req.maxTokens < 1 ||
    req.promptTokens < 1
  )
    return failure('invalid_request', 'promptTokens and maxTokens must be whole numbers of at least 1');
  if (req.deadlineMs !== undefined && !(req.deadlineMs >= 0))
    return failure('invalid_request', 'deadlineMs must be a number of milliseconds >= 0');
  if (req.promptTokens + req.maxTokens > lim.maxContext)
    return failure(
      'invalid_request',
      `prompt (${req.promptTokens}) + max_tokens (${req.maxTokens}) exceeds the model's context of ${lim.maxContext}`,
    );
  return null;
}

/** One admission in progress: the request, its class and budget, and its trace. */
interface Pending {
  req: RouteRequest;
  model: string;
  version: string;
  cls: ClassLimits;
  lim: ModelLimits;
  budgetMs: number;
  queue: { count: number; tokens: number };
  queueFull: boolean;
  trace: DecisionTrace;
}

const reject = (trace: DecisionTrace, f: Failure): Admission => {
  trace.outcome = 'rejected';
  trace.reason = `${f.code}: ${f.message}`;
  return { ok: false, failure: f, trace };
};
const overloaded = (trace: DecisionTrace, message: string, afterMs: number): Admission =>
  reject(trace, failure('overloaded', message, { retryAfterMs: retryMs(afterMs) }));

/** Routes or refuses a request (the router's `route`). */
export function admit(core: RouterCore, req: RouteRequest): Admission {
  const { deps } = core;
  const trace = core.newTrace('admit', req.model, req.priority);
  const res = deps.registry.resolve(req.model, req.version, deps.rng);
  if (!res.ok) return reject(trace, res.failure);
  trace.version = res.version;
  trace.resolvedBy = res.by;
  const found = deps.limits(req.model);
  const cls = classOf(found, req.priority);
  if ('code' in cls) return reject(trace, cls);
  // A class was found, so the model's limits were.
  const lim = found!;
  const bad = invalid(req, lim);
  if (bad) return reject(trace, bad);
  const budgetMs = Math.max(0, Math.min(cls.maxQueueMs, req.deadlineMs ?? Infinity));
  trace.budgetMs = budgetMs;
  const why = deps.unavailable(req.model);
  if (why) return reject(trace, failure('model_unavailable', why));

  // Only replicas of the resolved version; an unpinned request may fall back to another advertised version
  // that has ready replicas (a rollout in progress), never to one the client did not ask for by name.
  let version = res.version;
  let cands = core.candidatesOf(res.model, version, trace.excluded);
  for (const v of res.fallbacks) {
    if (cands.length > 0) break;
    const alt = core.candidatesOf(res.model, v, null);
    if (alt.length > 0) {
      trace.fallbackFrom = version;
      version = v;
      trace.version = v;
      cands = alt;
    }
  }
  const queue = core.classTotals(res.model, cls.rank);
  const queueFull = queue.count + 1 > cls.maxQueued || queue.tokens + req.promptTokens > cls.maxQueuedTokens;
  const p: Pending = { req, model: res.model, version, cls, lim, budgetMs, queue, queueFull, trace };
  return cands.length === 0 ? hold(core, p) : routeReady(core, p, cands);
}

/** No ready replica: hold the request for one that is loading or about to be placed, if it can be served in time. */
function hold(core: RouterCore, p: Pending): Admission {
  const { model, version, budgetMs, trace, req, cls } = p;
  const eta = core.deps.etaMs(model, version);
  if (eta === null)
    return reject(trace, failure('model_unavailable', `no replica of ${model}@${version} is ready, loading or placed`));
  if (eta > budgetMs)
    return overloaded(
      trace,
      `no ready replica of ${model}@${version}; one is expected in ${Math.round(eta)} ms, over the budget of ${Math.round(budgetMs)} ms`,
      eta - budgetMs,
    );
  if (p.queueFull)
    return overloaded(
      trace,
      `the ${req.priority} queue of ${model} is full (${p.queue.count} requests, ${p.queue.tokens} tokens)`,
      eta,
    );
  // The work already held ahead of it runs first on the replicas that will be ready: count it at their rate.
  const ahead = core.deps.heldAhead?.(model, version, cls.rank) ?? null;
  const prospect = ahead && ahead.count > 0 ? (core.deps.prospect?.(model, version) ?? null) : null;
  let waitMs = eta;
  if (ahead && prospect) {
    const share = {
      count: Math.ceil(ahead.count / prospect.replicas),
      promptTokens: ahead.promptTokens / prospect.replicas,
      outputTokens: ahead.outputTokens / prospect.replicas,
    };
    const work = { promptTokens: req.promptTokens, estOutputTokens: req.estOutputTokens, priority: 0 };
    const est = estimateLoad(heldLoad(prospect.replica, share), work);
    waitMs = eta + est.waitMs;
    if (waitMs > budgetMs)
      return overloaded(
        trace,
        `no ready replica of ${model}@${version}; one is expected in ${Math.round(eta)} ms with ${ahead.count} requests held ahead: predicted wait ${Math.round(waitMs)} ms (first token ${Math.round(eta + est.ttftMs)} ms), over the budget of ${Math.round(budgetMs)} ms`,
        waitMs - budgetMs,
      );
  }
  trace.predictedWaitMs = waitMs;
  trace.outcome = 'held';
  trace.reason = `held until a replica of ${model}@${version} is ready (expected in ${Math.round(eta)} ms, budget ${Math.round(budgetMs)} ms)`;
  return { ok: true, model, version, replica: null, budgetMs, rank: cls.rank, trace };
}

/** Ready replicas exist: queue bounds, shedding, KV headroom and the predicted wait decide. */
function routeReady(core: RouterCore, p: Pending, cands: ReplicaView[]): Admission {
  const { model, version, budgetMs, trace, req, cls, queue } = p;
  const work = {
    promptTokens: req.promptTokens,
    estOutputTokens: req.estOutputTokens,
    priority: cls.rank,
    ...(req.hashes ? { hashes: req.hashes } : {}),
  };
  const ests: WaitEstimate[] = cands.map((r) => core.estimate(r, work));
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
  if (!cands.some((r, i) => core.fits(r, ests[i]!)))
    return reject(
      trace,
      failure('invalid_request', `request needs more KV cache than any replica of ${model}@${version} has`),
    );
  // Queue bounds per model and class: the queue drains at the rate its replicas schedule it.
  if (p.queueFull) {
    const excess = Math.max(1, queue.count + 1 - cls.maxQueued);
    return overloaded(
      trace,
      `the ${req.priority} queue of ${model} is full (${queue.count} requests, ${queue.tokens} tokens; bounds ${cls.maxQueued}, ${cls.maxQueuedTokens})`,
      drainPerMs > 0 ? excess / drainPerMs : minWait,
    );
  }
  // Lower classes are shed first: refused once the top class's queue is past their share of its budget.
  const topBudget = topClassBudget(p.lim);
  const shedAt = cls.shedAt ?? (cls.rank === 0 ? 1 : 0.5);
  if (cls.rank > 0 && minTop > shedAt * topBudget)
    return overloaded(
      trace,
      `shedding ${req.priority}: the top class would wait ${Math.round(minTop)} ms, past ${Math.round(shedAt * 100)} % of its ${Math.round(topBudget)} ms budget`,
      minTop - shedAt * topBudget,
    );
  const i = core.choose(cands, ests);
  if (i < 0)
    return overloaded(
      trace,
      `no replica of ${model}@${version} has KV headroom for ${ests[0]!.needBlocks} blocks`,
      minKv,
    );
  const est = ests[i]!;
  trace.chosen = est.replica;
  if (est.waitMs > budgetMs)
    // The work ahead drains at one second per second: retry when the best replica's wait fits the budget.
    return overloaded(
      trace,
      `predicted wait ${Math.round(est.waitMs)} ms exceeds the queue budget of ${Math.round(budgetMs)} ms`,
      minWait - budgetMs,
    );
  trace.outcome = 'routed';
  trace.predictedWaitMs = est.waitMs;
  trace.reason = `${core.policy}: ${est.replica} predicted wait ${Math.round(est.waitMs)} ms, first token ${Math.round(est.ttftMs)} ms, within budget ${Math.round(budgetMs)} ms`;
  return { ok: true, model, version, replica: cands[i]!, budgetMs, rank: cls.rank, trace };
}
