// Overload on real sockets: a tiny queue fills and the OpenAI API answers 429 with Retry-After (whole seconds).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { serve, writeConfig, type Served } from './harness.ts';

// One replica running one sequence at a time, one queued request allowed; each step takes 20 ms.
const CONFIG = writeConfig(`
name: e2e-overload
models:
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 1
    batching: { maxRunning: 1 }
    classes:
      interactive: { maxQueued: 1, maxQueueMs: 60000 }
`);

describe('overload', () => {
  let s: Served;
  beforeAll(async () => {
    s = await serve(['--config', CONFIG, '--executor', 'fixed', '--step-ms', '20', '--time-scale', '0.01']);
    await s.waitReady('llama-3-8b');
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('answers 429 with Retry-After once the queue is full, and serves what it admitted', async () => {
    const body = { model: 'llama-3-8b', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20 };
    const replies = await Promise.all(Array.from({ length: 6 }, () => s.post('/v1/chat/completions', body)));
    const statuses = replies.map((r) => r.status).sort();
    expect(statuses.filter((x) => x === 200).length).toBeGreaterThanOrEqual(1);
    const rejected = replies.filter((r) => r.status === 429);
    expect(rejected.length).toBeGreaterThanOrEqual(1);
    for (const r of rejected) {
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(Number.isInteger(Number(r.headers.get('retry-after')))).toBe(true);
      expect(r.body).toMatchObject({ error: { code: 'overloaded' } });
    }
    const m = (await s.get('/metrics')).body as string;
    expect(m).toMatch(/switchyard_rejections_total\{model="llama-3-8b",code="overloaded"\} [1-9]/);
  });

  it('surfaces the 429 to the official openai client', async () => {
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const calls = Array.from({ length: 5 }, () =>
      openai.chat.completions
        .create({ model: 'llama-3-8b', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20 })
        .then(
          () => 200,
          (e: { status?: number; headers?: Headers }) => {
            if (e.status === 429) expect(Number(e.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1);
            return e.status ?? 0;
          },
        ),
    );
    const statuses = await Promise.all(calls);
    expect(statuses).toContain(429);
    expect(statuses).toContain(200);
  });
});
