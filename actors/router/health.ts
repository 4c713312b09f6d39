// Outlier ejection: a replica whose steps fail, or run slower than the cost model predicts by a configured factor
// (and by that factor more than the model's best other replica: an outlier among its peers), is taken out of routing
// for a back-off period that doubles on each repeat, then tried again. Only what a replica did counts: client errors
// are refused before any replica is chosen and never reach this module. When every replica of a model runs slow alike
// (the node's CPU is contended, the profile is off), none of them is an outlier: ejecting some would only take
// capacity away from the same work, and the rest would run no faster.

/** Settings of outlier ejection (config `routing.ejection`). */
export interface EjectionConfig {
  /** Eject when recent steps take this many times their predicted time (moving average) and this many times the
   * ratio of the model's best other replica that is in routing and has been judged (its peers' pace). */
  slowFactor: number;
  /** Steps observed since the last verdict before a replica can be judged slow. */
  minSteps: number;
  /** Weight of the newest step in the moving average of actual / predicted step time. */
  alpha: number;
  /** Replica failures in a row that eject it. */
  failures: number;
  /** First ejection; each repeat doubles it up to maxEjectionMs. */
  baseEjectionMs: number;
  maxEjectionMs: number;
  /** Never eject more than this fraction of a model's replicas (at least one always serves). */
  maxEjectedFraction: number;
}

/** Defaults of outlier ejection. */
export const DEFAULT_EJECTION: EjectionConfig = Object.freeze({
  slowFactor: 2,
  minSteps: 20,
  alpha: 0.1,
  failures: 1,
  baseEjectionMs: 30_000,
  maxEjectionMs: 300_000,
  maxEjectedFraction: 0.5,
});

/** An ejection or a return, for the report and the inspector. */
export interface HealthEvent {
  t: number;
  replica: string;
  kind: 'ejected' | 'returned' | 'kept';
  reason: string;
  untilMs?: number;
}

/** The replica events health follows (placement publishes them; other kinds are ignored). */
export type ReplicaLifecycle =
  | { kind: 'replica.failed'; replica: string; reason: string }
  | { kind: 'replica.created' | 'replica.ready' | 'replica.removed'; replica: string };

/** What health tracking needs to know about the node. */
export interface HealthDeps {
  now(): number;
  /** Model of a replica id, and how many replicas the model has now. */
  modelOf(replica: string): string | undefined;
  replicasOf(model: string): number;
}

/** The health of a control plane's replicas. */
export interface Health {
  /** Records one applied step: the cost model's prediction and how long it really took. */
  step(replica: string, predictedMs: number, actualMs: number): void;
  /** Records a failure of a replica (a step or GPU fault failed it). */
  failed(replica: string, reason: string): void;
  /** Why the replica is ejected now, or null; an ejection that has run out ends here (the replica is tried again). */
  ejected(replica: string): string | null;
  /** Why the replica is ejected now, or null, without ending a back-off that has run out (for status reports). */
  peek(replica: string): string | null;
  /** The moving ratio of actual to predicted step time of a replica (1 when unknown). */
  ratio(replica: string): number;
  /** Forgets a replica: a new one created under the same id (on new GPUs, after a failure) starts with a clean slate. */
  reset(replica: string): void;
  /** Follows placement's replica events: a failure counts against the replica, a creation starts it afresh. */
  observe(e: ReplicaLifecycle): void;
  readonly events: HealthEvent[];
}

interface Record {
  ratio: number;
  steps: number;
  failures: number;
  ejections: number;
  until: number;
  reason: string;
  returnedAt: number;
  /** A 'kept' event was logged since the last ejection or return (logged once, not on every step). */
  keptLogged: boolean;
}

const MAX_EVENTS = 10_000;

/** Creates the health tracker. */
export function createHealth(deps: HealthDeps, cfg: EjectionConfig = DEFAULT_EJECTION): Health {
  const recs = new Map<string, Record>();
  const events: HealthEvent[] = [];
  const log = (e: HealthEvent): void => {
    if (events.length < MAX_EVENTS) events.push(e);
  };
  const rec = (id: string): Record => {
    let r = recs.get(id);
    if (!r) {
      r = {
        ratio: 1,
        steps: 0,
        failures: 0,
        ejections: 0,
        until: -1,
        reason: '',
        returnedAt: -Infinity,
        keptLogged: false,
      };
      recs.set(id, r);
    }
    return r;
  };
  const isEjected = (r: Record, t: number): boolean => r.until > t;
  const reset = (id: string): void => {
    recs.delete(id);
  };
  /** The best (lowest) moving ratio among the model's other replicas in routing with minSteps steps; 1 if none has
   * stepped; null while some have stepped but none has been judged yet (the verdict waits for a peer to compare). */
  const peersRatio = (id: string, model: string | undefined, t: number): number | null => {
    let best = Infinity;
    let unjudged = false;
    for (const [other, r] of recs) {
      if (other === id || isEjected(r, t) || deps.modelOf(other) !== model) continue;
      if (r.steps < cfg.minSteps) unjudged ||= r.steps > 0;
      else if (r.ratio < best) best = r.ratio;
    }
    if (best === Infinity) return unjudged ? null : 1;
    return Math.max(1, best);
  };
  const ejectedOfModel = (model: string, t: number): number => {
    let n = 0;
    for (const [id, r] of recs) if (isEjected(r, t) && deps.modelOf(id) === model) n++;
    return n;
  };

  const eject = (id: string, r: Record, reason: string): void => {
    const t = deps.now();
    if (isEjected(r, t)) return;
    const model = deps.modelOf(id);
    const total = model ? deps.replicasOf(model) : 0;
    if (ejectedOfModel(model ?? '', t) + 1 > Math.floor(total * cfg.maxEjectedFraction)) {
      if (!r.keptLogged)
        log({
          t,
          replica: id,
          kind: 'kept',
          reason: `${reason}; not ejected: at most ${Math.round(cfg.maxEjectedFraction * 100)} % of ${model}'s ${total} replicas may be out`,
        });
      r.keptLogged = true;
      r.steps = 0;
      return;
    }
    // A replica that stayed healthy for a whole maximum back-off since it returned starts its back-off afresh.
    if (t - r.returnedAt > cfg.maxEjectionMs) r.ejections = 0;
    const ms = Math.min(cfg.maxEjectionMs, cfg.baseEjectionMs * 2 ** r.ejections);
    r.ejections++;
    r.until = t + ms;
    r.reason = reason;
    r.keptLogged = false;
    log({ t, replica: id, kind: 'ejected', reason, untilMs: r.until });
  };

  const failed = (id: string, reason: string): void => {
    const r = rec(id);
    r.failures++;
    if (r.failures >= cfg.failures) eject(id, r, `failed (${reason})`);
  };

  return {
    step: (id, predictedMs, actualMs) => {
      if (!(predictedMs > 0) || !(actualMs >= 0)) return;
      const r = rec(id);
      r.ratio += cfg.alpha * (actualMs / predictedMs - r.ratio);
      r.steps++;
      r.failures = 0;
      if (r.steps >= cfg.minSteps && r.ratio > cfg.slowFactor) {
        const peers = peersRatio(id, deps.modelOf(id), deps.now());
        if (peers === null || r.ratio <= cfg.slowFactor * peers) return;
        const limit =
          peers > 1
            ? `limit ${(cfg.slowFactor * peers).toFixed(2)}x: ${cfg.slowFactor}x its peers' ${peers.toFixed(2)}x`
            : `limit ${cfg.slowFactor}x`;
        eject(id, r, `steps take ${r.ratio.toFixed(2)}x their predicted time (${limit})`);
      }
    },
    failed,
    ejected: (id) => {
      const r = recs.get(id);
      if (!r || r.until < 0) return null;
      const t = deps.now();
      if (isEjected(r, t)) return r.reason;
      // Back-off over: tried again, judged afresh on new steps.
      log({ t, replica: id, kind: 'returned', reason: `back-off of ${r.reason} ended` });
      r.until = -1;
      r.keptLogged = false;
      r.returnedAt = t;
      r.ratio = 1;
      r.steps = 0;
      r.failures = 0;
      return null;
    },
    peek: (id) => {
      const r = recs.get(id);
      return r && isEjected(r, deps.now()) ? r.reason : null;
    },
    ratio: (id) => recs.get(id)?.ratio ?? 1,
    reset,
    observe: (e) => {
      if (e.kind === 'replica.failed') failed(e.replica, e.reason);
      else if (e.kind === 'replica.created') reset(e.replica);
    },
    events,
  };
}
