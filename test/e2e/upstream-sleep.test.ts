// Sleep mode of `engine: openai` servers under `switch` placement, with real processes: each model's replicas are
// fixture servers speaking vLLM's API and sleep endpoints (test/fixtures/openai-server.ts), started by the front's
// worker. A switch puts the leaving model's server to sleep instead of stopping it (the process stays, refusing
// completions) and wakes the coming model's sleeping server instead of starting one; requests beyond a server's
// `sequences` wait in switchyard's queue, never the server's; every request ends exactly once.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectClient } from '../../api/client.ts';
import { serve, writeConfig, type Served } from './harness.ts';
import { alive, tinyModel, until } from './engine-harness.ts';
import { fixtureMetrics, fixtureModel, fixturesOf, UPSTREAM_ENV } from './upstream-harness.ts';

describe('engine openai with sleep mode under switch placement', () => {
  let s: Served;
  const servers = () => fixturesOf(s.workerPids()[0]!);
  const serverOf = (model: string) => servers().find((f) => f.model === model);
  const sleeping = async (port: number): Promise<boolean> =>
    ((await (await fetch(`http://127.0.0.1:${port}/is_sleeping`)).json()) as { is_sleeping: boolean }).is_sleeping;

  /** Sends `n` streams to `model`; answers each one's tokens and its one result. */
  const traffic = async (model: string, n: number, maxTokens = 16) => {
    const c = await connectClient(s.wsUrl);
    try {
      const streams = Array.from({ length: n }, (_, i) => c.stream({ model, prompt: `${model} ${i}`, maxTokens }));
      return await Promise.all(
        streams.map(async (st) => {
          let tokens = 0;
          for await (const _ of st) tokens++;
          return { tokens, result: await st.result };
        }),
      );
    } finally {
      c.close();
    }
  };
  const allOk = (rs: Awaited<ReturnType<typeof traffic>>, maxTokens = 16): void => {
    for (const r of rs) {
      expect(r.result.ok, `${JSON.stringify(r.result)}\n${s.lines.slice(-30).join('\n')}`).toBe(true);
      if (r.result.ok) expect(r.result.usage.completionTokens).toBe(maxTokens);
    }
  };

  beforeAll(async () => {
    const file = await tinyModel();
    const config = writeConfig(`
name: e2e-upstream-sleep
node: { gpu: H100-SXM, gpus: 2 }
placement: { policy: switch, initialMode: small, minResidencyMs: 300, hysteresisMs: 100, drainDeadlineMs: 10000 }
detection: { heartbeatMs: 1000, missedHeartbeats: 5 }
models:${fixtureModel({ name: 'big', file, replicas: 1, tp: 2, sleep: true })}${fixtureModel({
      name: 'small',
      file,
      replicas: 1,
      sequences: 2,
      sleep: true,
    })}`);
    s = await serve(['--config', config], UPSTREAM_ENV);
    await s.waitReady('small', true, 120_000);
  }, 180_000);
  afterAll(async () => {
    const left = s ? servers() : [];
    await s?.stop();
    for (const u of left) {
      try {
        process.kill(-u.pid, 'SIGKILL');
      } catch {
        // gone with its worker
      }
    }
  });

  it('keeps at most `sequences` requests at the server; the rest wait in switchyard’s queue', async () => {
    const small = serverOf('small')!;
    expect(small.gpus).toBe('0');
    allOk(await traffic('small', 8, 24), 24);
    const m = await fixtureMetrics(small.port);
    expect(m.get('fixture_requests_total')).toBe(8);
    expect(m.get('fixture_max_running')).toBe(2);
  }, 60_000);

  it('puts the leaving model’s server to sleep and wakes it when its model comes back, instead of restarting it', async () => {
    const small = serverOf('small')!;
    allOk(await traffic('big', 3));
    const big = serverOf('big')!;
    expect(big.gpus).toBe('0,1');
    // The small model's server sleeps on GPU 0 beside the large model's: the same process, refusing completions.
    expect(alive(small.pid)).toBe(true);
    expect(await sleeping(small.port)).toBe(true);
    expect((await fixtureMetrics(small.port)).get('fixture_sleeps_total')).toBe(1);
    const refused = await fetch(`http://127.0.0.1:${small.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'small', prompt: [1, 2, 3], max_tokens: 2 }),
    });
    expect(refused.status).toBe(503);

    // Back to the small model: the large model's server sleeps, the small one's is woken (no new process).
    allOk(await traffic('small', 3));
    expect(serverOf('small')?.pid).toBe(small.pid);
    expect(await sleeping(small.port)).toBe(false);
    expect((await fixtureMetrics(small.port)).get('fixture_wakes_total')).toBe(1);
    await until('the large model’s server sleeps', async () => await sleeping(big.port), 15_000);
    expect(alive(big.pid)).toBe(true);

    // And the large model again: its server wakes.
    allOk(await traffic('big', 2));
    expect(serverOf('big')?.pid).toBe(big.pid);
    expect((await fixtureMetrics(big.port)).get('fixture_wakes_total')).toBe(1);
    expect(servers()).toHaveLength(2);
    expect(s.lines.some((l) => new RegExp(`woke its server \\(pid ${small.pid}\\) in \\d+ ms`).test(l))).toBe(true);
    expect(s.lines.some((l) => new RegExp(`put its server \\(pid ${big.pid}\\) to sleep in \\d+ ms`).test(l))).toBe(
      true,
    );

    // One outcome per request, as the front counts them; no replica failed.
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    const ended = (model: string): number =>
      metrics
        .split('\n')
        .filter((l) => l.startsWith('switchyard_requests_total{') && l.includes(`model="${model}"`))
        .reduce((a, l) => a + Number(l.split(' ').at(-1)), 0);
    expect(ended('small')).toBe(8 + 3);
    expect(ended('big')).toBe(3 + 2);
    expect(s.lines.filter((l) => /^replica\.\S+ failed: /.test(l))).toEqual([]);
  }, 240_000);
});
