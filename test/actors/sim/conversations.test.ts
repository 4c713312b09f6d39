// The conversation traffic model: seeded, time-ordered, each turn's prompt the previous prompt plus its answer plus
// a new message (so its blocks start with the previous turn's), shared system prompts shared, and none with shared 0.
import { describe, expect, it } from 'vitest';
import { segmentBlockHashes, sharedBlocks } from '../../../actors/batcher/block-hash.ts';
import { createConversationStream, type ConversationSpec, type Turn } from '../../../actors/sim/conversations.ts';
import { createRng } from '../../../runtime/rng.ts';

const SPEC: ConversationSpec = {
  systemPrompts: 3,
  systemTokens: 400,
  shared: 1,
  turns: { mean: 4, max: 10 },
  userTokens: { mean: 60, cv: 0.5 },
  thinkMs: 8000,
};

function turns(spec: ConversationSpec, seed = 1, requests = 500): Turn[] {
  const rng = createRng(seed);
  const s = createConversationStream({
    spec,
    requests,
    start: 0,
    startGapMs: () => rng.exponential(500),
    outputTokens: () => 20 + Math.floor(rng.next() * 100),
    rng: rng.fork('conversations'),
  });
  const out: Turn[] = [];
  for (let t = s.next(); t; t = s.next()) out.push(t);
  return out;
}

describe('conversation traffic', () => {
  it('is seeded and time-ordered, and stops at the request count', () => {
    const a = turns(SPEC);
    expect(a).toHaveLength(500);
    expect(turns(SPEC)).toEqual(a);
    expect(turns(SPEC, 2)).not.toEqual(a);
    for (let i = 1; i < a.length; i++) expect(a[i]!.t).toBeGreaterThanOrEqual(a[i - 1]!.t);
  });

  it("starts each turn with the previous turn's prompt and answer", () => {
    const a = turns(SPEC);
    const byConversation = new Map<number, Turn[]>();
    for (const t of a) byConversation.set(t.conversation, [...(byConversation.get(t.conversation) ?? []), t]);
    const multi = [...byConversation.values()].filter((c) => c.length > 1);
    expect(multi.length).toBeGreaterThan(20);
    for (const c of multi)
      for (let i = 1; i < c.length; i++) {
        const prev = segmentBlockHashes(c[i - 1]!.segments, 16);
        const cur = segmentBlockHashes(c[i]!.segments, 16);
        // Every full block of the previous prompt and answer is a block of this prompt.
        expect(sharedBlocks(prev, cur)).toBe(prev.length);
        expect(c[i]!.turn).toBe(i);
        expect(c[i]!.promptTokens).toBeGreaterThan(c[i - 1]!.promptTokens + c[i - 1]!.outputTokens);
      }
    // Geometric turns with mean 4, at most 10.
    const lengths = [...byConversation.values()].map((c) => c.length);
    expect(Math.max(...lengths)).toBeLessThanOrEqual(10);
  });

  it('shares system prompts across conversations, and nothing when shared is 0', () => {
    const firstTurns = (spec: ConversationSpec) => turns(spec).filter((t) => t.turn === 0);
    const pairs = (ts: Turn[]) => {
      let shared = 0;
      for (let i = 1; i < ts.length; i++)
        if (sharedBlocks(segmentBlockHashes(ts[i]!.segments, 16), segmentBlockHashes(ts[0]!.segments, 16)) > 0)
          shared++;
      return shared;
    };
    expect(pairs(firstTurns(SPEC))).toBeGreaterThan(10);
    expect(pairs(firstTurns({ ...SPEC, shared: 0 }))).toBe(0);
  });
});
