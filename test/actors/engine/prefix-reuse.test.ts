// Prefix reuse on the real llama.cpp engine: a conversation's next turn runs in the slot that kept the turn before it,
// prefills only what is new and streams the same greedy text as without reuse; a sequence preempted by recompute
// resumes from the cells it left; and the engine itself recomputes a prefix its slot does not hold, so a wrong guess
// never changes the text.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Engine, StepPlan, StepResult } from '../../../actors/engine/engine.ts';
import { loadLlamaEngine } from '../../../actors/engine/llama-engine.ts';
import { createLlamaExecutor } from '../../../actors/engine/llama-executor.ts';
import { createEngineCore } from '../../../actors/engine-core/core.ts';
import type { CoreReport, SubmitSeq } from '../../../actors/engine-core/types.ts';
import type { CoreLimits } from '../../../machines/core-messages.ts';
import { createWallClock } from '../../../runtime/clock.ts';
import { tinyModelFixture } from './fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
let engine: Engine;
const SEQUENCES = 3;
const LIMITS: CoreLimits = {
  policy: 'chunked',
  maxRunning: SEQUENCES,
  tokenBudget: 64,
  blockTokens: 16,
  blocksTotal: SEQUENCES * 16,
  maxContext: 255,
  watermarkBlocks: 0,
};

beforeAll(async () => {
  fixture = await tinyModelFixture();
  engine = await loadLlamaEngine(fixture.file, { contextTokens: 256, sequences: SEQUENCES, threads: 1 });
}, 120_000);
afterAll(async () => {
  await engine?.unload();
  await fixture?.cleanup();
});

/** The engine, recording every step's plan and result. */
function recording(): { engine: Engine; steps: { plan: StepPlan; result: StepResult }[] } {
  const steps: { plan: StepPlan; result: StepResult }[] = [];
  return {
    steps,
    engine: {
      ...engine,
      step: async (plan) => {
        const result = await engine.step(plan);
        steps.push({ plan, result });
        return result;
      },
    },
  };
}

/** Prefill tokens the engine evaluated for sequence `id` in `steps`, and the cells it kept for it from its slot. */
function prefillOf(steps: { plan: StepPlan; result: StepResult }[], id: string): { prefilled: number; kept: number } {
  let prefilled = 0;
  let kept = 0;
  for (const { plan, result } of steps) {
    for (const item of plan.items) {
      if (item.seq !== id || item.kind !== 'prefill') continue;
      prefilled += item.tokens.length;
      // A step opens at most one sequence here: its kept cells are this one's.
      if (item.prefix) kept += result.kept ?? 0;
    }
  }
  return { prefilled, kept };
}

const seqOf = (id: string, prompt: number[], maxTokens: number, order = 0): SubmitSeq => ({
  id,
  priority: 0,
  order,
  promptTokens: prompt.length,
  outputTokens: maxTokens,
  maxTokens,
  estOutputTokens: maxTokens,
  generated: 0,
  prompt,
  sampling: {},
});

/** A core over a recording engine on the wall clock, with its reports and what each sequence received. */
function coreOver(limits: CoreLimits) {
  const rec = recording();
  const reports: CoreReport[] = [];
  const got = new Map<string, { tokens: number[]; text: string; finish?: string }>();
  let crash: unknown;
  const clock = createWallClock();
  const core = createEngineCore({
    replica: 'r',
    epoch: 1,
    owner: 'tiny@1',
    clock,
    limits,
    executor: createLlamaExecutor(rec.engine, { replica: 'r', now: clock.now, predictMs: () => 1 }),
    report: (r) => {
      reports.push(r);
      for (const e of r.events) {
        if (e.k !== 't' && e.k !== 'f') continue;
        const g = got.get(e.id) ?? { tokens: [], text: '' };
        got.set(e.id, g);
        if (e.k === 't') {
          g.tokens.push(...(e.ids ?? []));
          g.text += e.text ?? '';
        } else g.finish = e.reason;
      }
    },
    crashed: (e) => (crash = e),
    checkInvariants: true,
  });
  const finished = (ids: readonly string[]) =>
    expect.poll(() => crash ?? ids.every((id) => got.get(id)?.finish !== undefined), { timeout: 60_000 }).toBe(true);
  return { core, got, reports, finished, steps: rec.steps };
}

/** Two turns of a conversation served by one core: the second turn's prompt is the first's, its answer, and more. */
async function conversation(prefixCache: boolean) {
  const { core, got, finished, steps } = coreOver({ ...LIMITS, prefixCache });
  const first = engine.tokenize('hello the world, said the tiny model to the morning light');
  // Another conversation takes slot 0, so the next turn does not simply find the lowest free slot again.
  core.submit([seqOf('other', engine.tokenize('a different opening'), 20, 0), seqOf('t1', first, 12, 1)]);
  await finished(['t1', 'other']);
  const answer = got.get('t1')!.tokens;
  const second = [...first, ...answer, ...engine.tokenize(' and then the evening came', { bos: false })];
  core.submit([seqOf('t2', second, 16, 2)]);
  await finished(['t2']);
  core.stop();
  return { first, answer, second, got, steps };
}

describe('prefix reuse on the llama.cpp engine', () => {
  it("runs a conversation's next turn in the slot that kept the turn before, with the same greedy text", async () => {
    const off = await conversation(false);
    const on = await conversation(true);
    expect(on.answer).toEqual(off.answer);
    expect(on.got.get('t2')).toEqual(off.got.get('t2'));
    expect(on.got.get('t2')!.tokens.length).toBe(16);
    // The first turn's cells hold its prompt and all of its answer but the last token (sampled, never evaluated).
    const cells = on.first.length + on.answer.length - 1;
    expect(prefillOf(off.steps, 't2')).toEqual({ prefilled: off.second.length, kept: 0 });
    expect(prefillOf(on.steps, 't2')).toEqual({ prefilled: on.second.length - cells, kept: cells });
    // t1 ran in slot 1, beside the other conversation in slot 0: t2 took slot 1, not the lowest free slot.
    const slotOf = (steps: typeof on.steps, id: string) =>
      steps.flatMap((st) => st.plan.items).find((item) => item.seq === id)?.slot;
    expect([slotOf(on.steps, 't1'), slotOf(on.steps, 't2')]).toEqual([1, 1]);
    // The engine found every token it was told its slot kept.
    expect(on.steps.every((s) => (s.result.refilled ?? 0) === 0)).toBe(true);
  }, 120_000);

  it('resumes a sequence preempted by recompute from the cells it left, with the text it would have had', async () => {
    const prompts = ['hello the world, said the tiny model', 'another prompt'].map((p) => engine.tokenize(p));
    const run = async (prefixCache: boolean) => {
      // Two sequences growing to ~50 tokens each in 5 blocks of 16: the newer one is preempted and recomputed.
      const { core, got, reports, finished, steps } = coreOver({ ...LIMITS, blocksTotal: 5, prefixCache });
      core.submit(prompts.map((p, i) => seqOf(`s${i}`, p, 40, i)));
      await finished(['s0', 's1']);
      core.stop();
      expect(reports.some((r) => r.events.some((e) => e.k === 'p'))).toBe(true);
      const prefilled = prefillOf(steps, 's0').prefilled + prefillOf(steps, 's1').prefilled;
      const kept = steps.reduce((n, s) => n + (s.result.kept ?? 0), 0);
      return { got, prefilled, kept };
    };
    const off = await run(false);
    const on = await run(true);
    for (const id of ['s0', 's1']) expect(on.got.get(id)).toEqual(off.got.get(id));
    expect(on.kept).toBeGreaterThan(0);
    expect(on.prefilled).toBeLessThan(off.prefilled);
  }, 120_000);

  it('recomputes the part of a prefix its slot does not hold, giving the text of a full prefill', async () => {
    const a = engine.tokenize('the cat sat on the mat all day');
    const b = engine.tokenize('the dog ran in the park all day');
    const split = 16;
    const greedy = async (seq: string, prompt: number[], slot: number, split: number) => {
      const out: number[] = [];
      const first: StepPlan['items'][number] =
        split > 0
          ? { seq, kind: 'prefill', tokens: prompt.slice(split), prefix: prompt.slice(0, split), sample: true, slot }
          : { seq, kind: 'prefill', tokens: prompt, sample: true, slot };
      let r = await engine.step({ items: [first] });
      const opened = r;
      out.push(r.sampled[0]!.token);
      while (out.length < 8 && r.sampled[0]!.finish === undefined) {
        r = await engine.step({ items: [{ seq, kind: 'decode', slot, last: out.length === 7 }] });
        out.push(r.sampled[0]!.token);
      }
      if (out.length < 8) await engine.free(seq);
      return { out, opened };
    };
    const want = await greedy('want', b, 0, 0);
    // Slot 1 keeps a's cells; b is then opened there claiming its first 16 tokens are kept: only those a shares are.
    await greedy('a', a, 1, 0);
    const shared = a.findIndex((t, i) => t !== b[i]);
    expect(shared).toBeGreaterThan(0);
    expect(shared).toBeLessThan(split);
    const got = await greedy('b', b, 1, split);
    expect(got.out).toEqual(want.out);
    expect(got.opened.kept).toBe(shared);
    expect(got.opened.refilled).toBe(split - shared);
    expect(got.opened.dispatches).toBe(2);
    // A slot that keeps nothing of it (slot 2 after a prompt without BOS) evaluates the whole prefix.
    await greedy('z', engine.tokenize('zebra', { bos: false }), 2, 0);
    const fresh = await greedy('c', b, 2, split);
    expect(fresh.out).toEqual(want.out);
    expect([fresh.opened.kept, fresh.opened.refilled]).toEqual([0, split]);
    // Without a prefix, the slot's cells are erased: nothing is kept.
    const again = await greedy('d', b, 1, 0);
    expect(again.out).toEqual(want.out);
    expect(again.opened.kept).toBeUndefined();
  }, 120_000);
});
