// Tenants on a live server (port 0, a real worker): each token's tenant chooses the class and limits its requests,
// on HTTP and on /v1/ws alike; an unknown token is refused.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../../api/server.ts';
import { connectClient } from '../../../api/client.ts';
import { MODEL, sha, startTenantServer, type LiveTenants } from './live-tenants.ts';

const BATCH = 'tenant-batch-only-0123456789';
const ONE = 'tenant-one-at-a-time-0123456789';

let live: LiveTenants;
let server: RunningServer;

beforeAll(async () => {
  live = await startTenantServer(
    `tenants:\n  - { name: batchy, tokenSha256: [${sha(BATCH)}], priorities: [batch] }\n` +
      `  - { name: single, tokenSha256: [${sha(ONE)}], maxConcurrent: 1 }\n`,
  );
  server = live.server;
}, 30_000);

afterAll(async () => {
  await live?.stop();
});

const complete = (token: string, extra: Record<string, unknown> = {}): Promise<Response> =>
  fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: 2, ...extra }),
  });

describe('tenants on a live server', () => {
  it('requires a tenant token: none or an unknown one is 401', async () => {
    expect((await fetch(`${server.url}/v1/models`)).status).toBe(401);
    expect((await complete('nobody-0123456789abcdef')).status).toBe(401);
  });

  it('serves a tenant in its own class and refuses a class that is not its own (the client no longer chooses)', async () => {
    expect((await complete(BATCH)).status).toBe(200);
    expect((await complete(BATCH, { priority: 'batch' })).status).toBe(200);
    const up = await complete(BATCH, { priority: 'interactive' });
    expect(up.status).toBe(400);
    const body = (await up.json()) as { error: { message: string } };
    expect(body.error.message).toMatch(/may not use priority class "interactive"/);
  });

  it('refuses a request over the tenant’s concurrency on /v1/ws with overloaded and retryAfterMs', async () => {
    const client = await connectClient(server.wsUrl, { token: ONE });
    try {
      const first = client.stream({ model: MODEL, prompt: 'long', maxTokens: 400 });
      const second = client.stream({ model: MODEL, prompt: 'again', maxTokens: 4 });
      const end = await second.result;
      expect(end.ok).toBe(false);
      if (end.ok) return;
      expect(end.error.code).toBe('overloaded');
      expect(end.error.retryAfterMs).toBeGreaterThan(0);
      first.cancel();
      await first.result;
    } finally {
      client.close();
    }
  });
});
