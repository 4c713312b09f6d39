// The narrow view of a replica that routing reads: identity, model@version, readiness, predicted wait and KV
// headroom, and the work waiting in its queue. The router never touches a replica's actor or batcher itself.
import type { ReplicaHandle } from '../replica.ts';
import { estimateWait, type WaitEstimate, type WorkSpec } from './estimate.ts';

/** What the router knows of one replica. */
export interface ReplicaView {
  readonly id: string;
  readonly model: string;
  readonly version: string;
  /** True when the replica takes new work (ready: idle, busy or saturated). */
  ready(): boolean;
  /** Its machine state as a dotted path, for decision traces. */
  state(): string;
  /** KV blocks in all: a request that needs more can never run here. */
  readonly blocksTotal: number;
  /** Tokens per KV block (a prefix cache keeps whole blocks). */
  readonly blockTokens: number;
  /** Predicted wait, first token and KV headroom of `work` here; `slowdown` scales the cost model's step times. */
  /** `now`: the router's clock, to place the step in flight (absent: half a step is assumed). */
  estimate(work: WorkSpec, slowdown: number, now?: number): WaitEstimate;
  /** Requests of class `rank` waiting in its queue, and their prompt tokens. */
  waiting(rank: number): { count: number; tokens: number };
}

/** Only `ready` replicas (idle, busy or saturated) take new work; placing, loading, draining and failed ones do not.
 * The replica's own predicate (its `ready` tag), as a function to filter with. */
export function isReady(r: ReplicaHandle): boolean {
  return r.ready();
}

const views = new WeakMap<ReplicaHandle, ReplicaView>();

/** The routing view of a replica (one per replica, made on first use). */
export function viewOf(r: ReplicaHandle): ReplicaView {
  let v = views.get(r);
  if (v) return v;
  v = {
    id: r.id,
    model: r.model,
    version: r.version,
    ready: () => isReady(r),
    state: () => r.state(),
    blocksTotal: r.work.limits.blocksTotal,
    blockTokens: r.work.limits.blockTokens,
    estimate: (work, slowdown, now) => estimateWait(r, work, slowdown, now),
    // The class totals only: stats() would walk the running set whenever a step changed it.
    waiting: (rank) => r.work.waitingOf(rank),
  };
  views.set(r, v);
  return v;
}
