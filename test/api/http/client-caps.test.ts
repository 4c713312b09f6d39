// Caps per client, not per address: behind a gateway every tenant arrives from one address, so WebSockets, HTTP
// connections and in-flight streams are counted per tenant (per address only where no tenant is known).
import { request, Agent } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../../api/server.ts';
import { createWallClock } from '../../../runtime/clock.ts';
import { connectWs, type WsPeer } from '../../../transport/ws.ts';
import { MODEL, sha, startTenantServer, type LiveTenants } from './live-tenants.ts';

const A = 'tenant-a-token-0123456789';
const A2 = 'tenant-a-second-token-0123456789';
const B = 'tenant-b-token-0123456789';

let live: LiveTenants;
let server: RunningServer;

beforeAll(async () => {
  live = await startTenantServer(
    `tenants:\n  - { name: a, tokenSha256: [${sha(A)}, ${sha(A2)}] }\n  - { name: b, tokenSha256: [${sha(B)}] }\n`,
    { maxWsPerAddress: 2, maxWsPerToken: 3, maxConnectionsPerAddress: 2, maxStreamsPerClient: 2 },
  );
  server = live.server;
}, 30_000);

afterAll(async () => {
  await live?.stop();
});

describe('WebSockets per tenant', () => {
  it("caps one tenant's sockets across its tokens, and leaves another tenant from the same address its own", async () => {
    const clock = createWallClock();
    const open = (token: string): ReturnType<typeof connectWs> =>
      connectWs(server.wsUrl, { clock, token, protocols: ['switchyard.v1.json'] });
    const peers: WsPeer[] = [];
    try {
      for (const token of [A, A2, A]) {
        const r = await open(token);
        expect(r.ok).toBe(true);
        if (r.ok) peers.push(r.peer);
      }
      const fourth = await open(A2);
      expect(fourth.ok ? 0 : fourth.error.status).toBe(429);
      for (let i = 0; i < 2; i++) {
        const r = await open(B);
        expect(r.ok).toBe(true);
        if (r.ok) peers.push(r.peer);
      }
    } finally {
      for (const p of peers) p.close();
    }
  });
});

/** Starts a long SSE completion on a connection of its own; resolves with its status once the head arrives. */
function stream(token: string, agent: Agent): Promise<{ status: number; close(): void }> {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ model: MODEL, prompt: 'a long story', max_tokens: 4000, stream: true });
    const r = request(
      `${server.url}/v1/completions`,
      {
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      },
      (res) => {
        res.resume();
        resolve({ status: res.statusCode ?? 0, close: () => r.destroy() });
      },
    );
    r.on('error', reject);
    r.end(body);
  });
}

describe('HTTP streams per tenant', () => {
  it("caps one tenant's streams, and lets another tenant past its address's connection cap", async () => {
    // A connection of its own per request, as a gateway opens them to the pod.
    const agent = new Agent({ keepAlive: false, maxSockets: 16 });
    const held: { close(): void }[] = [];
    try {
      for (let i = 0; i < 2; i++) {
        const s = await stream(A, agent);
        expect(s.status).toBe(200);
        held.push(s);
      }
      const third = await stream(A2, agent);
      expect(third.status).toBe(429);
      const other = await stream(B, agent);
      expect(other.status).toBe(200);
      held.push(other);
    } finally {
      for (const h of held) h.close();
      agent.destroy();
    }
  });
});
