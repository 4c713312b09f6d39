import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocketServer } from 'ws';
import type { AddressInfo } from 'node:net';
import { normalizeScenario } from '../../actors/config.ts';
import { startServer, type RunningServer } from '../../api/server.ts';
import { attachStatelyInspector } from '../../inspector/stately.ts';

describe('the optional @statelyai/inspect sender', () => {
  let server: RunningServer;
  let receiver: WebSocketServer;
  const received: { type: string; sessionId?: string; event?: { type: string } }[] = [];
  beforeAll(async () => {
    receiver = new WebSocketServer({ port: 0, host: '127.0.0.1' });
    receiver.on('connection', (ws) => ws.on('message', (d) => received.push(JSON.parse(String(d)))));
    await new Promise<void>((r) => receiver.once('listening', () => r()));
    const scenario = normalizeScenario({
      name: 'stately',
      models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 1 }],
    });
    server = await startServer({ scenario, port: 0, workerTokens: ['w'], adminTokens: ['a'] });
  });
  afterAll(async () => {
    await server?.close();
    await new Promise<void>((r) => receiver.close(() => r()));
  });

  it("feeds Stately's WebSocket inspector, and inspection is on only while it is attached", async () => {
    const port = (receiver.address() as AddressInfo).port;
    const sender = attachStatelyInspector(server.inspector.session, `ws://127.0.0.1:${port}`);
    expect(server.inspector.session.active()).toBe(true);
    // Something for the placement actor to react to: a GPU failure report.
    server.runtime.send('placement', { type: 'gpu.failed', gpu: 2, code: 'xid_79' });
    await expect
      .poll(() => received.some((e) => e.type === '@xstate.snapshot' && e.event?.type === 'gpu.failed'), {
        timeout: 10_000,
      })
      .toBe(true);
    sender.stop();
    expect(server.inspector.session.active()).toBe(false);
  });
});
