// The router's hold: admitted requests waiting for a replica of their model@version (none was ready when they were
// admitted, or the replica running them failed). It owns the `router` address: a held request's machine names
// `router` as its replica, so a cancel or expiry of a held request arrives here as `request.withdraw`.
import { ownerKey } from '../batcher/sequence.ts';
import type { HeldWork } from '../router/estimate.ts';
import type { Runtime } from '../../runtime/system.ts';
import type { Live } from './types.ts';

/** The address of the hold: what a held request's machine calls its replica. */
export const HELD_ADDRESS = 'router';

/** Requests held for a replica, per model@version, oldest (or resumed) first. */
export interface HeldQueue {
  /** Holds an admitted request behind the others. */
  push(l: Live): void;
  /** Holds an interrupted request ahead of the others (it already waited). */
  pushFront(l: Live): void;
  /** The queue of model@version, if one was ever made (possibly empty). */
  queueOf(model: string, version: string): Live[] | undefined;
  /** Requests of `model` (any version) held. */
  count(model: string): number;
  /** Requests of `model` (any version) held in the class of `rank`, and their prompt tokens. */
  classTotals(model: string, rank: number): { count: number; tokens: number };
  /** Requests of model@version held in the class of `rank` or a higher one: the work ahead of a new one. */
  ahead(model: string, version: string, rank: number): HeldWork;
  /** Non-empty queues, for dispatch. */
  nonEmpty(): Iterable<Live[]>;
  /** Every held request. */
  all(): Iterable<Live>;
}

// Module-level generators, not written inline per hold: a generator object's hidden class comes from its function, so
// a generator per hold gave each control plane's iterators a class of their own (and V8 deoptimized their callers).
function* nonEmptyOf(queues: Iterable<Live[]>): Generator<Live[]> {
  for (const q of queues) if (q.length > 0) yield q;
}
function* allOf(queues: Iterable<Live[]>): Generator<Live> {
  for (const q of queues) yield* q;
}

/** Creates the hold and registers it as `router` on `runtime`; `changed(model)` is told when a request leaves. */
export function createHeldQueue(runtime: Runtime, changed: (model: string) => void): HeldQueue {
  const held = new Map<string, Live[]>();
  // The interned owner key (`model@version`): a step's look-up hashes no new string.
  const key = ownerKey;
  const queue = (l: Live): Live[] => {
    const k = key(l.model, l.version);
    let q = held.get(k);
    if (!q) {
      q = [];
      held.set(k, q);
    }
    return q;
  };
  const now = (): number => runtime.clock.now();

  runtime.register(HELD_ADDRESS, (msg) => {
    if (msg.type !== 'request.withdraw') return;
    const id = msg.id;
    // The withdraw is emitted after the request reported its outcome (emits are deferred), so the caller's table
    // may have dropped it already: look in every queue.
    for (const q of held.values()) {
      const i = q.findIndex((x) => x.id === id);
      if (i < 0) continue;
      const model = q[i]!.model;
      q[i]!.heldSince = -1;
      q.splice(i, 1);
      changed(model);
      return;
    }
  });

  return {
    push: (l) => {
      l.heldSince = now();
      queue(l).push(l);
    },
    pushFront: (l) => {
      l.heldSince = now();
      queue(l).unshift(l);
    },
    queueOf: (model, version) => held.get(key(model, version)),
    count: (model) => {
      let n = 0;
      for (const [k, q] of held) if (k.startsWith(`${model}@`)) n += q.length;
      return n;
    },
    classTotals: (model, rank) => {
      let count = 0;
      let tokens = 0;
      for (const [k, q] of held) {
        if (!k.startsWith(`${model}@`)) continue;
        for (const l of q) {
          if (l.rank !== rank) continue;
          count++;
          tokens += l.spec.promptTokens;
        }
      }
      return { count, tokens };
    },
    ahead: (model, version, rank) => {
      const out = { count: 0, promptTokens: 0, outputTokens: 0 };
      for (const l of held.get(key(model, version)) ?? []) {
        if (l.rank > rank) continue;
        const generated = l.seq?.generated ?? 0;
        out.count++;
        out.promptTokens += l.spec.promptTokens + generated;
        out.outputTokens += Math.max(1, l.estOutputTokens - generated);
      }
      return out;
    },
    nonEmpty: () => nonEmptyOf(held.values()),
    all: () => allOf(held.values()),
  };
}
