// Log-probabilities and JSON output on the real engine (the generated tiny model): each token's log-probability is
// its logit's share of the position's distribution, greedy picks the most likely, asking for them changes no token;
// JSON output follows its grammar to a complete value (a schema's enum, a JSON object) and validates.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineError, type Engine, type SamplingParams } from '../../../actors/engine/engine.ts';
import { loadLlamaEngine } from '../../../actors/engine/llama-engine.ts';
import { tinyModelFixture } from './fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
let engine: Engine;

async function generate(seq: string, prompt: string, n: number, sampling: SamplingParams = {}) {
  const tokens: number[] = [];
  const lps: { lp: number; top: { token: number; lp: number }[] }[] = [];
  let text = '';
  let r = await engine.step({
    items: [{ seq, kind: 'prefill', tokens: engine.tokenize(prompt), sample: true, sampling }],
  });
  for (;;) {
    const s = r.sampled[0]!;
    tokens.push(s.token);
    if (s.logprob) lps.push(s.logprob);
    text += s.text;
    if (tokens.length === n || s.finish) break;
    r = await engine.step({ items: [{ seq, kind: 'decode' }] });
  }
  if (!r.sampled[0]!.finish) await engine.free(seq);
  return { tokens, lps, text, finish: r.sampled[0]!.finish };
}

beforeAll(async () => {
  fixture = await tinyModelFixture();
  engine = await loadLlamaEngine(fixture.file, { contextTokens: 256, sequences: 2, threads: 1 });
});
afterAll(async () => {
  await engine?.unload();
  await fixture?.cleanup();
});

describe('log-probabilities', () => {
  it('are the chosen token’s share of the distribution, the most likely under greedy, and change no token', async () => {
    const plain = await generate('a', 'the tiny model says', 12);
    const withLp = await generate('b', 'the tiny model says', 12, { logprobs: 5 });
    expect(withLp.tokens).toEqual(plain.tokens);
    expect(withLp.lps).toHaveLength(12);
    for (const [i, t] of withLp.lps.entries()) {
      expect(t.lp).toBeLessThanOrEqual(0);
      expect(t.top).toHaveLength(5);
      // Greedy: the chosen token is the most likely one.
      expect(t.top[0]!.token).toBe(withLp.tokens[i]);
      expect(t.top[0]!.lp).toBeCloseTo(t.lp, 9);
      for (let k = 1; k < 5; k++) expect(t.top[k]!.lp).toBeLessThanOrEqual(t.top[k - 1]!.lp);
      expect(t.top.reduce((s, x) => s + Math.exp(x.lp), 0)).toBeLessThanOrEqual(1 + 1e-9);
    }
    const none = await generate('c', 'the tiny model says', 3, { logprobs: 0 });
    for (const t of none.lps) expect(t.top).toEqual([]);
  });
});

describe('JSON output', () => {
  it('follows a schema to a complete value that validates', async () => {
    const schema = {
      type: 'object',
      properties: { color: { enum: ['red', 'green', 'blue'] }, ok: { type: 'boolean' } },
      required: ['color', 'ok'],
      additionalProperties: false,
    };
    for (const temperature of [0, 0.8]) {
      const r = await generate(`s${temperature}`, 'give me json', 120, {
        jsonSchema: JSON.stringify(schema),
        temperature,
        seed: 3,
      });
      expect(r.finish).toBe('stop');
      const value = JSON.parse(r.text) as { color: string; ok: boolean };
      expect(['red', 'green', 'blue']).toContain(value.color);
      expect(typeof value.ok).toBe('boolean');
      expect(Object.keys(value).sort()).toEqual(['color', 'ok']);
    }
  });

  it('refuses a schema llama.cpp cannot turn into a grammar, typed', async () => {
    const err = await engine
      .step({
        items: [
          {
            seq: 'bad',
            kind: 'prefill',
            tokens: engine.tokenize('x'),
            sample: true,
            sampling: { jsonSchema: JSON.stringify({ type: 'no-such-type' }) },
          },
        ],
      })
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(EngineError);
    expect((err as EngineError).code).toBe('invalid_request');
    expect((err as EngineError).message).toMatch(/"type" is not a JSON type|not a JSON type/);
    // Refused before it took a slot: the engine serves on with every slot.
    expect(engine.capacity().freeSequences).toBe(2);
    expect((await generate('after', 'still here', 3)).tokens).toHaveLength(3);
  });
});
