// `switchyard serve`: the control plane on the wall clock, with its node agent as a separate, supervised OS process.
// Prints the URLs and tokens it serves with; a bad config names the bad field and exits non-zero.
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { ConfigError, loadScenario, type Scenario } from '../actors/config.ts';
import { createWallClock } from '../runtime/clock.ts';
import { ServeError, startServer, type RunningServer } from '../api/server.ts';
import { superviseWorker, type WorkerSupervisor } from '../actors/worker-supervisor.ts';
import { parseArgs, intFlag } from './args.ts';
import { attachStatelyInspector } from '../inspector/stately.ts';

/** The embedded default config (`npm start`). */
export const DEFAULT_CONFIG = fileURLToPath(new URL('./default-config.yaml', import.meta.url));

const USAGE = `usage: switchyard serve [--config file.yaml] [--host 127.0.0.1] [--port 8080]
                       [--client-token T] [--admin-token T] [--worker-token T]
                       [--time-scale 1] [--executor cost-model|zero-cost|fixed] [--step-ms 1]
                       [--no-worker] [--node-grace-ms 2000] [--repair-ms 60000] [--json]
                       [--stately-inspect ws://host:port]  (also send inspection events to Stately's inspector)
tokens may also come from SWITCHYARD_CLIENT_TOKENS (comma-separated), SWITCHYARD_ADMIN_TOKEN, SWITCHYARD_WORKER_TOKEN
`;

const VALUED = [
  'config',
  'host',
  'port',
  'client-token',
  'admin-token',
  'worker-token',
  'time-scale',
  'executor',
  'step-ms',
  'node-grace-ms',
  'repair-ms',
  'heartbeat-ms',
  'max-streams',
  'stately-inspect',
];

const secret = (): string => randomBytes(18).toString('base64url');
const list = (s: string | undefined): string[] =>
  (s ?? '')
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x.length > 0);

/** Runs `serve` until SIGINT/SIGTERM; resolves with the exit code. */
export async function runServeCommand(argv: string[]): Promise<number> {
  let args;
  try {
    args = parseArgs(argv, VALUED);
  } catch (e) {
    process.stderr.write(`switchyard serve: ${(e as Error).message}\n${USAGE}`);
    return 2;
  }
  if (args.flags.has('help')) {
    process.stdout.write(USAGE);
    return 0;
  }
  const file = typeof args.flags.get('config') === 'string' ? (args.flags.get('config') as string) : DEFAULT_CONFIG;
  let scenario: Scenario;
  try {
    scenario = loadScenario(file);
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`switchyard serve: invalid config ${file}: ${e.message}\n`);
      return 2;
    }
    throw e;
  }
  const flag = (k: string): string | undefined =>
    typeof args.flags.get(k) === 'string' ? (args.flags.get(k) as string) : undefined;
  const timeScale = Number(flag('time-scale') ?? 1);
  if (!(timeScale > 0)) {
    process.stderr.write('switchyard serve: --time-scale must be a number > 0\n');
    return 2;
  }
  const executor = flag('executor') ?? 'cost-model';
  if (!['cost-model', 'zero-cost', 'fixed'].includes(executor)) {
    process.stderr.write('switchyard serve: --executor must be cost-model, zero-cost or fixed\n');
    return 2;
  }
  const clientTokens = [...list(flag('client-token')), ...list(process.env['SWITCHYARD_CLIENT_TOKENS'])];
  const adminGiven = flag('admin-token') ?? process.env['SWITCHYARD_ADMIN_TOKEN'];
  const workerGiven = flag('worker-token') ?? process.env['SWITCHYARD_WORKER_TOKEN'];
  const adminToken = adminGiven ?? secret();
  const workerToken = workerGiven ?? secret();
  const clock = createWallClock();
  const log = (line: string): void => void process.stderr.write(`${line}\n`);
  let supervisor: WorkerSupervisor | null = null;
  let server: RunningServer;
  try {
    server = await startServer({
      scenario,
      host: flag('host') ?? '127.0.0.1',
      port: intFlag(args, 'port', 8080),
      clientTokens,
      workerTokens: [workerToken],
      adminTokens: [adminToken],
      nodeGraceMs: intFlag(args, 'node-grace-ms', 2_000),
      ...(args.flags.has('heartbeat-ms') ? { heartbeatMs: intFlag(args, 'heartbeat-ms', 5_000) } : {}),
      ...(args.flags.has('max-streams') ? { maxStreamsPerConnection: intFlag(args, 'max-streams', 16_384) } : {}),
      clock,
      log,
      status: () => ({
        worker: {
          pid: supervisor?.pid() ?? null,
          restarts: supervisor?.restarts() ?? 0,
          gaveUp: supervisor?.gaveUp() ?? false,
        },
      }),
    });
  } catch (e) {
    if (e instanceof ServeError) {
      process.stderr.write(`switchyard serve: ${e.message}\n`);
      return 2;
    }
    const err = e as Error & { code?: string };
    if (err.code === 'EADDRINUSE' || err.code === 'EACCES') {
      process.stderr.write(`switchyard serve: cannot listen: ${err.message} (choose another --port)\n`);
      return 2;
    }
    throw e;
  }
  const out = (line: string): void => void process.stdout.write(`${line}\n`);
  const models = scenario.models.map((m) => `${m.name} (tp ${m.tp})`).join(', ');
  out(
    `switchyard serving "${scenario.name}" on a simulated ${scenario.node.gpus}x${scenario.node.gpu} node: ${models}; placement ${scenario.placement.policy}`,
  );
  out(
    `  backend        simulated (${executor} executor${executor === 'cost-model' ? `, time scale ${timeScale}` : ''}; text is deterministic pseudo-text)`,
  );
  out(`  OpenAI HTTP    ${server.url}/v1  (POST /v1/chat/completions, /v1/completions, GET /v1/models)`);
  out(`  streaming      ${server.wsUrl}  (subprotocols switchyard.v1.msgpack, switchyard.v1.json)`);
  out(`  metrics        ${server.url}/metrics    health ${server.url}/healthz    ready ${server.url}/readyz`);
  out(
    `  inspector      ${server.url}/inspector  (read-only live view; stream ${server.url.replace(/^http/, 'ws')}/v1/inspect)`,
  );
  const stately = flag('stately-inspect')
    ? attachStatelyInspector(server.inspector.session, flag('stately-inspect')!)
    : null;
  if (stately) out(`  stately        sending inspection events to ${flag('stately-inspect')}`);
  out(`  admin          ${server.url}/admin/  admin token: ${adminGiven ? '(as given)' : adminToken}`);
  out(`  workers        ${server.nodeUrl}  worker token: ${workerGiven ? '(as given)' : workerToken}`);
  out(
    server.openClientApi
      ? '  client auth    NONE: listening on loopback only, so /v1 needs no token (pass --client-token to require one)'
      : `  client auth    bearer token required on /v1 (${clientTokens.length} token${clientTokens.length > 1 ? 's' : ''} configured)`,
  );
  if (!args.flags.has('no-worker')) {
    const workerArgs = [
      '--url',
      server.nodeUrl,
      '--gpus',
      String(scenario.node.gpus),
      '--executor',
      executor,
      '--time-scale',
      String(timeScale),
    ];
    if (flag('step-ms')) workerArgs.push('--step-ms', flag('step-ms')!);
    if (flag('repair-ms')) workerArgs.push('--repair-ms', flag('repair-ms')!);
    if (flag('heartbeat-ms')) workerArgs.push('--heartbeat-ms', flag('heartbeat-ms')!);
    supervisor = superviseWorker({
      clock,
      args: workerArgs,
      token: workerToken,
      log,
      onStart: (pid) => out(`  worker         started, pid ${pid}`),
    });
  } else {
    out('  worker         not started (--no-worker): run `switchyard node-agent --url ... --token ...`');
  }
  if (args.flags.has('json')) {
    out(
      JSON.stringify({
        url: server.url,
        wsUrl: server.wsUrl,
        nodeUrl: server.nodeUrl,
        port: server.port,
        adminToken,
        workerToken,
        openClientApi: server.openClientApi,
      }),
    );
  }
  return new Promise((resolve) => {
    let closing = false;
    const stop = (): void => {
      if (closing) return;
      closing = true;
      log('switchyard: shutting down');
      stately?.stop();
      void (async () => {
        await supervisor?.stop();
        await server.close();
        resolve(0);
      })();
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}
