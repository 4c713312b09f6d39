// The engine core's executor over a loaded llama.cpp engine, in the process that holds it (the engine host): each
// planned step becomes one engine batch of exactly the planned prefill chunks and decodes.
//
// Per step, before the batch: sequences the engine holds that no longer run with their cells (preempted, withdrawn,
// finished without the engine knowing) are freed; a sequence's first prefill chunk of a residency opens it on the
// engine with its token ids (prompt + generated, so a recompute re-prefills what its client already has, and the
// engine's text stream replays the generated tokens without emitting them). An item samples when it is a decode or
// its chunk completes the prefill; the token that reaches the sequence's output length is marked `last`, so the
// engine appends the text it held back and frees the sequence in the same step (finish `length`).
//
// Each item names the slot the batcher gave its sequence (actors/batcher/slots.ts): the engine opens the sequence in
// that llama.cpp sequence id and queues the step's items in ascending slot order, so the batch runs in the passes the
// batcher counted for it (StepShape.passes) and the cost model priced.
//
// A residency is known by the sequence's `runOrder` (new each time it is scheduled), not by `computed === 0`: with
// prefix reuse by slot (actors/batcher/slot-prefix.ts) a sequence starts with the tokens its slot's cells kept
// already computed, and its first chunk names them as the item's `prefix` for the engine to keep (and check).
import type { CoreExecutor, StepResult as CoreStepResult } from '../engine-core/types.ts';
import type { StepPlan as CorePlan } from '../batcher/types.ts';
import type { Sequence } from '../batcher/sequence.ts';
import type { Engine, StepItem } from './engine.ts';

/** How the executor is made: the replica (for messages), the clock it measures idle time on, and its step-time
 * prediction (the core reports it beside the measured time). */
export interface LlamaExecutorOptions {
  replica: string;
  now(): number;
  predictMs(plan: CorePlan): number;
}

/** What the executor measured: steps run, the engine's time in them, and the time the engine sat idle between a
 * step's return and the next dispatch while the core still had runnable work (switchyard's own overhead per step). */
export interface LlamaExecutorStats {
  steps: number;
  busyMs: number;
  idleMs: number;
  /** Gaps counted in idleMs (steps that followed a step with work left). */
  idleGaps: number;
}

/** A CoreExecutor over an engine, with its measurements. */
export interface LlamaExecutor extends CoreExecutor {
  stats(): LlamaExecutorStats;
  /** The core has no runnable work: the time until its next step is not the engine's idle time. */
  workEnded(): void;
}

/** A sequence the engine holds: the batcher's sequence and the residency it was opened in, the token ids it opened
 * with, its tokens generated so far (counted here, whatever the batcher has applied yet), and its decode item. */
interface Held {
  seq: Sequence;
  runOrder: number;
  tokens: readonly number[];
  generated: number;
  decode: StepItem;
}

type Sampled = NonNullable<CoreStepResult['sampled']>[number];

/** Creates the executor of one replica's core over `engine` (which it uses alone). */
export function createLlamaExecutor(engine: Engine, o: LlamaExecutorOptions): LlamaExecutor {
  const held = new Map<string, Held>();
  const stats: LlamaExecutorStats = { steps: 0, busyMs: 0, idleMs: 0, idleGaps: 0 };
  let stopped = false;
  let returnedAt = -1;

  // The engine serialises its calls: a free issued before a step runs before it. Errors of a free mean the engine
  // is gone (unloaded, failed), which the step after it reports.
  const free = (id: string): void => {
    if (held.delete(id)) void engine.free(id).catch(() => undefined);
  };

  /** Frees what the engine holds for sequences that no longer run with their cells. */
  const freeLeft = (): void => {
    for (const [id, h] of held) {
      const s = h.seq;
      if (s.gone || !s.running || s.runOrder !== h.runOrder) free(id);
    }
  };

  const open = (s: Sequence): Held => {
    const t = s.tokens!;
    const tokens = t.out.length > 0 ? [...t.prompt, ...t.out] : t.prompt;
    if (tokens.length !== s.prefillGoal) {
      throw new Error(`sequence ${s.id} holds ${tokens.length} token ids, its prefill needs ${s.prefillGoal}`);
    }
    const decode: StepItem = { seq: s.id, kind: 'decode', slot: s.slot };
    const h: Held = { seq: s, runOrder: s.runOrder, tokens, generated: t.out.length, decode };
    held.set(s.id, h);
    return h;
  };

  /** The engine items of a plan (opening sequences on their first chunk), and the ids whose token is their last. */
  const itemsOf = (plan: CorePlan): { items: StepItem[]; last: Set<string> | null } => {
    const items: StepItem[] = [];
    let last: Set<string> | null = null;
    for (const { seq: s, chunk } of plan.entries) {
      const t = s.tokens;
      if (!t) throw new Error(`sequence ${s.id} of engine replica ${o.replica} has no token ids`);
      const known = held.get(s.id);
      const first = chunk > 0 && (known === undefined || known.runOrder !== s.runOrder);
      const h = first ? open(s) : known;
      if (!h)
        throw new Error(`sequence ${s.id} of ${o.replica} steps from ${s.computed} but the engine does not hold it`);
      const sample = chunk === 0 || s.computed + chunk >= s.prefillGoal;
      const ends = sample && h.generated + 1 >= s.outputTokens;
      if (ends) (last ??= new Set()).add(s.id);
      if (chunk === 0) {
        items.push(ends ? { seq: s.id, kind: 'decode', last: true, slot: s.slot } : h.decode);
        continue;
      }
      items.push({
        seq: s.id,
        kind: 'prefill',
        tokens: h.tokens.slice(s.computed, s.computed + chunk),
        sample,
        ...(first ? { sampling: t.sampling } : {}),
        ...(first && t.out.length > 0 ? { streamed: [...t.out] } : {}),
        ...(ends ? { last: true } : {}),
        ...(first && s.computed > 0 ? { prefix: h.tokens.slice(0, s.computed) } : {}),
        slot: s.slot,
      });
    }
    return { items, last };
  };

  const run: CoreExecutor['run'] = (plan, _batch, done, fail) => {
    if (stopped) return;
    let step: ReturnType<typeof itemsOf>;
    try {
      freeLeft();
      step = itemsOf(plan);
    } catch (err) {
      // The plan disagrees with what the engine holds: a broken invariant, reported as the step's failure.
      queueMicrotask(() => fail(err));
      return;
    }
    const started = o.now();
    if (returnedAt >= 0) {
      stats.idleMs += started - returnedAt;
      stats.idleGaps += 1;
    }
    returnedAt = -1;
    engine.step({ items: step.items }).then(
      (r) => {
        if (stopped) return;
        returnedAt = o.now();
        stats.steps += 1;
        stats.busyMs += r.ms;
        const sampled: Sampled[] = r.sampled.map((t) => {
          const h = held.get(t.seq);
          if (h) h.generated += 1;
          const finish = t.finish ?? (step.last?.has(t.seq) ? 'length' : undefined);
          if (finish === undefined) return t;
          // The engine freed it in the step (it ended by itself, or its last token was taken).
          held.delete(t.seq);
          return { ...t, finish };
        });
        try {
          done({ busyMs: r.ms, sampled });
        } catch (err) {
          fail(err);
        }
      },
      (err: unknown) => {
        if (!stopped) fail(err);
      },
    );
  };

  return {
    predictMs: o.predictMs,
    run,
    release: free,
    stop: () => {
      stopped = true;
      for (const id of [...held.keys()]) free(id);
    },
    stats: () => ({ ...stats }),
    workEnded: () => {
      returnedAt = -1;
    },
  };
}
