// The large model's replica on a real engine: one engine host over all eight GPUs (CUDA_VISIBLE_DEVICES=0,...,7),
// serving the tiny model; a fault of any one of its GPUs (POST /admin/gpus/N/fail) kills that host.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serve, writeConfig, type Served } from './harness.ts';
import { alive, enginesOf, tinyModel, until } from './engine-harness.ts';

describe('a tensor-parallel replica on one engine host', () => {
  let s: Served;
  beforeAll(async () => {
    const file = await tinyModel();
    const config = writeConfig(`
name: e2e-engine-tp8
node: { gpu: H100-SXM, gpus: 8 }
placement: { policy: exclusive }
models:
  - name: big
    profile: llama-3-70b
    tp: 8
    replicas: 1
    engine: llama.cpp
    file: ${file}
    threads: 1
    contextTokens: 256
    sequences: 2
`);
    s = await serve(['--config', config]);
    await s.waitReady('big', true, 60_000);
  }, 90_000);
  afterAll(async () => {
    await s?.stop();
  });

  it('runs one host over all eight GPUs, serves from it, and kills it when one of its GPUs faults', async () => {
    const hosts = enginesOf(s.workerPids().at(-1)!);
    expect(hosts).toHaveLength(1);
    expect(hosts[0]!.gpus).toBe('0,1,2,3,4,5,6,7');
    const res = await s.post('/v1/completions', { model: 'big', prompt: 'tensor parallel', max_tokens: 4 });
    expect(res.status).toBe(200);
    const fail = await s.post('/admin/gpus/5/fail', {}, s.adminToken);
    expect(fail.status).toBe(202);
    await until('the host over GPU 5 exits', () => !alive(hosts[0]!.pid), 15_000);
    await s.waitReady('big', false, 15_000);
  }, 60_000);
});
