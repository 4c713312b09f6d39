// The real `switchyard serve` command with its node-agent process, driven over real sockets on port 0.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { connectClient, SwitchyardError, type TokenChunk } from '../../api/client.ts';
import { connectWs } from '../../transport/ws.ts';
import { createWallClock } from '../../runtime/clock.ts';
import { runCommand, serve, writeConfig, type Served } from './harness.ts';

const CONFIG = writeConfig(`
name: e2e-small
node: { gpu: H100-SXM, gpus: 8 }
# Replacement replicas reuse the failed replica's id; failure ejection would keep them out of routing for 30 s.
routing: { ejection: { failures: 1000 } }
models:
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 2
    resume: { maxResumes: 2, budgetMs: 60000 }
`);

const collect = async (it: AsyncIterable<TokenChunk>): Promise<TokenChunk[]> => {
  const out: TokenChunk[] = [];
  for await (const c of it) out.push(c);
  return out;
};

describe('switchyard serve', () => {
  let s: Served;
  beforeAll(async () => {
    s = await serve(['--config', CONFIG, '--time-scale', '0.01', '--node-grace-ms', '500']);
    await s.waitReady('llama-3-8b');
  });
  afterAll(async () => {
    await s?.stop();
  });

  describe('the WebSocket streaming API', () => {
    it('streams tokens with contiguous sequence numbers and ends with exactly one done frame', async () => {
      const c = await connectClient(s.wsUrl);
      expect(c.backend).toBe('simulated');
      expect(c.models).toContain('llama-3-8b');
      const st = c.stream({ model: 'llama-3-8b', prompt: 'Tell me about switch yards.', maxTokens: 40 });
      const chunks = await collect(st);
      const r = await st.result;
      expect(r.ok).toBe(true);
      let next = 0;
      for (const ch of chunks) {
        expect(ch.seq).toBe(next);
        next += ch.n;
      }
      expect(next).toBe(40);
      expect(
        chunks
          .map((x) => x.text)
          .join('')
          .trim()
          .split(' '),
      ).toHaveLength(40);
      if (r.ok) {
        expect(r.usage.completionTokens).toBe(40);
        expect(r.finishReason).toBe('length');
        expect(r.timings.ttftMs).toBeGreaterThan(0);
      }
      c.close();
    });

    it('gives the same prompt the same deterministic text, over JSON frames as over msgpack', async () => {
      const a = await connectClient(s.wsUrl, { format: 'json' });
      const b = await connectClient(s.wsUrl, { format: 'msgpack' });
      const ta = (await collect(a.stream({ model: 'llama-3-8b', prompt: 'same', maxTokens: 12 })))
        .map((x) => x.text)
        .join('');
      const tb = (await collect(b.stream({ model: 'llama-3-8b', prompt: 'same', maxTokens: 12 })))
        .map((x) => x.text)
        .join('');
      expect(ta).toBe(tb);
      a.close();
      b.close();
    });

    it('rejects an unknown model with a typed error and keeps the connection usable', async () => {
      const c = await connectClient(s.wsUrl);
      const bad = c.stream({ model: 'no-such-model', prompt: 'x', maxTokens: 4 });
      await expect(collect(bad)).rejects.toMatchObject({ code: 'model_not_found' });
      expect(await bad.accepted).toBeNull();
      const good = await collect(c.stream({ model: 'llama-3-8b', prompt: 'x', maxTokens: 3 }));
      expect(good.reduce((n, x) => n + x.n, 0)).toBe(3);
      c.close();
    });

    it('cancel stops a running request and ends it with one cancelled frame', async () => {
      const c = await connectClient(s.wsUrl);
      const st = c.stream({ model: 'llama-3-8b', prompt: 'a long one', maxTokens: 5000 });
      let got = 0;
      let error: unknown = null;
      try {
        for await (const ch of st) {
          got += ch.n;
          if (got >= 5) st.cancel();
        }
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(SwitchyardError);
      expect((error as SwitchyardError).code).toBe('cancelled');
      expect(got).toBeLessThan(5000);
      const status = await s.get('/admin/status', s.adminToken);
      const running = (status.body as { replicas: { running: number; waiting: number }[] }).replicas.reduce(
        (n, r) => n + r.running + r.waiting,
        0,
      );
      expect(running).toBe(0);
      c.close();
    });

    it('refuses a client socket without the subprotocol, and an unauthenticated worker', async () => {
      const clock = createWallClock();
      const noProto = await connectWs(s.wsUrl, { clock });
      expect(noProto.ok).toBe(false);
      const worker = await connectWs(s.nodeUrl, { clock });
      expect(worker).toMatchObject({ ok: false, error: { code: 'unauthorized', status: 401 } });
      const wrong = await connectWs(s.nodeUrl, { clock, token: 'not-the-token' });
      expect(wrong).toMatchObject({ ok: false, error: { code: 'unauthorized' } });
      const agent = await runCommand(['node-agent', '--url', s.nodeUrl], { SWITCHYARD_WORKER_TOKEN: 'not-the-token' });
      expect(agent.code).toBe(3);
      expect(agent.stderr).toMatch(/refused the worker token/);
    });
  });

  describe('the OpenAI-compatible HTTP API', () => {
    it('streams /v1/chat/completions to the official openai client', async () => {
      const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
      const stream = await openai.chat.completions.create({
        model: 'llama-3-8b',
        messages: [{ role: 'user', content: 'Hello!' }],
        max_tokens: 10,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      let finish: string | null = null;
      let usage: { completion_tokens: number } | null = null;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta.content ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
        if (chunk.usage) usage = chunk.usage;
      }
      expect(text.trim().split(' ')).toHaveLength(10);
      expect(finish).toBe('length');
      expect(usage?.completion_tokens).toBe(10);
    });

    it('answers non-streaming completions and lists models as simulated', async () => {
      const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x' });
      const chat = await openai.chat.completions.create({
        model: 'llama-3-8b',
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 4,
      });
      expect(chat.choices[0]?.message.content?.trim().split(' ')).toHaveLength(4);
      expect(chat.usage?.completion_tokens).toBe(4);
      const comp = await openai.completions.create({ model: 'llama-3-8b', prompt: 'Once upon a time', max_tokens: 3 });
      expect(comp.choices[0]?.text.trim().split(' ')).toHaveLength(3);
      const models = await openai.models.list();
      expect(models.data.map((m) => m.id)).toEqual(['llama-3-8b']);
      expect((models.data[0] as unknown as { backend: string }).backend).toBe('simulated');
    });

    it('maps an unknown model to 404 and a bad body to 400', async () => {
      const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
      await expect(
        openai.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
      ).rejects.toMatchObject({ status: 404 });
      const r = await s.post('/v1/chat/completions', { model: 'llama-3-8b', messages: 'not an array' });
      expect(r.status).toBe(400);
    });

    it('refuses tools, logprobs and response_format with a 400 naming the field, never ignoring them', async () => {
      const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
      const base = { model: 'llama-3-8b', messages: [{ role: 'user' as const, content: 'x' }], max_tokens: 2 };
      const tools = [{ type: 'function' as const, function: { name: 'f', parameters: { type: 'object' } } }];
      const refused = async (field: string, p: Promise<unknown>): Promise<void> => {
        const err = await p.then(
          () => null,
          (e: unknown) => e,
        );
        expect(err, field).toBeInstanceOf(OpenAI.APIError);
        const e = err as InstanceType<typeof OpenAI.APIError>;
        expect(e.status).toBe(400);
        expect(e.code).toBe('invalid_request');
        expect(e.message).toContain(`${field}: `);
      };
      await refused('tools', openai.chat.completions.create({ ...base, tools }));
      await refused('logprobs', openai.chat.completions.create({ ...base, logprobs: true, top_logprobs: 2 }));
      await refused(
        'response_format',
        openai.chat.completions.create({ ...base, response_format: { type: 'json_object' } }),
      );
      await refused('logprobs', openai.completions.create({ model: 'llama-3-8b', prompt: 'x', logprobs: 2 }));
      // What asks for nothing is served.
      const plain = await openai.chat.completions.create({
        ...base,
        tool_choice: 'none',
        response_format: { type: 'text' },
      });
      expect(plain.choices[0]?.message.content).toBeTruthy();
    });
  });

  describe('probes, metrics and the admin API', () => {
    it('keeps /healthz and /readyz apart and exports Prometheus metrics', async () => {
      expect((await s.get('/healthz')).status).toBe(200);
      const ready = await s.get('/readyz');
      expect(ready.status).toBe(200);
      expect(ready.body).toMatchObject({ ready: true, models: { 'llama-3-8b': { ready: true } } });
      const m = await s.get('/metrics');
      const text = m.body as string;
      for (const name of [
        'switchyard_queue_depth',
        'switchyard_running_requests',
        'switchyard_kv_usage_ratio',
        'switchyard_batch_size_bucket',
        'switchyard_ttft_seconds_bucket',
        'switchyard_tpot_seconds_bucket',
        'switchyard_e2e_seconds_bucket',
        'switchyard_gpu_state',
        'switchyard_placement_switches_total',
        'switchyard_rejections_total',
      ]) {
        expect(text).toContain(name);
      }
      // A client's made-up model name never becomes a label: it is counted under `unknown`.
      expect(text).toMatch(/switchyard_rejections_total\{model="unknown",code="model_not_found"\} [1-9]/);
      expect(text).not.toContain('no-such-model');
    });

    it('refuses the admin API without the admin token', async () => {
      expect((await s.post('/admin/gpus/0/fail', {})).status).toBe(401);
      expect((await s.post('/admin/gpus/0/fail', {}, 'wrong')).status).toBe(401);
      expect((await s.get('/admin/status', s.adminToken)).status).toBe(200);
    });
  });

  describe('a worker killed with SIGKILL while streaming', () => {
    it('gives every affected request exactly one terminal frame or resumes it, and the worker rejoins with a new epoch', async () => {
      const [pid] = s.workerPids();
      expect(pid).toBeGreaterThan(0);
      const c = await connectClient(s.wsUrl);
      const streams = Array.from({ length: 6 }, (_, i) =>
        c.stream({ model: 'llama-3-8b', prompt: `stream ${i}`, maxTokens: 1500 }),
      );
      const seen = streams.map(() => ({ tokens: 0, gaps: 0, next: 0 }));
      const consumed = streams.map(async (st, i) => {
        try {
          for await (const ch of st) {
            if (ch.seq !== seen[i]!.next) seen[i]!.gaps++;
            seen[i]!.next = ch.seq + ch.n;
            seen[i]!.tokens += ch.n;
          }
        } catch {
          // the terminal error is in st.result
        }
      });
      // Let every stream get going, then kill the worker.
      while (seen.some((x) => x.tokens < 3)) await new Promise((r) => setTimeout(r, 20));
      process.kill(pid!, 'SIGKILL');
      await s.waitForLine(/registered with 8 GPUs, epoch 2/, 45_000);
      await Promise.all(consumed);
      const results = await Promise.all(streams.map((st) => st.result));
      for (const [i, r] of results.entries()) {
        expect(seen[i]!.gaps).toBe(0);
        if (r.ok) expect(r.usage.completionTokens).toBe(1500);
        else expect(['replica_failed', 'expired']).toContain(r.error.code);
        if (r.ok) expect(seen[i]!.tokens).toBe(1500);
      }
      expect(s.workerPids().length).toBeGreaterThanOrEqual(2);
      await s.waitReady('llama-3-8b');
      const after = await collect(c.stream({ model: 'llama-3-8b', prompt: 'after', maxTokens: 5 }));
      expect(after.reduce((n, x) => n + x.n, 0)).toBe(5);
      const ready = await s.get('/readyz');
      expect((ready.body as { node: { registrations: number } }).node.registrations).toBe(2);
      c.close();
    });
  });

  describe('switchyard chat', () => {
    it('streams a reply into the terminal from the running server', async () => {
      const r = await runCommand(['chat', '--url', s.url, '--model', 'llama-3-8b', '--max-tokens', '8', 'hello']);
      expect(r.code).toBe(0);
      expect(r.stdout.trim().split(' ')).toHaveLength(8);
      expect(r.stderr).toMatch(/8 tokens, length/);
    });
  });
});
