// Stateless models on the control plane's side: a request becomes one member of its replica's dynamic batch, the
// batch's result its one response; requests go to the replica whose batcher holds the fewest.
import type { StatelessItem } from '../batcher/stateless.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { Clock } from '../../runtime/clock.ts';
import type { Live } from './types.ts';

/** What stateless dispatch needs. */
export interface StatelessDeps {
  clock: Clock;
  replicas(): Iterable<ReplicaHandle>;
  ejected(id: string): string | null;
  markScheduled(l: Live, t: number): void;
  /** Hands tokens to a request's client (RequestTable.deliver: a client that throws fails alone). */
  deliver(l: Live, seq: number, n: number, t: number): void;
}

/** Stateless dispatch. */
export interface StatelessDispatch {
  /** Among the ready replicas of `r`'s model@version, the one whose core holds the fewest stateless requests. */
  leastQueued(r: ReplicaHandle): ReplicaHandle;
  /** `l` as a member of `r`'s dynamic batch. */
  item(l: Live, r: ReplicaHandle): StatelessItem;
}

/** Creates stateless dispatch. */
export function createStatelessDispatch(deps: StatelessDeps): StatelessDispatch {
  return {
    leastQueued: (r) => {
      let best = r;
      let bestQueued = r.work.queued();
      for (const x of deps.replicas()) {
        if (x.model !== r.model || x.version !== r.version || !x.ready() || deps.ejected(x.id)) continue;
        const q = x.work.queued();
        if (q < bestQueued) {
          best = x;
          bestQueued = q;
        }
      }
      return best;
    },
    item: (l, r) => ({
      id: l.id,
      model: l.model,
      version: l.version,
      tokens: l.spec.promptTokens,
      dtype: l.spec.dtype ?? 'bf16',
      adapter: l.spec.adapter ?? null,
      options: l.spec.options ?? {},
      receivedAt: l.receivedAt,
      started: (t) => {
        deps.markScheduled(l, t);
        l.actor.send({ type: 'request.scheduled', replica: r.id, t });
      },
      reply: (o) => {
        const t = deps.clock.now();
        if (!o.ok) {
          l.actor.send({ type: 'request.failed', code: o.failure.code, message: o.failure.message, tokens: 0, t });
          return;
        }
        l.actor.send({ type: 'request.firstToken', t });
        deps.deliver(l, 0, 1, t);
        l.streamed = 1;
        l.actor.send({ type: 'request.finished', tokens: 1, t });
      },
    }),
  };
}
