// Traffic that has prefixes: applications with shared system prompts and multi-turn conversations, each turn
// resending every earlier turn, seeded. Conversations start by the traffic's arrival process; a conversation has a
// geometric number of turns (mean `turns.mean`, at most `turns.max`); each turn's prompt is the system prompt, every
// earlier user message and answer, and a new user message; the next turn comes `thinkMs` (exponential mean) after
// this one arrived (open-loop: set it above the answer's expected time). A turn says what its prompt is made of as
// segments (block-hash.ts), with its own answer last, so an engine core can cache what it computed and a later turn
// find it. `shared` is the share of conversations whose system prompt is one of the `systemPrompts` shared ones; the
// others get a system prompt of their own (0: no prefix is shared between conversations).
import type { PromptSegment } from '../batcher/block-hash.ts';
import type { Rng } from '../../runtime/rng.ts';

/** The conversation section of a traffic entry. */
export interface ConversationSpec {
  systemPrompts: number;
  systemTokens: number;
  shared: number;
  turns: { mean: number; max: number };
  userTokens: { mean: number; cv?: number; max?: number };
  thinkMs: number;
}

/** One turn, as the arrival stream hands it on. */
export interface Turn {
  t: number;
  promptTokens: number;
  outputTokens: number;
  /** The prompt's segments, then the answer's (outputTokens of it). */
  segments: PromptSegment[];
  conversation: number;
  turn: number;
}

interface Pending {
  t: number;
  order: number;
  conversation: number;
  turn: number;
  turns: number;
  /** What the next prompt starts with: the system prompt and every earlier message. */
  history: PromptSegment[];
}

/** Keys of shared system prompts are small; every other piece of content gets a fresh key above them. */
const FIRST_PRIVATE_KEY = 1_000_000;

/** A seeded stream of turns: `startGapMs()` draws the time to the next conversation's start, `outputTokens()` an
 * answer's length; at most `requests` turns in all. */
export function createConversationStream(o: {
  spec: ConversationSpec;
  requests: number;
  start: number;
  startGapMs: () => number;
  outputTokens: () => number;
  rng: Rng;
}): { next(): Turn | null } {
  const { spec, rng } = o;
  const pending: Pending[] = [];
  let nextStart = o.start;
  let conversations = 0;
  let produced = 0;
  let order = 0;
  let key = FIRST_PRIVATE_KEY;
  const draw = (d: { mean: number; cv?: number; max?: number }): number => {
    const x = Math.max(1, Math.round(rng.gamma(d.mean, d.cv ?? 1)));
    return d.max ? Math.min(d.max, x) : x;
  };
  /** Turns of a new conversation: geometric with the given mean, at least one, at most max. */
  const turnsOf = (): number => {
    const p = 1 / Math.max(1, spec.turns.mean);
    let n = 1;
    while (n < spec.turns.max && rng.next() > p) n++;
    return n;
  };
  const push = (p: Pending): void => {
    pending.push(p);
    pending.sort((a, b) => a.t - b.t || a.order - b.order);
  };
  const startConversation = (): void => {
    const sharedPrompt = spec.systemPrompts > 0 && rng.next() < spec.shared;
    const system = sharedPrompt ? Math.floor(rng.next() * spec.systemPrompts) : key++;
    push({
      t: nextStart,
      order: order++,
      conversation: conversations++,
      turn: 0,
      turns: turnsOf(),
      history: spec.systemTokens > 0 ? [{ key: system, tokens: spec.systemTokens }] : [],
    });
    nextStart += o.startGapMs();
  };

  return {
    next: () => {
      if (produced >= o.requests) return null;
      // Every conversation due before the earliest pending turn starts first.
      while (pending.length === 0 || nextStart <= pending[0]!.t) startConversation();
      const p = pending.shift()!;
      const user: PromptSegment = { key: key++, tokens: draw(spec.userTokens) };
      const outputTokens = o.outputTokens();
      const answer: PromptSegment = { key: key++, tokens: outputTokens };
      const prompt = [...p.history, user];
      produced++;
      if (p.turn + 1 < p.turns)
        push({
          ...p,
          t: p.t + rng.exponential(spec.thinkMs),
          order: order++,
          turn: p.turn + 1,
          history: [...prompt, answer],
        });
      return {
        t: p.t,
        promptTokens: prompt.reduce((n, s) => n + s.tokens, 0),
        outputTokens,
        segments: [...prompt, answer],
        conversation: p.conversation,
        turn: p.turn,
      };
    },
  };
}
