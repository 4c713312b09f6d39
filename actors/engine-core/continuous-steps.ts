// A core's steps under continuous batching: sequences submitted to the batcher, each step planned by it, a real
// engine's sampled tokens put on their sequences before the batcher counts them.
import { createContinuousBatcher } from '../batcher/continuous.ts';
import { runStepsLeft } from '../batcher/decode-run.ts';
import { createSequence, type Sequence } from '../batcher/sequence.ts';
import type { BatcherStats, StepPlan } from '../batcher/types.ts';
import type { ClosedBatch } from '../batcher/stateless.ts';
import type { CacheReport, SubmitItem, SubmitSeq } from '../../machines/core-messages.ts';
import type { CoreEvents } from './core-events.ts';
import type { EngineCoreOptions, StepResult } from './types.ts';

/** What the core's loop drives: a batcher (continuous or stateless) seen as a source of steps. */
export interface CoreSteps {
  /** Takes sequences; a refused one gets its `f` with an error. */
  submit(seqs: readonly SubmitSeq[], now: number): void;
  /** Takes stateless items; a refused one gets its `f` with an error. */
  submitItems(items: readonly SubmitItem[], now: number): void;
  /** Plans the next step at `now`; null when there is no work. */
  next(now: number): StepPlan | null;
  /** Steps that may follow the planned step `plan` as steps of one decode run, planned in its place (0: none). */
  runLeft(plan: StepPlan): number;
  /** The closed batch the planned step runs (stateless), else null. */
  batch(): ClosedBatch | null;
  /** Sequences or batch members in the planned step. */
  members(plan: StepPlan): number;
  /** Applies the step's result (its events go to the core's buffer). */
  complete(plan: StepPlan, r: StepResult, now: number): void;
  /** Drops a sequence or item, with no event. */
  cancel(id: string): void;
  saturated(): boolean;
  /** The batcher's counts (zeros for a stateless core) and the requests a stateless core holds. */
  stats(): BatcherStats;
  queued(): number;
  /** Its prefix cache's changes since the last call, as a report carries them; undefined when there are none. */
  cacheChanges(): CacheReport | undefined;
  /** Drops everything (the core stopped). */
  stop(): void;
}

/** Why `s` cannot be taken (too long for the context, a duplicate, token ids that disagree with its lengths). */
function refusal(s: SubmitSeq, o: EngineCoreOptions, has: (id: string) => boolean): string | null {
  const { maxContext } = o.limits;
  if (s.promptTokens + s.maxTokens > maxContext)
    return `sequence ${s.id}: prompt ${s.promptTokens} + max tokens ${s.maxTokens} exceed the context of ${maxContext}`;
  if (has(s.id)) return `sequence ${s.id} is already on replica ${o.replica}`;
  if (s.prompt !== undefined && (s.prompt.length !== s.promptTokens || (s.out?.length ?? 0) !== s.generated))
    return `sequence ${s.id} carries ${s.prompt.length} prompt and ${s.out?.length ?? 0} output token ids for ${s.promptTokens} and ${s.generated}`;
  return null;
}

/** Puts a real engine's sampled tokens on the plan's sequences, as the batcher will count them; a sequence that
 * should have sampled and did not is a broken step (the core crashes). */
function applySampled(
  plan: StepPlan,
  sampled: NonNullable<StepResult['sampled']>,
  bySeq: Map<string, NonNullable<StepResult['sampled']>[number]>,
  replica: string,
): void {
  bySeq.clear();
  for (const t of sampled) bySeq.set(t.seq, t);
  for (const { seq: s, chunk } of plan.entries) {
    if (s.gone || !s.running || !s.tokens) continue;
    if (chunk > 0 && s.computed + chunk < s.prefillGoal) continue;
    const t = bySeq.get(s.id);
    if (!t) throw new Error(`engine step of ${replica} sampled no token for ${s.id}`);
    s.tokens.out.push(t.token);
    s.tokens.lastText = t.text;
    s.tokens.lastLogprob = t.logprob ?? null;
    if (t.finish) s.tokens.finish = t.finish;
  }
  bySeq.clear();
}

/** Creates the continuous steps of a core; its sequences report to `ev`. */
export function createContinuousSteps(o: EngineCoreOptions, ev: CoreEvents): CoreSteps {
  const batcher = createContinuousBatcher(o.limits);
  const bySeq = new Map<string, NonNullable<StepResult['sampled']>[number]>();
  const ahead = (o.decodeRunMs ?? 0) > 0;
  // The step just completed when its sequences carry no token ids: planned again in place of a new plan when the
  // next step is the same pure decode. A real engine's steps are planned afresh (its executor may keep the plan).
  let last: StepPlan | null = null;
  const sequenceOf = (s: SubmitSeq, now: number): Sequence =>
    createSequence({
      id: s.id,
      priority: s.priority,
      order: s.order,
      promptTokens: s.promptTokens,
      outputTokens: s.outputTokens,
      maxTokens: s.maxTokens,
      estOutputTokens: s.estOutputTokens,
      receivedAt: now,
      generated: s.generated,
      listener: s.prompt ? ev.engine : ev.model,
      owner: o.owner,
      ...(s.blocks ? { hashes: s.blocks } : {}),
      ...(s.prompt
        ? {
            tokens: {
              prompt: s.prompt,
              // Copied: the core appends to it, and the message it came in is not its to change.
              out: s.out ? [...s.out] : [],
              lastText: '',
              finish: null,
              sampling: s.sampling ?? {},
            },
          }
        : {}),
    });
  return {
    submit: (seqs, now) => {
      for (const s of seqs) {
        const refused = refusal(s, o, batcher.has);
        if (refused !== null) ev.push({ k: 'f', id: s.id, reason: 'done', error: refused });
        else batcher.enqueue(sequenceOf(s, now), s.atHead === true);
      }
    },
    submitItems: (items) => {
      for (const it of items)
        ev.push({ k: 'f', id: it.id, reason: 'done', error: `replica ${o.replica} serves a generative model` });
    },
    next: (now) => {
      const again = last;
      last = null;
      // With decode runs on, through the batcher's own (O(1) a step): they settle when the core reads its load.
      if (again !== null && batcher.replan(again, ahead)) return again;
      return batcher.plan(now);
    },
    runLeft: (plan) => (ahead ? runStepsLeft(plan) : 0),
    batch: () => null,
    members: (plan) => plan.entries.length,
    complete: (plan, r, now) => {
      if (r.sampled) applySampled(plan, r.sampled, bySeq, o.replica);
      ev.completing = plan;
      ev.completingAt = now;
      batcher.complete(plan, now);
      ev.completing = null;
      if (o.checkInvariants) batcher.checkInvariants(plan, o.owner);
      last = plan.entries[0]?.seq.tokens === undefined ? plan : null;
    },
    cancel: (id) => void batcher.withdraw(id),
    saturated: batcher.saturated,
    stats: batcher.stats,
    queued: () => 0,
    cacheChanges: () => {
      const c = batcher.cacheChanges();
      if (c.added.length === 0 && c.evicted.length === 0 && !c.overflow) return undefined;
      return c.overflow ? { add: c.added, evict: [], reset: true } : { add: c.added, evict: c.evicted };
    },
    stop: () => void batcher.evictAll(),
  };
}
