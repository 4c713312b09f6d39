// The replica's side of a real engine: turns each planned step into the wire's items, opens sequences on the engine
// (their tokens travel once per residency), frees the ones that left (preempted, cancelled), applies the sampled
// tokens and reconciles the engine's reported cache with the ledger.
//
// How a sequence ends early: the worker reports `finish` (the model's end token, a stop string, or its max tokens)
// with the sampled token; apply() records it on the sequence's tokens, and the batcher finishes the sequence when it
// counts that token. The worker has already freed the sequence's cells by then.
import type { ContinuousLimits, StepPlan } from './batcher/continuous.ts';
import type { Sequence } from './batcher/sequence.ts';
import type { NodeMessage } from '../transport/protocol.ts';

type Execute = Extract<NodeMessage, { type: 'step.execute' }>;
type Completed = Extract<NodeMessage, { type: 'step.completed' }>;
type Open = NonNullable<Execute['open']>[number];
type Item = NonNullable<Execute['items']>[number];

/** The engine fields of a step: sequences to free first, sequences it opens, and its items. */
export interface EngineWire {
  free: string[];
  open: Open[];
  items: Item[];
}

/** What a replica served by a real engine keeps about the sequences the engine holds. */
export interface EngineSteps {
  /** The wire form of `plan`, given the batcher's running sequences after planning. */
  wire(plan: StepPlan, running: readonly Sequence[]): EngineWire;
  /** Records the sampled tokens of `plan` on its sequences; returns what disagrees with the ledger, if anything. */
  apply(plan: StepPlan, m: Completed): string | null;
  /** A sequence left the replica (cancelled, expired): true if the engine holds it and must free it. */
  withdrawn(id: string): boolean;
  /** The replica failed or restarted: the engine (a new host) holds nothing. */
  reset(): void;
  /** The cache the engine reported last. */
  cache(): { sequences: number; cellsPerSequence: number } | null;
}

const samplingFields = (s: Sequence): Omit<Open, 'seq' | 'tokens' | 'left'> => {
  const p = s.tokens!.sampling;
  return {
    ...(p.temperature !== undefined ? { temperature: p.temperature } : {}),
    ...(p.topP !== undefined ? { topP: p.topP } : {}),
    ...(p.seed !== undefined ? { seed: p.seed } : {}),
    ...(p.stop !== undefined && p.stop.length > 0 ? { stop: [...p.stop] } : {}),
  };
};

/** Creates the engine bookkeeping of one replica with the given ledger limits. */
export function createEngineSteps(replica: string, limits: Pick<ContinuousLimits, 'maxRunning' | 'maxContext'>) {
  const held = new Set<string>();
  let cache: { sequences: number; cellsPerSequence: number } | null = null;

  const wire = (plan: StepPlan, running: readonly Sequence[]): EngineWire => {
    const still = new Set<string>();
    for (const s of running) if (s.computed > 0) still.add(s.id);
    const free: string[] = [];
    for (const id of held) {
      if (!still.has(id)) {
        free.push(id);
        held.delete(id);
      }
    }
    const open: Open[] = [];
    const items: Item[] = plan.entries.map(({ seq: s, chunk }) => {
      if (!s.tokens) throw new Error(`sequence ${s.id} on engine replica ${replica} has no token ids`);
      if (chunk > 0 && s.computed === 0) {
        const tokens = [...s.tokens.prompt, ...s.tokens.out];
        if (tokens.length !== s.prefillGoal)
          throw new Error(`sequence ${s.id} holds ${tokens.length} token ids, its prefill needs ${s.prefillGoal}`);
        const generated = s.tokens.out.length;
        open.push({
          seq: s.id,
          tokens,
          left: Math.max(1, s.maxTokens - s.generated),
          ...samplingFields(s),
          ...(generated > 0 ? { generated } : {}),
        });
        held.add(s.id);
      }
      const sample = chunk === 0 || s.computed + chunk >= s.prefillGoal;
      return { seq: s.id, from: s.computed, n: chunk, sample };
    });
    return { free, open, items };
  };

  const apply = (plan: StepPlan, m: Completed): string | null => {
    if (m.cache) cache = m.cache;
    const bySeq = new Map((m.sampled ?? []).map((t) => [t.seq, t]));
    let problem: string | null = null;
    for (const { seq: s, chunk } of plan.entries) {
      if (s.gone || !s.running || !s.tokens) continue;
      const sampled = chunk === 0 || s.computed + chunk >= s.prefillGoal;
      if (!sampled) continue;
      const t = bySeq.get(s.id);
      if (!t) {
        problem ??= `engine step ${m.step} of ${replica} sampled no token for ${s.id}`;
        continue;
      }
      s.tokens.out.push(t.token);
      s.tokens.lastText = t.text;
      if (t.finish) {
        s.tokens.finish = t.finish;
        held.delete(s.id);
      }
    }
    if (cache && (cache.cellsPerSequence < limits.maxContext || cache.sequences < limits.maxRunning)) {
      problem ??=
        `engine cache of ${replica} (${cache.sequences} sequences x ${cache.cellsPerSequence} cells) is smaller ` +
        `than its ledger (${limits.maxRunning} x ${limits.maxContext})`;
    }
    return problem;
  };

  const steps: EngineSteps = {
    wire,
    apply,
    withdrawn: (id) => held.delete(id),
    reset: () => held.clear(),
    cache: () => cache,
  };
  return steps;
}
