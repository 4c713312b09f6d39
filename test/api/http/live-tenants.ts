// A serving control plane with tenants on port 0 and a real worker (fixed 5 ms steps), waited on until MODEL is ready.
import { createHash } from 'node:crypto';
import { normalizeScenario } from '../../../actors/config.ts';
import { startNodeProcess, type NodeProcess } from '../../../actors/worker/process.ts';
import { startServer, type RunningServer, type ServerOptions } from '../../../api/server.ts';
import { createTenants, parseTenantsFile } from '../../../api/tenants.ts';

/** The one model served. */
export const MODEL = 'llama-3-8b';

/** Hex SHA-256 of a token, as a tokens file lists it. */
export const sha = (t: string): string => createHash('sha256').update(t).digest('hex');

/** A running server with its worker. */
export interface LiveTenants {
  server: RunningServer;
  worker: NodeProcess;
  stop(): Promise<void>;
}

/** Starts a server with the tenants of `tenantsFile` (YAML) and `extra` options, and its worker; resolves once ready. */
export async function startTenantServer(tenantsFile: string, extra: Partial<ServerOptions> = {}): Promise<LiveTenants> {
  const file = parseTenantsFile(tenantsFile);
  if (!file.ok) throw new Error(file.message);
  const server = await startServer({
    scenario: normalizeScenario({ name: 'tenants', models: [{ name: MODEL, profile: MODEL, replicas: 1 }] }),
    port: 0,
    workerTokens: ['w'],
    adminTokens: ['a'],
    tenants: createTenants(file.tenants),
    ...extra,
  });
  const worker = startNodeProcess({
    url: server.nodeUrl,
    token: 'w',
    gpus: [0, 1, 2, 3, 4, 5, 6, 7],
    executor: 'fixed',
    fixedStepMs: 5,
    timeScale: 1,
  });
  const until = performance.now() + 20_000;
  while (!server.serving.readiness()[MODEL]!.ready) {
    if (performance.now() > until) throw new Error('model not ready');
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    server,
    worker,
    stop: async () => {
      worker.stop();
      await server.close();
    },
  };
}
