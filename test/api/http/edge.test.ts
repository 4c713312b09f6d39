// The HTTP edge against a live server on port 0: request targets that used to crash it, Host and Origin rules, JSON
// content type, admin escapes, bounded metric labels and the Inference Extension gauges, worker slots, graceful drain.
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../../actors/config.ts';
import { startNodeProcess, type NodeProcess } from '../../../actors/worker/process.ts';
import { loadByModel } from '../../../api/metrics.ts';
import { startServer, type RunningServer } from '../../../api/server.ts';
import { isLoopback } from '../../../transport/ws.ts';
import { createWallClock } from '../../../runtime/clock.ts';
import { connectWs } from '../../../transport/ws.ts';
import { connectClient } from '../../../api/client.ts';

const MODEL = 'llama-3-8b';
const ADMIN = 'admin-token-0123456789';
const WORKER = 'worker-token-0123456789';

/** Sends raw bytes and resolves with everything the server answered before it closed (or after `ms`). */
function raw(port: number, text: string, ms = 2_000): Promise<string> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let out = '';
    const t = setTimeout(() => s.destroy(), ms);
    s.on('data', (d) => (out += d.toString('latin1')));
    s.on('close', () => {
      clearTimeout(t);
      resolve(out);
    });
    s.on('error', () => {});
    s.write(text);
  });
}

const statusOf = (answer: string): number => Number(/^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1] ?? 0);

async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

let server: RunningServer;
let worker: NodeProcess;

beforeAll(async () => {
  const scenario = normalizeScenario({ name: 'edge', models: [{ name: MODEL, profile: MODEL, replicas: 2 }] });
  server = await startServer({
    scenario,
    port: 0,
    workerTokens: [WORKER],
    adminTokens: [ADMIN],
    allowedOrigins: ['https://app.example'],
    maxWsConnections: 2,
  });
  worker = startNodeProcess({
    url: server.nodeUrl,
    token: WORKER,
    gpus: [0, 1, 2, 3, 4, 5, 6, 7],
    executor: 'fixed',
    fixedStepMs: 5,
    timeScale: 1,
  });
  await until(() => server.serving.readiness()[MODEL]!.ready, 20_000, 'model ready');
}, 30_000);

afterAll(async () => {
  worker?.stop();
  await server?.close();
});

const get = (path: string, headers: Record<string, string> = {}): Promise<Response> =>
  fetch(`${server.url}${path}`, { headers });
const post = (path: string, body: string, headers: Record<string, string>): Promise<Response> =>
  fetch(`${server.url}${path}`, { method: 'POST', body, headers });

describe('the HTTP edge', () => {
  it('answers GET // with 404 and keeps serving (it used to crash the process in the inspector route)', async () => {
    for (const target of ['//', '//inspector', '///x', '//[', '/%zz', '*']) {
      const answer = await raw(server.port, `GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
      expect([400, 404]).toContain(statusOf(answer));
    }
    expect((await get('/healthz')).status).toBe(200);
  });

  it('keeps pipelined answers whole when a request behind another expects 100-continue (found by fuzz:http)', async () => {
    // Node wrote the interim 100 between the headers and the body of the answer before it, garbling the stream.
    const page = 'GET /inspector/ HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n\r\n';
    const answer = await raw(
      server.port,
      `TRACE /x HTTP/1.1\r\nHost: localhost\r\n\r\n${page}GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n`,
    );
    // Read the answers one by one by their Content-Length: each must start with a status line where the last ended.
    const statuses: number[] = [];
    let rest = answer;
    while (rest.length > 0) {
      const head = /^HTTP\/1\.1 (\d{3})[^]*?\r\n\r\n/.exec(rest);
      expect(head, `an answer starts at ${JSON.stringify(rest.slice(0, 40))}`).not.toBeNull();
      const status = Number(head![1]);
      statuses.push(status);
      const length = status < 200 ? 0 : Number(/\r\ncontent-length: (\d+)/i.exec(head![0])?.[1] ?? 0);
      rest = rest.slice(head![0].length + length);
    }
    // 404, then the page (the interim 100 left out behind an unanswered request), and the connection closes after
    // it, as node does when a 100-continue went unanswered: the third request is not read.
    expect(statuses).toEqual([404, 200]);
    expect((await get('/healthz')).status).toBe(200);
  });

  it('answers an upgrade pipelined behind a streaming request only after the stream (found by fuzz:http)', async () => {
    // The refusal (or the 101) was written at once, inside the event stream still being answered.
    const body = JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: 4, stream: true });
    const upgrade =
      'GET /healthz HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
      'Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: x\r\n\r\n';
    const answer = await raw(
      server.port,
      `POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${body.length}\r\n\r\n${body}${upgrade}`,
      5_000,
    );
    const end = answer.indexOf('\r\n0\r\n\r\n');
    expect(answer.startsWith('HTTP/1.1 200 OK')).toBe(true);
    expect(end, answer).toBeGreaterThan(0);
    const stream = answer.slice(0, end);
    expect(stream).toContain('data: [DONE]');
    expect(stream).not.toContain('HTTP/1.1 404');
    expect(answer.slice(end + 7).startsWith('HTTP/1.1 404 Not Found')).toBe(true);
  });

  it('refuses a text/plain POST with 415, so that a cross-site page cannot send one without a preflight', async () => {
    const body = JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: 2 });
    const r = await post('/v1/completions', body, { 'content-type': 'text/plain' });
    expect(r.status).toBe(415);
    const ok = await post('/v1/completions', body, { 'content-type': 'application/json; charset=utf-8' });
    expect(ok.status).toBe(200);
  });

  it('refuses a Host outside the loopback names (DNS rebinding) on every route, the probes included', async () => {
    for (const path of ['/v1/models', '/healthz', '/readyz', '/metrics', '/inspector']) {
      const answer = await raw(
        server.port,
        `GET ${path} HTTP/1.1\r\nHost: attacker.example:${server.port}\r\nConnection: close\r\n\r\n`,
      );
      expect([path, statusOf(answer)]).toEqual([path, 403]);
    }
    for (const host of [`127.0.0.1:${server.port}`, 'localhost']) {
      const probe = await raw(server.port, `GET /healthz HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
      expect(statusOf(probe)).toBe(200);
    }
  });

  it('refuses a page from another site on /v1, and lets an allowed origin and its own origin in', async () => {
    const body = JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: 1 });
    const json = { 'content-type': 'application/json' };
    expect((await post('/v1/completions', body, { ...json, origin: 'https://evil.example' })).status).toBe(403);
    expect((await post('/v1/completions', body, { ...json, origin: 'https://app.example' })).status).toBe(200);
    expect((await post('/v1/completions', body, { ...json, origin: server.url })).status).toBe(200);
  });

  it('refuses a page from another site at the /v1/ws upgrade with 403', async () => {
    const r = await connectWs(server.wsUrl, {
      clock: createWallClock(),
      protocols: ['switchyard.v1.json'],
      handshakeTimeoutMs: 2_000,
    });
    expect(r.ok).toBe(true);
    if (r.ok) r.peer.close();
    const answer = await raw(
      server.port,
      'GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
        'Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n' +
        'Sec-WebSocket-Protocol: switchyard.v1.json\r\nOrigin: https://evil.example\r\n\r\n',
    );
    expect(statusOf(answer)).toBe(403);
  });

  it('answers a bad % escape in an admin URL with 400, not 500', async () => {
    const r = await fetch(`${server.url}/admin/replicas/%E0%A4%A/drain`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN}` },
    });
    expect(r.status).toBe(400);
  });

  it('names the field of a bad admin body', async () => {
    const r = await post('/admin/routing', JSON.stringify({ policy: 'fastest' }), {
      authorization: `Bearer ${ADMIN}`,
      'content-type': 'application/json',
    });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: { message: string } }).error.message).toMatch(/^policy: expected one of/);
  });

  it('labels metrics only with configured models and known codes, in seconds', async () => {
    for (let i = 0; i < 5; i++) {
      await post('/v1/completions', JSON.stringify({ model: `made-up-${i}`, prompt: 'x' }), {
        'content-type': 'application/json',
      });
    }
    const text = await (await get('/metrics')).text();
    expect(text).not.toContain('made-up-');
    expect(text).toMatch(/switchyard_requests_total\{model="unknown",outcome="rejected",code="model_not_found"\} 5/);
    expect(text).toContain('switchyard_ttft_seconds_bucket');
    expect(text).not.toContain('_ms_bucket');
  });

  it('reports the live placement and routing policies in /readyz and /admin/status', async () => {
    const r = await post('/admin/routing', JSON.stringify({ policy: 'round-robin' }), {
      authorization: `Bearer ${ADMIN}`,
      'content-type': 'application/json',
    });
    expect(r.status).toBe(200);
    const ready = (await (await get('/readyz')).json()) as { policies: { routing: string; placement: string } };
    expect(ready.policies).toEqual({ routing: 'round-robin', placement: 'exclusive' });
    await post('/admin/routing', JSON.stringify({ policy: 'cost' }), {
      authorization: `Bearer ${ADMIN}`,
      'content-type': 'application/json',
    });
  });
});

describe('/readyz and outlier ejection', () => {
  it('says which replica outlier ejection keeps out of routing, and why', async () => {
    type Ready = { models: Record<string, { replicas: { id: string; ejected: string | null }[] }> };
    const replicasNow = async () => ((await (await get('/readyz')).json()) as Ready).models[MODEL]!.replicas;
    const before = await replicasNow();
    expect(before.map((r) => r.ejected)).toEqual([null, null]);
    const id = before[0]!.id;
    server.cp.health.failed(id, 'a test fault');
    try {
      const after = await replicasNow();
      expect(after.find((r) => r.id === id)!.ejected).toBe('failed (a test fault)');
      expect(after.find((r) => r.id !== id)!.ejected).toBeNull();
    } finally {
      server.cp.health.reset(id);
    }
    expect((await replicasNow()).map((r) => r.ejected)).toEqual([null, null]);
  });
});

describe('the Inference Extension gauges', () => {
  it('match what the control plane knows while requests wait and run', async () => {
    const client = await connectClient(server.wsUrl, {});
    const streams = Array.from({ length: 40 }, () =>
      client.stream({ model: MODEL, prompt: 'x'.repeat(400), maxTokens: 400 }),
    );
    try {
      await until(() => loadByModel(server.cp).total.running > 0, 10_000, 'running requests');
      const text = await (await get('/metrics')).text();
      const value = (name: string, labels = ''): number =>
        Number(new RegExp(`^${name}${labels.replace(/[{}]/g, '\\$&')} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
      const known = loadByModel(server.cp);
      const model = `{model="${MODEL}"}`;
      // Set semantics: a scrape reads the state at that moment; steps move on within a few ms, so allow the batch.
      expect(value('switchyard_num_requests_running')).toBeGreaterThan(0);
      expect(value('switchyard_num_requests_running', model)).toBe(value('switchyard_num_requests_running'));
      expect(Math.abs(value('switchyard_num_requests_running') - known.total.running)).toBeLessThanOrEqual(40);
      expect(value('switchyard_num_requests_waiting', model)).toBe(value('switchyard_num_requests_waiting'));
      const kv = value('switchyard_kv_cache_usage_perc');
      expect(kv).toBeGreaterThan(0);
      expect(kv).toBeLessThanOrEqual(1);
      expect(value('switchyard_kv_cache_usage_perc', model)).toBe(kv);
    } finally {
      for (const s of streams) s.cancel();
      await Promise.allSettled(streams.map((s) => s.result));
      client.close();
    }
  });
});

describe('WebSocket slots', () => {
  it('keeps slots for /v1/node: a worker gets in while client slots are full', async () => {
    const clock = createWallClock();
    const peers = [];
    for (let i = 0; i < 2; i++) {
      const r = await connectWs(server.wsUrl, { clock, protocols: ['switchyard.v1.json'] });
      expect(r.ok).toBe(true);
      if (r.ok) peers.push(r.peer);
    }
    const third = await connectWs(server.wsUrl, { clock, protocols: ['switchyard.v1.json'] });
    expect(third.ok).toBe(false);
    expect(third.ok ? 0 : third.error.status).toBe(503);
    // A worker's upgrade is refused for its duplicate GPUs by the node link, not for want of a slot.
    const w = await connectWs(server.nodeUrl, { clock, token: WORKER });
    expect(w.ok).toBe(true);
    if (w.ok) w.peer.close();
    for (const p of peers) p.close();
  });
});

describe('isLoopback', () => {
  it('parses addresses instead of testing a prefix', () => {
    for (const h of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', '::ffff:127.0.0.1', 'localhost'])
      expect(isLoopback(h)).toBe(true);
    for (const h of ['127.example.com', '127.0.0.1.nip.io', '0.0.0.0', '10.0.0.1', '::', '::ffff:10.0.0.1', ''])
      expect(isLoopback(h)).toBe(false);
  });
});
