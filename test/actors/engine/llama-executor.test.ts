// The engine core over a real llama.cpp engine in this process (actors/engine/llama-executor.ts): greedy text through
// the core is the engine's own, preemption by recompute continues where it was, and a cancel frees the cells.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Engine } from '../../../actors/engine/engine.ts';
import { loadLlamaEngine } from '../../../actors/engine/llama-engine.ts';
import { createLlamaExecutor, type LlamaExecutor } from '../../../actors/engine/llama-executor.ts';
import { createEngineCore } from '../../../actors/engine-core/core.ts';
import type { CoreReport, EngineCore, SubmitSeq } from '../../../actors/engine-core/types.ts';
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
const PROMPTS = ['hello the world, said the tiny model', 'another prompt', 'a third one, in the morning light'];

beforeAll(async () => {
  fixture = await tinyModelFixture();
  engine = await loadLlamaEngine(fixture.file, { contextTokens: 256, sequences: SEQUENCES, threads: 1 });
}, 120_000);
afterAll(async () => {
  await engine?.unload();
  await fixture?.cleanup();
});

/** The engine's own greedy generation of at most n tokens, one step at a time, its last token marked as such. */
async function engineGreedy(prompt: readonly number[], n: number) {
  const tokens: number[] = [];
  let text = '';
  let finish: string | undefined;
  let r = await engine.step({ items: [{ seq: 'ref', kind: 'prefill', tokens: prompt, sample: true, last: n === 1 }] });
  for (;;) {
    const t = r.sampled[0]!;
    tokens.push(t.token);
    text += t.text;
    finish = t.finish ?? (tokens.length === n ? 'length' : undefined);
    if (finish) break;
    r = await engine.step({ items: [{ seq: 'ref', kind: 'decode', last: tokens.length + 1 === n }] });
  }
  await engine.free('ref');
  return { tokens, text, finish };
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

/** A core over the engine on the wall clock, with its reports and what each sequence received. */
function coreOver(limits: CoreLimits = LIMITS) {
  const reports: CoreReport[] = [];
  const got = new Map<string, { tokens: number[]; text: string; finish?: string }>();
  let crash: unknown;
  const clock = createWallClock();
  const executor: LlamaExecutor = createLlamaExecutor(engine, { replica: 'r', now: clock.now, predictMs: () => 1 });
  const core: EngineCore = createEngineCore({
    replica: 'r',
    epoch: 1,
    owner: 'tiny@1',
    clock,
    limits,
    executor,
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
  return { core, executor, reports, got, finished, crashed: () => crash };
}

describe('the llama executor under an engine core', () => {
  it('streams the greedy tokens and text the engine gives alone, ending at max tokens with the held text', async () => {
    const prompt = engine.tokenize(PROMPTS[0]!);
    const want = await engineGreedy(prompt, 24);
    const { core, got, finished, executor } = coreOver();
    core.submit([seqOf('a', prompt, 24)]);
    await finished(['a']);
    expect(got.get('a')).toEqual(want);
    expect(engine.capacity().freeSequences).toBe(SEQUENCES);
    expect(executor.stats().steps).toBeGreaterThanOrEqual(want.tokens.length);
    core.stop();
  }, 60_000);

  it('gives each of several sequences batched together the greedy text it has alone', async () => {
    const prompts = PROMPTS.map((p) => engine.tokenize(p));
    const want: Awaited<ReturnType<typeof engineGreedy>>[] = [];
    for (const p of prompts) want.push(await engineGreedy(p, 16));
    const { core, got, finished } = coreOver();
    core.submit(prompts.map((p, i) => seqOf(`s${i}`, p, 16, i)));
    await finished(['s0', 's1', 's2']);
    prompts.forEach((_, i) => expect(got.get(`s${i}`)).toEqual(want[i]));
    core.stop();
  }, 60_000);

  it('continues a sequence preempted by recompute with the tokens it would have had', async () => {
    const prompts = PROMPTS.slice(0, 2).map((p) => engine.tokenize(p));
    const want: Awaited<ReturnType<typeof engineGreedy>>[] = [];
    for (const p of prompts) want.push(await engineGreedy(p, 40));
    // Two sequences growing to ~50 tokens each in 5 blocks of 16: the newer one is preempted and recomputed.
    const { core, got, reports, finished } = coreOver({ ...LIMITS, blocksTotal: 5 });
    core.submit(prompts.map((p, i) => seqOf(`s${i}`, p, 40, i)));
    await finished(['s0', 's1']);
    expect(reports.some((r) => r.events.some((e) => e.k === 'p'))).toBe(true);
    prompts.forEach((_, i) => expect(got.get(`s${i}`)).toEqual(want[i]));
    expect(engine.capacity().freeSequences).toBe(SEQUENCES);
    core.stop();
  }, 60_000);

  it('frees the cells of a cancelled sequence', async () => {
    const { core, got } = coreOver();
    core.submit([seqOf('c', engine.tokenize(PROMPTS[1]!), 200)]);
    await expect.poll(() => got.get('c')?.tokens.length ?? 0, { timeout: 30_000 }).toBeGreaterThan(2);
    expect(engine.capacity().used.c).toBeGreaterThan(0);
    core.cancel(['c']);
    await expect.poll(() => engine.capacity().used.c, { timeout: 10_000 }).toBeUndefined();
    expect(engine.capacity().freeSequences).toBe(SEQUENCES);
    core.stop();
  }, 60_000);

  it('fails the step, not the process, when a sequence comes without token ids', async () => {
    const { core, crashed } = coreOver();
    const { prompt: _prompt, ...bare } = seqOf('x', [1, 2, 3], 4);
    core.submit([bare]);
    await expect.poll(() => String(crashed()), { timeout: 10_000 }).toMatch(/x of engine replica r has no token ids/);
  });
});
