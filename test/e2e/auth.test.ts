// Authentication on real sockets: client tokens when configured, refusal to listen beyond loopback without them,
// and config errors that name the field.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { connectClient } from '../../api/client.ts';
import { runCommand, serve, writeConfig, type Served } from './harness.ts';

const CONFIG = writeConfig(`
name: e2e-auth
models:
  - { name: llama-3-8b, profile: llama-3-8b, tp: 1, replicas: 1 }
`);

const FILED_CLIENT = 'Yt5wQ8nR2kV7mC4xJ9bL';
const FILED_INSPECTOR = 'Hp3sW6zD9fK2qT8vN5cR';
/** A file holding `token`, as a secret mounted from a store would be. */
const tokenFile = (token: string): string => {
  const file = join(mkdtempSync(join(tmpdir(), 'sy-tokens-')), 'token');
  writeFileSync(file, `${token}\n`);
  return file;
};

describe('serve with client tokens', () => {
  let s: Served;
  beforeAll(async () => {
    const files = [
      '--client-tokens-file',
      tokenFile(FILED_CLIENT),
      '--inspector-token-file',
      tokenFile(FILED_INSPECTOR),
    ];
    s = await serve(['--config', CONFIG, '--time-scale', '0.01', ...files], {
      SWITCHYARD_CLIENT_TOKENS: 'client-secret-0123456789',
    });
    await s.waitReady('llama-3-8b');
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('says at start that client tokens are required', () => {
    expect(s.lines.join('\n')).toMatch(/client auth +bearer token required/);
  });

  it('reads tokens from files beside the environment, and never prints them', async () => {
    expect((await s.get('/v1/models', FILED_CLIENT)).status).toBe(200);
    expect((await s.get('/inspector/auth', FILED_INSPECTOR)).status).toBe(200);
    expect((await s.get('/inspector/auth', FILED_CLIENT)).status).toBe(401);
    expect((await s.get('/admin/status', FILED_INSPECTOR)).status).toBe(401);
    expect(s.lines.join('\n')).not.toMatch(new RegExp(`${FILED_CLIENT}|${FILED_INSPECTOR}`));
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

  it('refuses a token given as a flag value (ps shows it), naming the env var and file flag to use', async () => {
    const token = 'Zq8rV2mK9xT4bN7wL3pH';
    for (const [flag, env, file] of [
      ['--admin-token', 'SWITCHYARD_ADMIN_TOKEN', '--admin-token-file'],
      ['--worker-token', 'SWITCHYARD_WORKER_TOKEN', '--worker-token-file'],
      ['--client-token', 'SWITCHYARD_CLIENT_TOKENS', '--client-tokens-file'],
    ] as const) {
      const r = await runCommand(['serve', '--config', CONFIG, '--port', '0', '--no-worker', flag, token]);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`${flag} would show`);
      expect(r.stderr).toContain(env);
      expect(r.stderr).toContain(file);
      expect(r.stdout + r.stderr).not.toContain(token);
    }
  });

  it('refuses placeholder and low-entropy tokens, naming their source and never printing them', async () => {
    const placeholder = 'REPLACE-ME-admin-token';
    const a = await runCommand(['serve', '--config', CONFIG, '--port', '0', '--no-worker'], {
      SWITCHYARD_ADMIN_TOKEN: placeholder,
    });
    expect(a.code).toBe(2);
    expect(a.stderr).toMatch(/admin token from SWITCHYARD_ADMIN_TOKEN looks like a placeholder/);
    expect(a.stdout + a.stderr).not.toContain(placeholder);
    for (const weak of ['changeme-changeme-123', 'abababababababababababab', 'aaaaaaaaaaaaaaaaaaaabcdefgh']) {
      const r = await runCommand(['serve', '--config', CONFIG, '--port', '0', '--no-worker'], {
        SWITCHYARD_CLIENT_TOKENS: `Zq8rV2mK9xT4bN7wL3pH,${weak}`,
      });
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(
        /client token from SWITCHYARD_CLIENT_TOKENS (looks like a placeholder|has only|has too little entropy)/,
      );
      expect(r.stdout + r.stderr).not.toContain(weak);
    }
    const file = join(mkdtempSync(join(tmpdir(), 'sy-tokens-')), 'worker-token');
    writeFileSync(file, 'your-token-example-goes-here\n');
    const w = await runCommand([
      'serve',
      '--config',
      CONFIG,
      '--port',
      '0',
      '--no-worker',
      '--worker-token-file',
      file,
    ]);
    expect(w.code).toBe(2);
    expect(w.stderr).toContain(`worker token from --worker-token-file ${file} looks like a placeholder`);
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
