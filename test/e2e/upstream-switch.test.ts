// A switch between two `engine: openai` models under `switch` placement, with real processes: the large model's
// replica is one server over both GPUs, the small model's one server on GPU 0 (each a `switchyard serve` of the tiny
// llama model, started by the front's worker). Traffic to one model, then to the other, moves the GPUs: the leaving
// model's server is stopped, the coming one's started on the GPUs it was given; both are served and every request
// ends exactly once.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectClient } from '../../api/client.ts';
import { serve, writeConfig, type Served } from './harness.ts';
import { alive, tinyModel, until } from './engine-harness.ts';
import { openaiModel, upstreamConfig, upstreamsOf, UPSTREAM_ENV, type UpstreamProc } from './upstream-harness.ts';

interface Status {
  replicas: { id: string; model: string; state: string; gpus: number[] }[];
}

/** Requests the front counted as ended for `model`, by outcome (`ok`, `error`, ...). */
function outcomes(metrics: string, model: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of metrics.split('\n')) {
    if (!line.startsWith('switchyard_requests_total{') || !line.includes(`model="${model}"`)) continue;
    const outcome = /outcome="([^"]*)"/.exec(line)?.[1] ?? '';
    out.set(outcome, (out.get(outcome) ?? 0) + Number(line.split(' ').at(-1)));
  }
  return out;
}

const total = (m: Map<string, number>): number => [...m.values()].reduce((a, b) => a + b, 0);

describe('engine openai under switch placement', () => {
  let s: Served;
  const ups = (): UpstreamProc[] => upstreamsOf(s.workerPids()[0]!);
  const status = async (): Promise<Status> => (await s.get('/admin/status', s.adminToken)).body as Status;
  const metrics = async (): Promise<string> => (await fetch(`${s.url}/metrics`)).text();

  /** Sends `n` streams to `model` and waits for every result: tokens counted, one result each. */
  const traffic = async (model: string, n: number, maxTokens = 12) => {
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

  beforeAll(async () => {
    const file = await tinyModel();
    const up = upstreamConfig(file);
    const config = writeConfig(`
name: e2e-upstream-switch
node: { gpu: H100-SXM, gpus: 2 }
placement: { policy: switch, initialMode: small, minResidencyMs: 500, hysteresisMs: 100, drainDeadlineMs: 10000 }
detection: { heartbeatMs: 1000, missedHeartbeats: 5 }
models:${openaiModel({ name: 'big', file, upstreamFile: up, replicas: 1, tp: 2 })}${openaiModel({
      name: 'small',
      file,
      upstreamFile: up,
      replicas: 1,
    })}
`);
    s = await serve(['--config', config], UPSTREAM_ENV);
    await s.waitReady('small', true, 120_000);
  }, 180_000);
  afterAll(async () => {
    const left = s ? ups() : [];
    await s?.stop();
    for (const u of left) {
      try {
        process.kill(-u.pid, 'SIGKILL');
      } catch {
        // gone with its worker
      }
    }
  });

  it('moves the GPUs to the model that has traffic, stopping one server and starting the other, and serves both', async () => {
    const first = ups();
    expect(first.map((u) => u.gpus)).toEqual(['0']);
    const a = await traffic('small', 4);
    for (const r of a) {
      expect(r.result.ok, JSON.stringify(r.result)).toBe(true);
      if (r.result.ok) expect(r.result.usage.completionTokens).toBe(12);
    }

    // Traffic to the large model: placement drains the small replica, its server stops, the gang's starts on 0,1.
    const b = await traffic('big', 4);
    for (const r of b) expect(r.result.ok, `${JSON.stringify(r.result)}\n${s.lines.slice(-30).join('\n')}`).toBe(true);
    expect(alive(first[0]!.pid)).toBe(false);
    const big = ups();
    expect(big.map((u) => u.gpus)).toEqual(['0,1']);
    const st = await status();
    expect(st.replicas.filter((r) => r.state.startsWith('ready')).map((r) => [r.model, r.gpus])).toEqual([
      ['big', [0, 1]],
    ]);

    // Both at once: the node switches back for the small model within its deadline; both are served.
    const [c, d] = await Promise.all([traffic('small', 3), traffic('big', 3)]);
    for (const r of [...c, ...d]) expect(r.result.ok, JSON.stringify(r.result)).toBe(true);
    await until('the small model’s server runs again', () => ups().some((u) => u.gpus === '0'), 60_000);
    expect(alive(big[0]!.pid)).toBe(false);

    // Every request ended exactly once, as the front counts them.
    const m = await metrics();
    expect(total(outcomes(m, 'small'))).toBe(4 + 3);
    expect(total(outcomes(m, 'big'))).toBe(4 + 3);
    expect(s.lines.filter((l) => /^replica\.\S+ failed: /.test(l))).toEqual([]);
  }, 300_000);
});
