// Authentication on real sockets: client tokens when configured, refusal to listen beyond loopback without them,
// and config errors that name the field.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { connectClient } from '../../api/client.ts';
import { runCommand, serve, writeConfig, type Served } from './harness.ts';

const CONFIG = writeConfig(`
name: e2e-auth
models:
  - { name: llama-3-8b, profile: llama-3-8b, tp: 1, replicas: 1 }
`);

describe('serve with client tokens', () => {
  let s: Served;
  beforeAll(async () => {
    s = await serve(['--config', CONFIG, '--time-scale', '0.01', '--client-token', 'client-secret-0123456789']);
    await s.waitReady('llama-3-8b');
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('says at start that client tokens are required', () => {
    expect(s.lines.join('\n')).toMatch(/client auth +bearer token required/);
  });

  it('refuses an unauthenticated or wrongly authenticated client on /v1/ws at the upgrade', async () => {
    await expect(connectClient(s.wsUrl)).rejects.toMatchObject({ code: 'unauthorized' });
    await expect(connectClient(s.wsUrl, { token: 'wrong' })).rejects.toMatchObject({ code: 'unauthorized' });
    const c = await connectClient(s.wsUrl, { token: 'client-secret-0123456789' });
    const st = c.stream({ model: 'llama-3-8b', prompt: 'hi', maxTokens: 3 });
    let n = 0;
    for await (const ch of st) n += ch.n;
    expect(n).toBe(3);
    c.close();
  });

  it('answers 401 on the HTTP API without the token, and serves the openai client with it', async () => {
    expect((await s.get('/v1/models')).status).toBe(401);
    const bad = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await expect(bad.models.list()).rejects.toMatchObject({ status: 401 });
    const good = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'client-secret-0123456789' });
    const r = await good.completions.create({ model: 'llama-3-8b', prompt: 'x', max_tokens: 2 });
    expect(r.usage?.completion_tokens).toBe(2);
  });

  it('keeps the probes open and the admin API on its own token', async () => {
    expect((await s.get('/healthz')).status).toBe(200);
    expect((await s.get('/admin/status', 'client-secret-0123456789')).status).toBe(401);
    expect((await s.get('/admin/status', s.adminToken)).status).toBe(200);
  });
});

describe('serve refusing to start', () => {
  it('will not listen beyond loopback without client tokens', async () => {
    const r = await runCommand(['serve', '--config', CONFIG, '--host', '0.0.0.0', '--port', '0']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/client tokens/);
  });

  it('names the bad field of a config and exits non-zero', async () => {
    const bad = writeConfig(`
models:
  - { name: llama-3-8b, profile: llama-3-8b, tp: 1, replicas: many }
`);
    const r = await runCommand(['serve', '--config', bad, '--port', '0']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/models\[0\]\.replicas/);
  });
});
