// One resume(): an interrupted or held request goes to the best ready replica of its model@version (re-prefilling
// what its client already has), or waits in the hold. Held requests are dispatched as soon as a compatible replica
// can take them: when one becomes ready and whenever one completes a step, never onto the replica that is failing.
import type { Sequence } from '../batcher/sequence.ts';
import type { OutcomeCode } from '../../machines/outcomes.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { Router } from '../router/router.ts';
import type { Clock } from '../../runtime/clock.ts';
import type { HeldQueue } from './held-queue.ts';
import type { RequestTable } from './request-table.ts';
import type { Live } from './types.ts';

/** What resuming needs. */
export interface ResumeDeps {
  clock: Clock;
  router: Router;
  table: RequestTable;
  held: HeldQueue;
  /** The replica behind a routing view's id. */
  replica(id: string): ReplicaHandle | undefined;
  /** Hands a request to a replica (a sequence, or a stateless batch member). */
  handTo(l: Live, r: ReplicaHandle, generated: number, atHead: boolean): void;
  /** Placement's demand signal for `model`. */
  demand(model: string): void;
  /**
   * The old behaviour, as a mutation for the DST: the failing replica may be chosen (and the request then held),
   * and held requests are dispatched only when a replica becomes ready. Work conservation (P10) catches it.
   */
  heldOnReadyOnly?: boolean;
  /** The operator's log: a line for each replica's requests given up, and where they went. */
  log?(line: string): void;
}

/** Resuming and dispatching held requests. */
export interface Resumer {
  /** Requests a failed or drained replica gave up: resume each elsewhere, or hold it. */
  interrupted(seqs: Sequence[], reason: OutcomeCode): void;
  /** Dispatches the held requests of `r`'s model@version now that `r` is ready. */
  replicaReady(r: ReplicaHandle): void;
  /** Dispatches held requests of `r`'s model@version after `r` completed a step (work conservation). */
  stepCompleted(r: ReplicaHandle): void;
}

/** Creates the resumer. */
export function createResumer(deps: ResumeDeps): Resumer {
  const { clock, router, table, held } = deps;

  /** Resumes `l` (`generated` tokens streamed) on the best ready replica but `from`: false if none can take it. */
  const resume = (l: Live, generated: number, from: string | null, traceHeld: boolean, atHead: boolean): boolean => {
    const work = {
      promptTokens: l.spec.promptTokens + generated,
      estOutputTokens: l.spec.maxTokens - generated,
      priority: l.rank,
      ...(l.hashes ? { hashes: l.hashes } : {}),
    };
    const exclude = deps.heldOnReadyOnly ? undefined : (from ?? undefined);
    const pick = router.resume(l.model, l.version, l.spec.priority, work, exclude);
    // The old behaviour checked the choice afterwards: the failing replica still reads as ready.
    const view = pick.replica && pick.replica.id !== from ? pick.replica : null;
    if (view || traceHeld) table.addTrace(l, pick.trace);
    const target = view ? deps.replica(view.id) : undefined;
    if (!target) return false;
    l.heldSince = -1;
    l.actor.send({ type: 'request.requeued', replica: target.id, t: clock.now() });
    deps.handTo(l, target, generated, atHead);
    return true;
  };

  const dispatch = (model: string, version: string): void => {
    const q = held.queueOf(model, version);
    if (!q) return;
    deps.demand(model);
    while (q.length > 0) {
      const l = q.shift()!;
      if (l.actor.getSnapshot().status !== 'active') continue;
      const generated = l.seq?.generated ?? 0;
      if (!resume(l, generated, null, false, generated > 0)) {
        q.unshift(l);
        return;
      }
    }
  };

  /** One request a replica gave up: resumed elsewhere, held, or (its resumes spent) ended by its machine. */
  const interruptOne = (l: Live, s: Sequence, reason: OutcomeCode, t: number): 'resumed' | 'held' | 'ended' => {
    if (l.actor.getSnapshot().status !== 'active') return 'ended';
    const from = l.actor.getSnapshot().context.replica;
    l.actor.send({
      type: 'request.interrupted',
      code: reason,
      message: `the replica serving it failed (${reason})`,
      tokens: s.generated,
      t,
    });
    if (l.actor.getSnapshot().status !== 'active') return 'ended';
    // Resumed: re-prefill what the client already has, on another replica of the same model@version.
    if (resume(l, s.generated, from, true, true)) return 'resumed';
    held.pushFront(l);
    deps.demand(l.model);
    return 'held';
  };
  /** The log line of one replica's interrupted requests, by where each went. */
  const report = (from: string, count: number, reason: OutcomeCode, went: Map<string, number>): void => {
    const n = (k: string): number => went.get(k) ?? 0;
    deps.log?.(
      `${from} gave up ${count} request(s) (${reason}): ${n('resumed')} resumed elsewhere, ${n('held')} held ` +
        `for a replica, ${n('ended')} ended, ${n('internal')} failed internal`,
    );
  };

  return {
    interrupted: (seqs, reason) => {
      const t = clock.now();
      const went = new Map<string, number>();
      // Where they were, read before any is moved (for the log line).
      const from = deps.log && seqs.length > 0 ? (seqs[0]!.tag as Live).actor.getSnapshot().context.replica : null;
      for (const s of seqs) {
        const l = s.tag as Live;
        let where: string;
        try {
          where = interruptOne(l, s, reason, t);
        } catch (e) {
          // This request alone fails; the others the replica gave up are resumed or held as usual.
          table.contain(l.id, 'resuming it', e);
          where = 'internal';
        }
        went.set(where, (went.get(where) ?? 0) + 1);
      }
      if (deps.log && seqs.length > 0) report(from ?? 'a replica', seqs.length, reason, went);
    },
    replicaReady: (r) => dispatch(r.model, r.version),
    stepCompleted: (r) => {
      if (deps.heldOnReadyOnly || !r.accepting()) return;
      if ((held.queueOf(r.model, r.version)?.length ?? 0) > 0) dispatch(r.model, r.version);
    },
  };
}
