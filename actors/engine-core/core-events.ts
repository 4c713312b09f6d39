// What the batcher says of a core's sequences, as progress events: two shared listeners turn its callbacks into
// SeqEvents, collected in one buffer until the core's next report takes them. Consecutive decode steps of one set
// that one report covers (a decode run whose reports the core holds back) are one `g` listing each step's end.
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
  /** The step being completed, and when (the core's clock): the batcher's sameGap covers every one of its entries. */
  completing: StepPlan | null;
  completingAt: number;
  push(e: SeqEvent): void;
  /** Events collected since the last take. */
  pending(): number;
  /** Every event collected since the last take is a `g` (decode steps and nothing else). */
  decodeOnly(): boolean;
  /** Gives the last `g` collected its step's time, for a report made after that step ended. */
  stamp(): void;
  /** Hands over the events collected so far (the first `count` of them: the rest stay); a fresh buffer collects the
   * next. */
  take(count?: number): SeqEvent[];
}

type DecodeEvent = Extract<SeqEvent, { k: 'g' }>;

/** A `g` whose decode set is the previous one's: one shared, never changed event. */
const SAME_SET: DecodeEvent = Object.freeze({ k: 'g' }) as DecodeEvent;

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
  // Events other than `g` in the buffer; the last `g` pushed (its index, -1: none in this buffer) and its step's end.
  let others = 0;
  let open = -1;
  let openAt = 0;
  /** The last `g` as an event of its own that lists its steps' ends, starting with its first step's. */
  const stamped = (): DecodeEvent => {
    const g = events[open] as DecodeEvent;
    if (g.at !== undefined) return g;
    const out: DecodeEvent = g.ids === undefined ? { k: 'g', at: [openAt] } : { k: 'g', ids: g.ids, at: [openAt] };
    events[open] = out;
    return out;
  };
  const other = (e: SeqEvent): void => {
    others++;
    events.push(e);
  };
  const base = {
    scheduled: (seq: Sequence) => {
      // Cleared at its first token: the batcher's sameGap and decode runs leave a sequence awaiting one out.
      seq.awaitingToken = true;
      // What it found cached (attached when it was scheduled) it does not prefill again.
      other(seq.computed > 0 ? { k: 's', id: seq.id, c: seq.computed } : { k: 's', id: seq.id });
    },
    preempted: (seq: Sequence) => {
      other({ k: 'p', id: seq.id });
      release?.(seq.id);
    },
    finished: (seq: Sequence) => {
      other({ k: 'f', id: seq.id, reason: seq.tokens?.finish ?? 'done' });
      release?.(seq.id);
    },
  };
  const sink: CoreEvents = {
    model: {
      ...base,
      tokens: (seq, n) => {
        seq.awaitingToken = false;
        other({ k: 't', id: seq.id, n });
      },
      sameGap: () => {
        const p = sink.completing;
        if (p === null) throw new Error('a decode step completed outside a step of its core');
        const at = sink.completingAt;
        const same = p === lastPlan || sameSet(p.entries, lastIds);
        lastPlan = p;
        if (same && open >= 0 && open === events.length - 1) {
          // The step after the last `g`'s, of the same set, in the same report: that event lists it too.
          stamped().at!.push(at);
          return;
        }
        // A `g` before it in this buffer ended before this step: it says when.
        if (open >= 0) stamped();
        if (same) events.push(SAME_SET);
        else {
          lastIds = p.entries.map((e) => e.seq.id);
          events.push({ k: 'g', ids: lastIds as string[] });
        }
        open = events.length - 1;
        openAt = at;
      },
    },
    engine: {
      ...base,
      tokens: (seq, n) => {
        seq.awaitingToken = false;
        const t = seq.tokens;
        if (t === undefined) {
          other({ k: 't', id: seq.id, n });
          return;
        }
        const ids = t.out.slice(t.out.length - n);
        if (t.lastLogprob) other({ k: 't', id: seq.id, n, ids, text: t.lastText, lp: [t.lastLogprob] });
        else other({ k: 't', id: seq.id, n, ids, text: t.lastText });
      },
    },
    completing: null,
    completingAt: 0,
    push: other,
    pending: () => events.length,
    decodeOnly: () => others === 0,
    stamp: () => {
      if (open >= 0) stamped();
    },
    take: (count = events.length) => {
      const out = events;
      events = count < out.length ? out.splice(count) : [];
      others = 0;
      open = -1;
      for (let i = 0; i < events.length; i++) {
        if (events[i]!.k !== 'g') others++;
        else open = i;
      }
      return out;
    },
  };
  return sink;
}
