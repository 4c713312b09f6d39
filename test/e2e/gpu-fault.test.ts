// A GPU failed through the admin API while the large model streams: on real sockets, every stream of the large
// model ends with exactly one terminal frame, /readyz turns false for it with the reason, new requests get 503,
// the small model keeps serving on the seven healthy GPUs, and a repair brings the large model back.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { connectClient, type StreamResult } from '../../api/client.ts';
import { serve, writeConfig, type Served } from './harness.ts';

const CONFIG = writeConfig(`
name: e2e-gpu-fault
node: { gpu: H100-SXM, gpus: 8, repairMs: 2000 }
routing: { ejection: { failures: 1000 } }
placement: { policy: switch, initialMode: large, minResidencyMs: 500 }
models:
  - name: llama-3-70b
    profile: llama-3-70b
    tp: 8
    resume: { maxResumes: 1, budgetMs: 1000 }
    # The switch back is predicted in model time (drain deadline + 13.5 s load); the worker runs it 100x faster.
    classes: { interactive: { maxQueueMs: 60000 } }
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 8
`);

interface Status {
  replicas: { id: string; model: string; state: string }[];
}

describe('a GPU failed while the large model streams', () => {
  let s: Served;
  beforeAll(async () => {
    s = await serve(['--config', CONFIG, '--time-scale', '0.01']);
    await s.waitReady('llama-3-70b');
    for (;;) {
      const st = (await s.get('/admin/status', s.adminToken)).body as Status;
      if (st.replicas.some((r) => r.model === 'llama-3-70b' && r.state.startsWith('ready'))) break;
      await new Promise((r) => setTimeout(r, 100));
    }
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('ends every large-model stream once, marks the model unready with the reason, and keeps the small model serving', async () => {
    const c = await connectClient(s.wsUrl);
    const streams = Array.from({ length: 4 }, (_, i) =>
      c.stream({ model: 'llama-3-70b', prompt: `long ${i}`, maxTokens: 4000 }),
    );
    const counts = streams.map(() => ({ tokens: 0, next: 0, gaps: 0 }));
    const consumed = streams.map(async (st, i) => {
      try {
        for await (const ch of st) {
          if (ch.seq !== counts[i]!.next) counts[i]!.gaps++;
          counts[i]!.next = ch.seq + ch.n;
          counts[i]!.tokens += ch.n;
        }
      } catch {
        // the terminal error is in st.result
      }
    });
    while (counts.some((x) => x.tokens < 2)) await new Promise((r) => setTimeout(r, 20));
    const fail = await s.post('/admin/gpus/3/fail', {}, s.adminToken);
    expect(fail.status).toBe(202);
    await Promise.all(consumed);
    const results: StreamResult[] = await Promise.all(streams.map((st) => st.result));
    for (const [i, r] of results.entries()) {
      expect(counts[i]!.gaps).toBe(0);
      expect(r.ok).toBe(false);
      if (!r.ok) expect(['replica_failed', 'model_unavailable']).toContain(r.error.code);
    }

    const ready = await s.get('/readyz');
    expect(ready.status).toBe(503);
    const models = (ready.body as { models: Record<string, { ready: boolean; reason: string | null }> }).models;
    expect(models['llama-3-70b']?.ready).toBe(false);
    expect(models['llama-3-70b']?.reason).toMatch(/8 healthy GPUs|7/);

    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
    await expect(
      openai.chat.completions.create({ model: 'llama-3-70b', messages: [{ role: 'user', content: 'x' }] }),
    ).rejects.toMatchObject({ status: 503 });
    const http = await s.post('/v1/completions', { model: 'llama-3-70b', prompt: 'x' });
    expect(http.status).toBe(503);
    expect(http.body).toMatchObject({ error: { code: 'model_unavailable' } });

    await s.waitReady('llama-3-8b');
    const small = c.stream({ model: 'llama-3-8b', prompt: 'still here', maxTokens: 5 });
    let n = 0;
    for await (const ch of small) n += ch.n;
    expect(n).toBe(5);
    c.close();
  });

  it('brings the large model back after the GPU is repaired', async () => {
    expect((await s.post('/admin/gpus/3/repair', {}, s.adminToken)).status).toBe(202);
    await s.waitReady('llama-3-70b', true, 30_000);
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const r = await openai.chat.completions.create({
      model: 'llama-3-70b',
      messages: [{ role: 'user', content: 'back?' }],
      max_tokens: 3,
    });
    expect(r.usage?.completion_tokens).toBe(3);
  });
});
