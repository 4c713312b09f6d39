// A core's steps under dynamic batching (a stateless model): items submitted to the stateless batcher, one closed
// batch per step, each member answered once with its result (the simulated model's: its token count) or its error.
import { failure } from '../../machines/outcomes.ts';
import { idleLoad, type SubmitItem } from '../../machines/core-messages.ts';
import type { BatcherStats, StepPlan } from '../batcher/types.ts';
import {
  batchShape,
  createStatelessBatcher,
  type ClosedBatch,
  type StatelessItem,
  type StatelessLimits,
  type StatelessOutcome,
} from '../batcher/stateless.ts';
import type { CoreEvents } from './core-events.ts';
import type { CoreSteps } from './continuous-steps.ts';
import type { EngineCoreOptions } from './types.ts';

/** A stateless core has no KV ledger: its batcher counts are zeros. */
const NO_BATCHER: BatcherStats = Object.freeze(idleLoad());

/** The step of a closed batch: one padded prefill per member, no decodes (what the replica planned for it). */
function planOf(b: ClosedBatch, now: number): StepPlan {
  return {
    entries: [],
    shape: batchShape(b),
    tokens: b.tokens,
    prefillTokens: b.tokens,
    decodes: 0,
    blocksUsed: 0,
    predictedMs: 0,
    dispatchedAt: now,
  };
}

/** Creates the stateless steps of a core with these limits; `wake` runs when a batch closes and can run. */
export function createStatelessSteps(
  o: EngineCoreOptions,
  limits: StatelessLimits,
  ev: CoreEvents,
  wake: () => void,
): CoreSteps {
  const stateless = createStatelessBatcher({ clock: o.clock, limits, name: o.replica, onReady: wake });
  let batch: ClosedBatch | null = null;
  const answer = (id: string, outcome: StatelessOutcome): void => {
    if (outcome.ok) {
      const result = outcome.result as number;
      ev.push({ k: 'f', id, reason: 'done', result, batch: outcome.batch, size: outcome.batchSize });
    } else {
      ev.push({ k: 'f', id, reason: 'done', error: `${outcome.failure.code}: ${outcome.failure.message}` });
    }
  };
  // The batcher's key takes a model and version: every item of a core is its owner's, so the owner stands for both.
  const itemOf = (it: SubmitItem, now: number): StatelessItem => ({
    id: it.id,
    model: o.owner,
    version: '',
    tokens: it.tokens,
    dtype: it.dtype,
    adapter: it.adapter,
    options: it.options,
    receivedAt: now,
    started: () => ev.push({ k: 's', id: it.id }),
    reply: (outcome) => answer(it.id, outcome),
  });
  return {
    submit: (seqs) => {
      for (const s of seqs)
        ev.push({ k: 'f', id: s.id, reason: 'done', error: `replica ${o.replica} serves a stateless model` });
    },
    submitItems: (items, now) => {
      for (const it of items) {
        const refused = stateless.submit(itemOf(it, now));
        if (refused) ev.push({ k: 'f', id: it.id, reason: 'done', error: `${refused.code}: ${refused.message}` });
      }
    },
    next: (now) => {
      batch = stateless.next();
      return batch === null ? null : planOf(batch, now);
    },
    runLeft: () => 0,
    batch: () => batch,
    members: () => batch?.members.length ?? 0,
    complete: () => {
      const b = batch;
      batch = null;
      // The simulated model's result for each member: what it was given.
      if (b !== null)
        stateless.complete(
          b.id,
          b.members.map((m) => m.tokens),
        );
      if (o.checkInvariants) stateless.checkInvariants();
    },
    cancel: (id) => void stateless.cancel(id),
    saturated: () => stateless.stats().queued >= limits.maxQueued,
    stats: () => NO_BATCHER,
    queued: () => stateless.stats().queued,
    cacheChanges: () => undefined,
    stop: () => {
      batch = null;
      stateless.abortAll(failure('replica_failed', `replica ${o.replica} stopped`));
    },
  };
}
