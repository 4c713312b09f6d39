// Who may reach what beyond the routes' tokens: the Host allow-list on a wildcard bind (its own addresses allowed for
// the kubelet's probes) and the worker link's address allow-list.
import { request } from 'node:http';
import { networkInterfaces } from 'node:os';
import { afterEach, describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../../actors/config.ts';
import { ServeError, startServer, type RunningServer } from '../../../api/server.ts';
import { createWallClock } from '../../../runtime/clock.ts';
import { connectWs } from '../../../transport/ws.ts';

const scenario = normalizeScenario({
  name: 'host-and-worker',
  models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', replicas: 1 }],
});
const WORKER = 'worker-token-0123456789';
const CLIENT = 'client-token-0123456789';

let server: RunningServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

/** GET `path` on 127.0.0.1 with the Host header `host`; resolves with the status. */
const getWithHost = (port: number, path: string, host: string): Promise<number> =>
  new Promise((resolve, reject) => {
    const r = request({ host: '127.0.0.1', port, path, headers: { host } }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    r.on('error', reject);
    r.end();
  });

describe('the Host check', () => {
  it('on a wildcard bind with --allowed-host, allows the listed names and the node own addresses, on the probes too', async () => {
    server = await startServer({
      scenario,
      host: '0.0.0.0',
      port: 0,
      insecure: true,
      clientTokens: [CLIENT],
      workerTokens: [WORKER],
      adminTokens: ['admin-token-0123456789'],
      allowedHosts: ['api.example'],
    });
    const { port } = server;
    for (const path of ['/healthz', '/readyz', '/metrics']) {
      expect(await getWithHost(port, path, 'attacker.example')).toBe(403);
      expect(await getWithHost(port, path, 'api.example')).not.toBe(403);
    }
    // The kubelet probes with Host = the pod's IP and the port: every interface address of the node passes.
    const own = Object.values(networkInterfaces()).flatMap((l) => (l ?? []).map((i) => i.address));
    expect(own.length).toBeGreaterThan(0);
    for (const a of own) {
      const host = a.includes(':') ? `[${a}]:${port}` : `${a}:${port}`;
      expect([host, await getWithHost(port, '/healthz', host)]).toEqual([host, 200]);
    }
  });
});

describe('the worker link', () => {
  const clock = createWallClock();

  it('accepts a worker from loopback by default', async () => {
    server = await startServer({ scenario, port: 0, workerTokens: [WORKER], adminTokens: ['a'] });
    const w = await connectWs(server.nodeUrl, { clock, token: WORKER });
    expect(w.ok).toBe(true);
    if (w.ok) w.peer.close();
  });

  it('refuses a worker, token and all, from an address outside --worker-allow', async () => {
    server = await startServer({
      scenario,
      port: 0,
      workerTokens: [WORKER],
      adminTokens: ['a'],
      workerAllow: ['10.255.255.0/24', 'fd00::/8'],
    });
    const w = await connectWs(server.nodeUrl, { clock, token: WORKER });
    expect(w.ok).toBe(false);
    expect(w.ok ? 0 : w.error.status).toBe(403);
    expect(server.node.connected()).toBe(false);
  });

  it('refuses to start with an entry it cannot use, naming it', async () => {
    await expect(
      startServer({ scenario, port: 0, workerTokens: [WORKER], adminTokens: ['a'], workerAllow: ['10.0.0.0/33'] }),
    ).rejects.toThrow(ServeError);
    await expect(
      startServer({ scenario, port: 0, workerTokens: [WORKER], adminTokens: ['a'], workerAllow: ['gateway'] }),
    ).rejects.toThrow(/--worker-allow: "gateway"/);
  });
});
