// Real inference end to end: `switchyard serve` with two llama.cpp replicas of the tiny generated model, one engine
// host process each. Clients stream the model's own text (equal to the engine run directly), chat is rendered through
// the model's own chat template, a context overflow is refused before any work, cancelled sequences free their cells,
// a kill -9 of one host fails only its replica, and a drain frees the host process.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';
import { CHAT_TEMPLATE, TINY_VOCAB } from '../../actors/engine/tiny-model.ts';
import { connectClient } from '../../api/client.ts';
import { serve, writeConfig, type Served } from './harness.ts';
import { alive, directText, enginesOf, tinyModel, until, type HostProc } from './engine-harness.ts';

interface Status {
  replicas: { id: string; state: string; gpus: number[]; running: number }[];
}

describe('serving the tiny model on llama.cpp', () => {
  let s: Served;
  let file: string;
  const hosts = (): HostProc[] => enginesOf(s.workerPids().at(-1)!);
  const status = async (): Promise<Status> => (await s.get('/admin/status', s.adminToken)).body as Status;

  beforeAll(async () => {
    file = await tinyModel();
    const config = writeConfig(`
name: e2e-engine
node: { gpu: H100-SXM, gpus: 8 }
placement: { policy: exclusive }
models:
  - name: tiny
    profile: llama-3-8b
    replicas: 2
    engine: llama.cpp
    file: ${file}
    threads: 1
    contextTokens: 256
    sequences: 4
    batching: { tokenBudget: 128 }
    resume: { maxResumes: 1, budgetMs: 60000 }
    classes: { interactive: { maxQueueMs: 120000 } }
`);
    s = await serve(['--config', config]);
    await s.waitReady('tiny', true, 60_000);
    await until('both replicas ready', async () => (await status()).replicas.every((r) => r.state.startsWith('ready')));
  }, 90_000);
  afterAll(async () => {
    await s?.stop();
  });

  it('streams the engine’s own greedy text to the official openai client, with real token counts', async () => {
    const prompt = 'The switchyard';
    const direct = await directText(file, prompt, 24);
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const stream = await openai.completions.create({
      model: 'tiny',
      prompt,
      max_tokens: 24,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      usage = chunk.usage ?? usage;
    }
    expect(text).toBe(direct.text);
    // Counted by the model's own tokenizer, as the engine tokenizes the prompt.
    expect(usage?.prompt_tokens).toBe(direct.promptTokens);
    expect(usage?.completion_tokens).toBe(direct.n);
  });

  it('renders chat through the model’s own template: prompt tokens are the rendered ChatML’s', async () => {
    const messages = [
      { role: 'system' as const, content: 'Answer briefly.' },
      { role: 'user' as const, content: 'Where do trains sleep?' },
    ];
    // The generated model's template (tokenizer.chat_template) is ChatML, with the BOS token first.
    expect(CHAT_TEMPLATE).toContain('<|im_start|>');
    const rendered =
      '<|startoftext|>' +
      messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join('') +
      '<|im_start|>assistant\n';
    const llama = await getLlama({ gpu: false, build: 'never', skipDownload: true, logLevel: LlamaLogLevel.error });
    const vocab = await llama.loadModel({ modelPath: file, vocabOnly: true });
    const tokens = vocab.tokenize(rendered, true);
    await vocab.dispose();
    // The BOS is the model's one special token, not its text.
    expect(tokens[0]).toBe(TINY_VOCAB.bos);
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const chat = await openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 4, temperature: 0 });
    expect(chat.usage?.prompt_tokens).toBe(tokens.length);
    // And the reply is the engine's greedy continuation of that rendering.
    const direct = await directText(file, rendered.slice('<|startoftext|>'.length), 4);
    expect(direct.promptTokens).toBe(tokens.length);
    expect(chat.choices[0]?.message.content).toBe(direct.text);
  });

  it('returns log-probabilities consistent with greedy choice, streamed or not, and only on the OpenAI API', async () => {
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const messages = [{ role: 'user' as const, content: 'Count the wagons.' }];
    const chat = await openai.chat.completions.create({
      model: 'tiny',
      messages,
      max_tokens: 8,
      temperature: 0,
      logprobs: true,
      top_logprobs: 3,
    });
    const content = chat.choices[0]?.logprobs?.content ?? [];
    expect(content).toHaveLength(chat.usage!.completion_tokens);
    for (const c of content) {
      expect(c.logprob).toBeLessThanOrEqual(0);
      expect(c.top_logprobs).toHaveLength(3);
      // Greedy: the chosen token is the most likely one, and the alternatives come most likely first.
      expect(c.top_logprobs[0]!.token).toBe(c.token);
      expect(c.top_logprobs[0]!.logprob).toBeCloseTo(c.logprob, 9);
      expect(c.top_logprobs[1]!.logprob).toBeLessThanOrEqual(c.top_logprobs[0]!.logprob);
      expect(c.bytes).toEqual([...Buffer.from(c.token, 'utf8')]);
    }
    // The same request without them gives the same text.
    const plain = await openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 8, temperature: 0 });
    expect(chat.choices[0]?.message.content).toBe(plain.choices[0]?.message.content);
    expect(plain.choices[0]?.logprobs ?? null).toBeNull();
    // Streamed: each token chunk carries its own.
    const stream = await openai.chat.completions.create({
      model: 'tiny',
      messages,
      max_tokens: 8,
      temperature: 0,
      logprobs: true,
      stream: true,
    });
    const streamed: number[] = [];
    for await (const c of stream) for (const x of c.choices[0]?.logprobs?.content ?? []) streamed.push(x.logprob);
    expect(streamed).toEqual(content.map((c) => c.logprob));
    // Completions: tokens, their log-probabilities and the n most likely per position.
    const comp = await openai.completions.create({ model: 'tiny', prompt: 'wagons', max_tokens: 5, logprobs: 2 });
    const lp = comp.choices[0]!.logprobs!;
    expect(lp.tokens).toHaveLength(5);
    expect(lp.token_logprobs).toHaveLength(5);
    for (const m of lp.top_logprobs ?? []) expect(Object.keys(m).length).toBeGreaterThanOrEqual(1);
    // The WebSocket API does not return them: refused, never dropped.
    const ws = await connectClient(s.wsUrl);
    const st = ws.stream({ model: 'tiny', prompt: 'x', maxTokens: 2, logprobs: 1 });
    try {
      for await (const _ of st) void _;
    } catch {
      // the refusal is in st.result
    }
    const r = await st.result;
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.error.message).toMatch(/logprobs: returned on the OpenAI HTTP API only/);
    ws.close();
  });

  it('answers a json_schema response_format with JSON that parses and validates, streamed or not', async () => {
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const schema = {
      type: 'object',
      properties: {
        track: { enum: ['north', 'south'] },
        coach: { enum: ['first', 'second', 'sleeper'] },
        express: { type: 'boolean' },
      },
      required: ['track', 'coach', 'express'],
      additionalProperties: false,
    };
    const response_format = { type: 'json_schema' as const, json_schema: { name: 'train', schema, strict: true } };
    const messages = [{ role: 'user' as const, content: 'Describe a train as JSON.' }];
    const check = (text: string | null | undefined): void => {
      const v = JSON.parse(text ?? '') as Record<string, unknown>;
      expect(Object.keys(v).sort()).toEqual(['coach', 'express', 'track']);
      expect(['north', 'south']).toContain(v['track']);
      expect(['first', 'second', 'sleeper']).toContain(v['coach']);
      expect(typeof v['express']).toBe('boolean');
    };
    const chat = await openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 150, response_format });
    expect(chat.choices[0]?.finish_reason).toBe('stop');
    check(chat.choices[0]?.message.content);
    const stream = await openai.chat.completions.create({
      model: 'tiny',
      messages,
      max_tokens: 150,
      response_format,
      temperature: 0.9,
      seed: 11,
      stream: true,
    });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
    check(text);
    // JSON mode: any object (a random model's may not end within max_tokens; what it wrote is an object's start).
    const mode = await openai.chat.completions.create({
      model: 'tiny',
      messages,
      max_tokens: 40,
      response_format: { type: 'json_object' },
    });
    expect(mode.choices[0]?.message.content).toMatch(/^\s*\{/);
    // A schema the grammar would not honour exactly is refused at once, never loosened.
    await expect(
      openai.chat.completions.create({
        model: 'tiny',
        messages,
        response_format: {
          type: 'json_schema',
          json_schema: { name: 'x', schema: { type: 'object', patternProperties: {} } },
        },
      }),
    ).rejects.toMatchObject({ status: 400 });
  });

  it('handles tools as documented on the real engine: a request asking for them is refused with a 400 naming the field before any work; one asking for none is served', async () => {
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback', maxRetries: 0 });
    const messages = [{ role: 'user' as const, content: 'Which track?' }];
    const tools = [
      { type: 'function' as const, function: { name: 'track', parameters: { type: 'object', properties: {} } } },
    ];
    // What the engine did for model tiny: requests ended and tokens streamed, summed over their series.
    const served = async (): Promise<number[]> => {
      const text = (await s.get('/metrics')).body as string;
      const sum = (name: string): number =>
        text
          .split('\n')
          .filter((l) => l.startsWith(`${name}{`) && l.includes('model="tiny"'))
          .reduce((a, l) => a + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
      return [sum('switchyard_requests_total'), sum('switchyard_output_tokens_total')];
    };
    const before = await served();
    for (const extra of [{ tools }, { tools, stream: true as const }, { tool_choice: 'required' as const, tools }]) {
      const err = await openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 4, ...extra }).then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const e = err as InstanceType<typeof OpenAI.APIError>;
      expect(e.status).toBe(400);
      expect(e.code).toBe('invalid_request');
      expect(e.message).toMatch(/^400 (tools|tool_choice): tool and function calling are not supported/);
    }
    expect(await served()).toEqual(before);
    // Asking for no tool is served by the engine, with the same greedy text as without the fields.
    const plain = await openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 6 });
    const none = await openai.chat.completions.create({
      model: 'tiny',
      messages,
      max_tokens: 6,
      tools: [],
      tool_choice: 'none',
    });
    expect(none.choices[0]?.message.content).toBe(plain.choices[0]?.message.content);
    expect(none.choices[0]?.message.tool_calls ?? []).toEqual([]);
    // The counters do move for served requests: the equality above is not vacuous.
    const [ended, streamed] = await served();
    expect(ended).toBe(before[0]! + 2);
    expect(streamed).toBeGreaterThan(before[1]!);
  });

  it('names the real backend and its file in /v1/models and the WebSocket hello', async () => {
    const models = (await s.get('/v1/models')).body as {
      data: { id: string; backend: string; switchyard: { backend: string } }[];
    };
    expect(models.data[0]).toMatchObject({ id: 'tiny', backend: 'llama.cpp' });
    expect(models.data[0]!.switchyard.backend).toBe(`llama.cpp on ${file}, cpu: real tokens`);
    const c = await connectClient(s.wsUrl);
    expect(c.backend).toBe('llama.cpp');
    c.close();
    expect(s.lines).toContain(
      `  backend        tiny: llama.cpp on ${file}, cpu: real tokens (one engine host per replica)`,
    );
    expect(s.lines.join('\n')).not.toMatch(/pseudo-text/);
  });

  it('streams the same text over /v1/ws', async () => {
    const prompt = 'hello, engine';
    const direct = await directText(file, prompt, 16);
    const c = await connectClient(s.wsUrl);
    const st = c.stream({ model: 'tiny', prompt, maxTokens: 16 });
    let text = '';
    for await (const ch of st) text += ch.text;
    const r = await st.result;
    c.close();
    expect(r.ok).toBe(true);
    expect(text).toBe(direct.text);
  });

  it('takes the OpenAI sampling fields over /v1/ws: a stop string ends the text before it, a seed repeats it', async () => {
    const prompt = 'stop and seed';
    const direct = await directText(file, prompt, 24);
    // A stop string from the middle of the greedy text: the stream is the text before its first occurrence.
    expect(direct.text.length).toBeGreaterThan(11);
    const stop = direct.text.slice(8, 11);
    const cut = direct.text.slice(0, direct.text.indexOf(stop));
    const c = await connectClient(s.wsUrl);
    const collect = async (req: Parameters<typeof c.stream>[0]): Promise<{ text: string; reason?: string }> => {
      const st = c.stream(req);
      let text = '';
      for await (const ch of st) text += ch.text;
      const r = await st.result;
      expect(r.ok).toBe(true);
      return { text, ...(r.ok ? { reason: r.finishReason } : {}) };
    };
    const stopped = await collect({ model: 'tiny', prompt, maxTokens: 24, temperature: 0, stop: [stop] });
    expect(stopped).toEqual({ text: cut, reason: 'stop' });
    const sampled = { model: 'tiny', prompt, maxTokens: 24, temperature: 1.5, topP: 0.95, seed: 7 };
    const [a, b] = await Promise.all([collect(sampled), collect(sampled)]);
    const other = await collect({ ...sampled, seed: 8 });
    c.close();
    expect(a.text).toBe(b.text);
    // Sampled at temperature 1.5 from random weights: another seed gives other text (a greedy run would not).
    expect(other.text).not.toBe(a.text);
  });

  it('refuses a context overflow with invalid_request before any work', async () => {
    const res = await s.post('/v1/completions', { model: 'tiny', prompt: 'x'.repeat(300), max_tokens: 8 });
    expect(res.status).toBe(400);
    expect((res.body as { error: { code: string } }).error.code).toBe('invalid_request');
  });

  it('frees cancelled sequences: every slot serves again afterwards, with the same hosts', async () => {
    const before = hosts().map((h) => h.pid);
    const c = await connectClient(s.wsUrl);
    const streams = Array.from({ length: 8 }, (_, i) =>
      c.stream({ model: 'tiny', prompt: `cancel ${i}`, maxTokens: 200 }),
    );
    await Promise.all(streams.map((st) => st[Symbol.asyncIterator]().next()));
    for (const st of streams) st.cancel();
    const cancelled = await Promise.all(streams.map((st) => st.result));
    expect(cancelled.every((r) => !r.ok && r.error.code === 'cancelled')).toBe(true);
    // Had the cells not been freed, the engines would refuse new sequences (and their hosts be killed).
    const again = Array.from({ length: 8 }, (_, i) => c.stream({ model: 'tiny', prompt: `again ${i}`, maxTokens: 4 }));
    const done = await Promise.all(again.map((st) => st.result));
    c.close();
    expect(done.filter((r) => !r.ok)).toEqual([]);
    expect(hosts().map((h) => h.pid)).toEqual(before);
  });

  it('fails only the killed host’s replica: each of its requests resumes or ends typed, the other serves on', async () => {
    const [victim, other] = hosts();
    expect(victim && other).toBeTruthy();
    const c = await connectClient(s.wsUrl);
    const streams = Array.from({ length: 6 }, (_, i) =>
      c.stream({ model: 'tiny', prompt: `kill ${i}`, maxTokens: 120 }),
    );
    await Promise.all(streams.map((st) => st[Symbol.asyncIterator]().next()));
    process.kill(victim!.pid, 'SIGKILL');
    const results = await Promise.all(streams.map((st) => st.result));
    c.close();
    for (const r of results) {
      if (!r.ok) expect(['replica_failed', 'model_unavailable']).toContain(r.error.code);
    }
    expect(results.some((r) => r.ok)).toBe(true);
    expect(alive(other!.pid)).toBe(true);
    // Placement replaces the failed replica with a new host on the reset GPU.
    await until('a new host', () => hosts().length === 2 && !hosts().some((h) => h.pid === victim!.pid), 60_000);
    // The operator's log says which replica failed and why, where its requests went, and its reload.
    const failed = s.lines.find((l) => /^replica\.tiny@\S+ failed: /.test(l));
    expect(failed).toBeDefined();
    const id = failed!.split(' ')[0]!;
    expect(s.lines.some((l) => l.startsWith(`${id} gave up `) && /\d+ resumed elsewhere/.test(l))).toBe(true);
    // A replica of the same model is placed again on the reset GPU and becomes ready: both logged after the failure.
    const after = (): string[] => s.lines.slice(s.lines.indexOf(failed!) + 1);
    await until('the reload logged', () => after().some((l) => /^replica\.tiny@\S+ ready$/.test(l)), 60_000);
    expect(after().some((l) => /^replica\.tiny@\S+ loading on GPU \d+$/.test(l))).toBe(true);
  }, 90_000);

  it('frees the engine process when its replica is drained', async () => {
    await until('both replicas ready', async () => (await status()).replicas.every((r) => r.state.startsWith('ready')));
    const st = await status();
    const replica = st.replicas[0]!;
    const host = hosts().find((h) => h.gpus === String(replica.gpus[0]));
    expect(host).toBeDefined();
    const res = await s.post(`/admin/replicas/${encodeURIComponent(replica.id)}/drain`, {}, s.adminToken);
    expect(res.status).toBe(202);
    await until('the drained host exits', () => !alive(host!.pid), 30_000);
  }, 60_000);
});
