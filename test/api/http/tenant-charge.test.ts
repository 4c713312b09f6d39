// A tenant's token rate is charged by the prompt as the model's own tokenizer counts it (what admission uses), not by
// the client's `promptTokens` (WebSocket) nor by characters / 4 (HTTP).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../../api/server.ts';
import { connectClient } from '../../../api/client.ts';
import { MODEL, sha, startTenantServer, type LiveTenants } from './live-tenants.ts';

const WS_TENANT = 'tenant-over-ws-0123456789';
const HTTP_TENANT = 'tenant-over-http-0123456789';
/** 1,200 characters: 300 tokens by the estimate, 1,200 by the model's tokenizer below. */
const PROMPT = 'x'.repeat(1_200);

let live: LiveTenants;
let server: RunningServer;

beforeAll(async () => {
  // A bucket of 1,000 tokens refilled at 1 token/s: a request charged 1,200 empties it; one charged 300 does not.
  const limits = 'tokensPerSecond: 1, burstTokens: 1000';
  live = await startTenantServer(
    `tenants:\n  - { name: ws, tokenSha256: [${sha(WS_TENANT)}], ${limits} }\n` +
      `  - { name: http, tokenSha256: [${sha(HTTP_TENANT)}], ${limits} }\n`,
    // The model's tokenizer: one token per character.
    { tokenizers: new Map([[MODEL, { tokenize: (text: string) => [...text].map((c) => c.charCodeAt(0)) }]]) },
  );
  server = live.server;
}, 30_000);

afterAll(async () => {
  await live?.stop();
});

const complete = (token: string, prompt: string): Promise<Response> =>
  fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: 1 }),
  });

describe("a tenant's charge", () => {
  it('counts a WebSocket prompt by the tokenizer, whatever promptTokens the client claims', async () => {
    const client = await connectClient(server.wsUrl, { token: WS_TENANT });
    try {
      const big = client.stream({ model: MODEL, prompt: PROMPT, promptTokens: 1, maxTokens: 1 });
      // The first request is paid for from the full bucket, whatever its size; what it took is now owed.
      const first = await big.result;
      expect(first).toMatchObject({ ok: true, usage: { promptTokens: 1_200 } });
      const next = await client.stream({ model: MODEL, prompt: 'hi', promptTokens: 1, maxTokens: 1 }).result;
      expect(next.ok ? 'ok' : next.error.code).toBe('overloaded');
      expect(next.ok ? '' : next.error.message).toMatch(/over its rate/);
    } finally {
      client.close();
    }
  });

  it('counts an HTTP prompt by the tokenizer, not by characters / 4', async () => {
    const first = await complete(HTTP_TENANT, PROMPT);
    expect(first.status).toBe(200);
    expect(await first.json()).toMatchObject({ usage: { prompt_tokens: 1_200 } });
    const next = await complete(HTTP_TENANT, 'hi');
    expect(next.status).toBe(429);
    expect(((await next.json()) as { error: { message: string } }).error.message).toMatch(/over its rate/);
  });
});
