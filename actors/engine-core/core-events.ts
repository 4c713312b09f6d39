// What the batcher says of a core's sequences, as progress events: two shared listeners turn its callbacks into
// SeqEvents, collected in one buffer until the core's next report takes them.
import type { Sequence, SequenceListener } from '../batcher/sequence.ts';
import type { StepPlan } from '../batcher/types.ts';
import type { SeqEvent } from '../../machines/core-messages.ts';

/** A core's event buffer and the listeners that fill it. */
export interface CoreEvents {
  /** The listener of cost-model sequences: a decode step of one set at one time comes as one `g` (sameGap). */
  readonly model: SequenceListener;
  /** The listener of sequences with token ids: it has no sameGap, so each token comes with its id and text (the
   * batcher's completion and decode runs use sameGap only when the listener has it). */
  readonly engine: SequenceListener;
  /** The step being completed: the batcher's sameGap covers every one of its entries. */
  completing: StepPlan | null;
  push(e: SeqEvent): void;
  /** Events collected since the last take. */
  pending(): number;
  /** Hands over the events collected so far; a fresh buffer collects the next. */
  take(): SeqEvent[];
}

/** A `g` whose decode set is the previous one's: one shared, never changed event. */
const SAME_SET: SeqEvent = Object.freeze({ k: 'g' }) as SeqEvent;

/** Whether `entries` are the sequences named by `ids`, in order. */
function sameSet(entries: StepPlan['entries'], ids: readonly string[]): boolean {
  const n = entries.length;
  if (n !== ids.length) return false;
  for (let i = 0; i < n; i++) if (entries[i]!.seq.id !== ids[i]) return false;
  return true;
}

/** Creates a core's event buffer; `release` (a real engine's) hears of every sequence that left the running set. */
export function createCoreEvents(release?: (id: string) => void): CoreEvents {
  let events: SeqEvent[] = [];
  // The decode set of the last `g` (handed out in that event, so replaced, never changed) and the plan it came from:
  // a plan planned again in place keeps its entries, so the same plan means the same set without comparing.
  let lastIds: readonly string[] = [];
  let lastPlan: StepPlan | null = null;
  const base = {
    scheduled: (seq: Sequence) => {
      // Cleared at its first token: the batcher's sameGap and decode runs leave a sequence awaiting one out.
      seq.awaitingToken = true;
      events.push({ k: 's', id: seq.id });
    },
    preempted: (seq: Sequence) => {
      events.push({ k: 'p', id: seq.id });
      release?.(seq.id);
    },
    finished: (seq: Sequence) => {
      events.push({ k: 'f', id: seq.id, reason: seq.tokens?.finish ?? 'done' });
      release?.(seq.id);
    },
  };
  const sink: CoreEvents = {
    model: {
      ...base,
      tokens: (seq, n) => {
        seq.awaitingToken = false;
        events.push({ k: 't', id: seq.id, n });
      },
      sameGap: () => {
        const p = sink.completing;
        if (p === null) throw new Error('a decode step completed outside a step of its core');
        if (p === lastPlan || sameSet(p.entries, lastIds)) {
          lastPlan = p;
          events.push(SAME_SET);
          return;
        }
        lastPlan = p;
        lastIds = p.entries.map((e) => e.seq.id);
        events.push({ k: 'g', ids: lastIds as string[] });
      },
    },
    engine: {
      ...base,
      tokens: (seq, n) => {
        seq.awaitingToken = false;
        const t = seq.tokens;
        if (t === undefined) {
          events.push({ k: 't', id: seq.id, n });
          return;
        }
        events.push({ k: 't', id: seq.id, n, ids: t.out.slice(t.out.length - n), text: t.lastText });
      },
    },
    completing: null,
    push: (e) => void events.push(e),
    pending: () => events.length,
    take: () => {
      const out = events;
      events = [];
      return out;
    },
  };
  return sink;
}
