// End to end over TLS: a self-signed certificate made here with openssl, `serve --tls-cert --tls-key` (HTTPS and WSS),
// its worker registering over wss:// and verifying the server with the certificate as its CA, a client streaming over
// wss://, a client without the CA refused, and a plain-text non-loopback listener refused unless --insecure.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectClient } from '../../api/client.ts';
import { runCommand, serve, type Served } from './harness.ts';

const MODEL = 'llama-3-8b';

/** openssl, when this machine has it (Debian's package); the suite says so and is skipped otherwise. */
const openssl = ((): string | null => {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return 'openssl';
  } catch {
    return null;
  }
})();

/** A self-signed certificate for 127.0.0.1 and localhost, valid one day. */
function makeCert(): { cert: string; key: string } {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-tls-'));
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  execFileSync(
    openssl!,
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      key,
      '-out',
      cert,
      '-days',
      '1',
      '-subj',
      '/CN=localhost',
    ].concat(['-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost']),
    { stdio: 'ignore' },
  );
  return { cert, key };
}

/** GET over HTTPS trusting `ca`: the status and the body as JSON. */
function getJson(url: string, ca: Buffer | undefined): Promise<{ status: number; body: unknown }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { ...(ca ? { ca } : {}) }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as unknown }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe.skipIf(openssl === null)('serving over TLS (openssl makes a self-signed certificate)', () => {
  let s: Served;
  let ca: Buffer;

  beforeAll(async () => {
    const { cert, key } = makeCert();
    ca = readFileSync(cert);
    s = await serve(['--tls-cert', cert, '--tls-key', key]);
    const until = performance.now() + 45_000;
    for (;;) {
      const r = await getJson(`${s.url}/readyz`, ca).catch(() => null);
      const m = (r?.body as { models?: Record<string, { ready: boolean }> } | undefined)?.models?.[MODEL];
      if (m?.ready) break;
      if (performance.now() > until) throw new Error(`not ready over TLS:\n${s.lines.join('\n')}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }, 60_000);

  afterAll(async () => {
    await s?.stop();
  });

  it('prints https and wss URLs, and its worker registered over wss:// (the model is ready)', async () => {
    expect(s.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    expect(s.wsUrl).toMatch(/^wss:\/\//);
    expect(s.nodeUrl).toMatch(/^wss:\/\/.*\/v1\/node$/);
    const r = await getJson(`${s.url}/readyz`, ca);
    expect(r.body).toMatchObject({ node: { connected: true } });
  });

  it('streams a request over wss:// to a client that trusts the certificate', async () => {
    const client = await connectClient(s.wsUrl, { ca });
    try {
      const stream = client.stream({ model: MODEL, prompt: 'over tls', maxTokens: 5 });
      let n = 0;
      for await (const c of stream) n += c.n;
      const end = await stream.result;
      expect(end.ok).toBe(true);
      expect(n).toBe(5);
    } finally {
      client.close();
    }
  });

  it('is refused by a client that does not trust the certificate, and answers no plain HTTP', async () => {
    await expect(connectClient(s.wsUrl, {})).rejects.toThrow(/certificate/i);
    await expect(getJson(`${s.url}/healthz`, undefined)).rejects.toThrow(/certificate/i);
    const plain = await fetch(s.url.replace('https:', 'http:') + '/healthz').catch(() => null);
    expect(plain?.status ?? 0).not.toBe(200);
  });
});

describe('serve refusing clear text beyond loopback', () => {
  const CLIENT = 'k7Qm2vX9pL4rT8wZ3nB6';
  it('will not put tokens on a non-loopback plain-text listener without --insecure', async () => {
    const r = await runCommand(['serve', '--host', '0.0.0.0', '--port', '0'], { SWITCHYARD_CLIENT_TOKENS: CLIENT });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/clear text.*--tls-cert.*--insecure/);
  });

  it('starts with --insecure (TLS ends in front of it)', async () => {
    const s = await serve(['--host', '0.0.0.0', '--insecure', '--no-worker'], { SWITCHYARD_CLIENT_TOKENS: CLIENT });
    try {
      expect(s.url).toMatch(/^http:\/\/0\.0\.0\.0:\d+$/);
    } finally {
      await s.stop();
    }
  });

  it('refuses a certificate it cannot use, naming it', async () => {
    const r = await runCommand(['serve', '--port', '0', '--tls-cert', '/nonexistent.pem', '--tls-key', '/x.pem']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--tls-cert \/nonexistent\.pem/);
  });
});
