// Tests of the llama.cpp engine on the generated tiny model: one batch per planned step, real tokens and text.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { getLlama, LlamaLogLevel, type Token } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineError, type Engine, type SamplingParams } from '../../../actors/engine/engine.ts';
import { loadLlamaEngine } from '../../../actors/engine/llama-engine.ts';
import { tinyModelFixture } from './fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
let engine: Engine;
const PROMPT_A = 'hello the world, said the tiny model in the morning';
const PROMPT_B = 'another prompt';

/** Node-llama-cpp's own plain greedy generation of `n` tokens after `prompt`, with no scheduler in front. */
async function referenceGreedy(file: string, prompt: readonly number[], n: number): Promise<number[]> {
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 1 });
  const model = await llama.loadModel({ modelPath: file });
  const context = await model.createContext({ contextSize: 256, threads: 1 });
  const out: number[] = [];
  for await (const token of context.getSequence().evaluate([...prompt] as Token[], { temperature: 0 })) {
    out.push(token);
    if (out.length === n) break;
  }
  await context.dispose();
  await model.dispose();
  return out;
}

/** Drives one sequence alone: prefill with a sample, then decode until `n` tokens. */
async function generate(seq: string, prompt: readonly number[], n: number, sampling?: SamplingParams) {
  const tokens: number[] = [];
  let text = '';
  let r = await engine.step({ items: [{ seq, kind: 'prefill', tokens: prompt, sample: true, sampling }] });
  for (;;) {
    tokens.push(r.sampled[0]!.token);
    text += r.sampled[0]!.text;
    if (tokens.length === n || r.sampled[0]!.finish) break;
    r = await engine.step({ items: [{ seq, kind: 'decode' }] });
  }
  return { tokens, text, finish: r.sampled[0]!.finish };
}

const refusal = async (p: Promise<unknown>): Promise<EngineError> => {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(EngineError);
  return err as EngineError;
};

beforeAll(async () => {
  fixture = await tinyModelFixture();
  engine = await loadLlamaEngine(fixture.file, { contextTokens: 256, sequences: 3, threads: 1 });
});
afterAll(async () => {
  await engine?.unload();
  await fixture?.cleanup();
});

describe('llama engine', () => {
  describe('loading', () => {
    it('refuses a missing, a non-GGUF and a truncated file with invalid_model_file naming the file', async () => {
      const missing = join(fixture.dir, 'missing.gguf');
      const text = join(fixture.dir, 'text.gguf');
      const truncated = join(fixture.dir, 'truncated.gguf');
      await writeFile(text, 'this is not a model');
      const { readFile } = await import('node:fs/promises');
      await writeFile(truncated, (await readFile(fixture.file)).subarray(0, 100_000));
      for (const file of [missing, text, truncated]) {
        const err = await refusal(loadLlamaEngine(file, { contextTokens: 64, sequences: 1 }));
        expect(err.code).toBe('invalid_model_file');
        expect(err.message).toContain(file);
      }
    });

    it('reports the cache it really allocated: a fixed block of cells per sequence', () => {
      const cap = engine.capacity();
      expect(cap.sequences).toBe(3);
      expect(cap.totalCells).toBe(3 * 256);
      expect(cap.cellsPerSequence).toBe(255);
      expect(cap.freeSequences).toBe(3);
    });
  });

  describe('stepping', () => {
    it('streams the same greedy tokens and text as node-llama-cpp generating the prompt alone', async () => {
      const a = engine.tokenize(PROMPT_A);
      const b = engine.tokenize(PROMPT_B);
      // Step 1: first chunk of A (no sample) with all of B; step 2: the rest of A while B decodes; then both decode.
      const s1 = await engine.step({
        items: [
          { seq: 'a', kind: 'prefill', tokens: a.slice(0, 8), sample: false },
          { seq: 'b', kind: 'prefill', tokens: b, sample: true },
        ],
      });
      expect(s1.sampled.map((s) => s.seq)).toEqual(['b']);
      expect(s1.dispatches).toBe(1);
      expect(s1.tokens).toBe(8 + b.length);
      const s2 = await engine.step({
        items: [
          { seq: 'a', kind: 'prefill', tokens: a.slice(8), sample: true },
          { seq: 'b', kind: 'decode' },
        ],
      });
      const outA = [s2.sampled[0]!.token];
      let textA = s2.sampled[0]!.text;
      const outB = [s1.sampled[0]!.token, s2.sampled[1]!.token];
      while (outA.length < 24) {
        const s = await engine.step({
          items: [
            { seq: 'a', kind: 'decode' },
            { seq: 'b', kind: 'decode' },
          ],
        });
        expect(s.dispatches).toBe(1);
        outA.push(s.sampled[0]!.token);
        textA += s.sampled[0]!.text;
        outB.push(s.sampled[1]!.token);
      }
      textA += (await engine.free('a')).text;
      await engine.free('b');
      const refA = await referenceGreedy(fixture.file, a, 24);
      expect(outA).toEqual(refA);
      expect(textA).toBe(engine.detokenize(refA));
      expect(outB).toEqual(await referenceGreedy(fixture.file, b, outB.length));
    });

    it('reproduces seeded sampling at a temperature, and another seed gives other tokens', async () => {
      const prompt = engine.tokenize(PROMPT_B);
      const one = await generate('s1', prompt, 16, { temperature: 1.5, seed: 42 });
      await engine.free('s1');
      const again = await generate('s2', prompt, 16, { temperature: 1.5, seed: 42 });
      await engine.free('s2');
      const other = await generate('s3', prompt, 16, { temperature: 1.5, seed: 43 });
      await engine.free('s3');
      expect(again.tokens).toEqual(one.tokens);
      expect(other.tokens).not.toEqual(one.tokens);
    });

    it('ends a sequence at a stop string and never streams the stop string', async () => {
      const prompt = engine.tokenize(PROMPT_A);
      const free = await generate('free', prompt, 24);
      await engine.free('free');
      const stop = free.text.slice(5, 7);
      const cut = free.text.indexOf(stop);
      const stopped = await generate('stopped', prompt, 24, { stop: [stop] });
      await engine.free('stopped');
      expect(stopped.finish).toBe('stop');
      expect(stopped.text).toBe(free.text.slice(0, cut));
    });

    it('refuses to decode a sequence that has no sampled token yet', async () => {
      const err = await refusal(engine.step({ items: [{ seq: 'ghost', kind: 'decode' }] }));
      expect(err.code).toBe('invalid_request');
    });
  });

  describe('slots', () => {
    /** Greedy decoding of `prompts` side by side, each opened in its slot: tokens, text and each step's passes. */
    async function sideBySide(e: Engine, prompts: readonly string[], slots: readonly number[], n: number) {
      const ids = prompts.map((_, i) => `s${i}`);
      const tokens: number[][] = prompts.map(() => []);
      const texts = prompts.map(() => '');
      const passes: number[] = [];
      const take = (r: Awaited<ReturnType<Engine['step']>>): void => {
        passes.push(r.passes!);
        for (const t of r.sampled) {
          const i = ids.indexOf(t.seq);
          tokens[i]!.push(t.token);
          texts[i] += t.text;
        }
      };
      take(
        await e.step({
          items: prompts.map((p, i) => ({
            seq: ids[i]!,
            kind: 'prefill' as const,
            tokens: e.tokenize(p),
            sample: true,
            slot: slots[i]!,
          })),
        }),
      );
      while (tokens[0]!.length < n) {
        take(await e.step({ items: ids.map((seq, i) => ({ seq, kind: 'decode' as const, slot: slots[i]! })) }));
      }
      for (const [i, seq] of ids.entries()) texts[i] += (await e.free(seq)).text;
      return { tokens, texts, passes };
    }

    it('decodes sequences in consecutive slots in one pass, with the same greedy text as a pass each and as alone', async () => {
      const wide = await loadLlamaEngine(fixture.file, { contextTokens: 256, sequences: 6, threads: 1 });
      try {
        const prompts = [PROMPT_A, PROMPT_B, 'a third prompt, longer than the second'];
        const packed = await sideBySide(wide, prompts, [0, 1, 2], 24);
        // Slots 0, 2 and 4: no two of them rise by one, so every sequence runs as a pass of its own (the ordering
        // before slots were assigned), and so does a descending order of the same slots.
        const apart = await sideBySide(wide, prompts, [4, 2, 0], 24);
        expect(packed.passes.slice(1).every((p) => p === 1)).toBe(true);
        expect(apart.passes.every((p) => p === 3)).toBe(true);
        // The prefill: one token of each prompt together, then the longer prompts' rest in passes of their own.
        expect(packed.passes[0]).toBeGreaterThan(1);
        expect(packed.tokens).toEqual(apart.tokens);
        expect(packed.texts).toEqual(apart.texts);
        for (const [i, p] of prompts.entries()) {
          const alone = await referenceGreedy(fixture.file, wide.tokenize(p), 24);
          expect(packed.tokens[i]).toEqual(alone);
          expect(packed.texts[i]).toBe(wide.detokenize(alone));
        }
      } finally {
        await wide.unload();
      }
    });

    it('opens a sequence in the slot its item names, and refuses a slot in use, out of range or changed', async () => {
      const prompt = engine.tokenize(PROMPT_B);
      const r = await engine.step({ items: [{ seq: 'at2', kind: 'prefill', tokens: prompt, sample: true, slot: 2 }] });
      expect(r.passes).toBe(1);
      const taken = await refusal(
        engine.step({ items: [{ seq: 'other', kind: 'prefill', tokens: prompt, sample: true, slot: 2 }] }),
      );
      expect(taken.message).toContain('slot 2');
      expect((await refusal(engine.step({ items: [{ seq: 'at2', kind: 'decode', slot: 1 }] }))).code).toBe(
        'invalid_request',
      );
      const outside = await refusal(
        engine.step({ items: [{ seq: 'far', kind: 'prefill', tokens: prompt, sample: true, slot: 3 }] }),
      );
      expect(outside.message).toContain('slot 3');
      // Without a slot a sequence takes the lowest free one: 0 and 1 here, beside slot 2 — one pass.
      const both = await engine.step({
        items: [
          { seq: 'at2', kind: 'decode', slot: 2 },
          { seq: 'low', kind: 'prefill', tokens: [prompt[0]!], sample: true },
          { seq: 'next', kind: 'prefill', tokens: [prompt[0]!], sample: true },
        ],
      });
      expect(both.passes).toBe(1);
      for (const seq of ['at2', 'low', 'next']) await engine.free(seq);
      expect(engine.capacity().freeSequences).toBe(3);
    });
  });

  describe('freeing', () => {
    it('releases the cells and the slot of a cancelled sequence', async () => {
      await generate('cancel', engine.tokenize(PROMPT_A), 4);
      expect(engine.capacity().used.cancel).toBeGreaterThan(10);
      expect(engine.capacity().freeSequences).toBe(2);
      await engine.free('cancel');
      expect(engine.capacity().used.cancel).toBeUndefined();
      expect(engine.capacity().freeSequences).toBe(3);
      await engine.free('cancel'); // idempotent
    });

    it('frees a sequence in the step that samples its last token, with the text it held back', async () => {
      const prompt = engine.tokenize(PROMPT_A);
      const whole = await generate('whole', prompt, 6);
      const heldBack = (await engine.free('whole')).text;
      let r = await engine.step({ items: [{ seq: 'ends', kind: 'prefill', tokens: prompt, sample: true }] });
      let text = r.sampled[0]!.text;
      for (let i = 1; i < 6; i++) {
        r = await engine.step({ items: [{ seq: 'ends', kind: 'decode', last: i === 5 }] });
        text += r.sampled[0]!.text;
      }
      expect(text).toBe(whole.text + heldBack);
      expect(r.sampled[0]!.finish).toBeUndefined(); // the caller knows why it ends (its max tokens)
      expect(engine.capacity().used.ends).toBeUndefined();
      expect(engine.capacity().freeSequences).toBe(3);
      expect((await engine.free('ends')).text).toBe('');
    });

    it('re-prefilling prompt plus generated tokens after a free reproduces the same greedy tokens', async () => {
      const prompt = engine.tokenize(PROMPT_A);
      const first = await generate('orig', prompt, 20);
      await engine.free('orig');
      // Preempted after 8 tokens: recompute prompt + those 8, then keep decoding.
      const resumed = await generate('resumed', [...prompt, ...first.tokens.slice(0, 8)], 12);
      await engine.free('resumed');
      expect(resumed.tokens).toEqual(first.tokens.slice(8));
    });
  });

  describe('preemption with text held back', () => {
    it('replays the streamed tokens of a recompute: held text is neither lost nor sent twice', async () => {
      const prompt = engine.tokenize(PROMPT_A);
      const plain = await generate('plain', prompt, 24);
      await engine.free('plain');
      // A stop string that never completes but starts with a character of the text: that character is held back
      // each time the text ends with it, until the next token shows the stop string is not there.
      const c = plain.text.at(6)!;
      const sampling = { stop: [`${c}\u0001`] };
      let r = await engine.step({ items: [{ seq: 'pre', kind: 'prefill', tokens: prompt, sample: true, sampling }] });
      const tokens: number[] = [];
      let text = '';
      for (;;) {
        tokens.push(r.sampled[0]!.token);
        text += r.sampled[0]!.text;
        if (engine.detokenize(tokens).endsWith(c) && !text.endsWith(c)) break;
        r = await engine.step({ items: [{ seq: 'pre', kind: 'decode' }] });
      }
      expect(tokens.length).toBeLessThan(24);
      // Preempted while holding `c`: the worker drops what free returns, and the recompute replays the tokens.
      expect((await engine.free('pre')).text).toBe(c);
      const goal = 24 - tokens.length;
      const replay = { seq: 'pre', kind: 'prefill' as const, sample: true, sampling, streamed: [...tokens] };
      r = await engine.step({ items: [{ ...replay, tokens: [...prompt, ...tokens] }] });
      for (let n = 1; ; n++) {
        text += r.sampled[0]!.text;
        if (n === goal) break;
        r = await engine.step({ items: [{ seq: 'pre', kind: 'decode' }] });
      }
      text += (await engine.free('pre')).text;
      expect(text).toBe(plain.text);
    });
  });

  describe('overflow', () => {
    it('refuses a prefill beyond the per-sequence cells with invalid_request before any work', async () => {
      const before = engine.capacity();
      const long = Array.from({ length: 300 }, (_, i) => 97 + (i % 26));
      const err = await refusal(
        engine.step({
          items: [
            { seq: 'fine', kind: 'prefill', tokens: [97, 98], sample: true },
            { seq: 'long', kind: 'prefill', tokens: long, sample: true },
          ],
        }),
      );
      expect(err.code).toBe('invalid_request');
      expect(err.message).toMatch(/overflow/);
      expect(engine.capacity()).toEqual(before);
    });

    it('refuses the decode that would need one more cell than the sequence has, never shifting', async () => {
      const cells = engine.capacity().cellsPerSequence;
      const fill = Array.from({ length: cells }, (_, i) => 97 + (i % 26));
      const r = await engine.step({ items: [{ seq: 'full', kind: 'prefill', tokens: fill, sample: true }] });
      expect(r.sampled).toHaveLength(1);
      expect(engine.capacity().used.full).toBe(cells);
      const err = await refusal(engine.step({ items: [{ seq: 'full', kind: 'decode' }] }));
      expect(err.code).toBe('invalid_request');
      expect(engine.capacity().used.full).toBe(cells);
      await engine.free('full');
    });
  });
});
