// `switchyard serve`: the control plane on the wall clock, with its node agent as a separate, supervised OS process.
// Prints the URLs and tokens it serves with; a bad config names the bad field and exits non-zero.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ConfigError, loadScenario, type Scenario } from '../actors/config.ts';
import type { PromptTokenizer } from '../api/serving.ts';
import { createWallClock } from '../runtime/clock.ts';
import { timerFailed } from '../runtime/contain.ts';
import { backendOf } from '../api/serving.ts';
import { ServeError, startServer, type RunningServer, type ServerOptions } from '../api/server.ts';
import { superviseWorker, type WorkerSupervisor } from '../actors/worker-supervisor.ts';
import { servedModelRoots } from '../actors/worker/model-roots.ts';
import { flag, parseOrUsage, type FlagValues } from './args.ts';
import { readTokens, writeSecrets, type TokenSource, type TokensRead } from './secrets.ts';
import { createTenants, parseTenantsFile, type Tenants } from '../api/tenants.ts';
import { attachStatelyInspector } from '../inspector/stately.ts';
import { loadState, StateFileError, type OperatorState } from '../actors/placement/state-file.ts';
import { createOperator } from '../actors/placement/operator.ts';
import type { ControlPlane } from '../actors/control-plane.ts';
import type { NodeLink } from '../actors/node-link.ts';
import type { AdminHooks } from '../api/http/admin.ts';
import { tuneHeapForServing } from '../runtime/heap-tuning.ts';

/** The embedded default config (`npm start`). */
export const DEFAULT_CONFIG = fileURLToPath(new URL('./default-config.yaml', import.meta.url));

const USAGE = `usage: switchyard serve [--config file.yaml] [--host 127.0.0.1] [--port 8080]
                       [--client-tokens-file F] [--admin-token-file F] [--worker-token-file F]
                       [--inspector-token-file F] [--secrets-file F]
                       [--tenants tenants.yaml]  (client tokens by tenant: limits, classes, fair share)
                       [--tls-cert cert.pem --tls-key key.pem [--tls-ca ca.pem]] [--insecure]
                       [--allowed-origin https://app.example ...] [--allowed-host name ...]
                       [--worker-allow 10.0.0.0/8,...]  (where /v1/node accepts workers from; default loopback)
                       [--time-scale 1] [--executor cost-model|zero-cost|fixed] [--step-ms 1]
                       [--no-worker] [--node-grace-ms 2000] [--repair-ms 60000] [--drain-ms 30000] [--json]
                       [--state-file F]  (operator state, restored at start; put it next to the config)
                       [--max-connections 8192] [--headers-timeout-ms 10000] [--request-timeout-ms 30000]
                       [--token-flush-ms 2]  (later tokens wait up to this long to share a write; 0: every turn)
                       [--stately-inspect ws://host:port]  (also send inspection events to Stately's inspector)
tokens come from files (the *-token-file flags) or from SWITCHYARD_CLIENT_TOKENS (comma-separated),
SWITCHYARD_ADMIN_TOKEN, SWITCHYARD_WORKER_TOKEN, SWITCHYARD_INSPECTOR_TOKEN, never from flag values (ps shows them);
a supplied token is never printed, and a short, placeholder or repetitive one is refused; generated admin and worker
tokens are printed once, or written to --secrets-file (mode 0600)
--tls-cert/--tls-key serve HTTPS and WSS; the worker verifies the server with --tls-ca (default: the certificate itself);
a non-loopback --host is refused in plain text unless --insecure (TLS ends in front of this server)
`;

/** The command's flags (exported so the deploy manifests' command lines are checked against them). */
export const FLAGS = {
  config: flag.str(),
  host: flag.strOr('127.0.0.1'),
  port: flag.intOr(8080, { min: 0, max: 65_535 }),
  // Refused: a token given as a flag value shows in `ps` (the message names the env var or file flag to use).
  'client-token': flag.list(),
  'admin-token': flag.str(),
  'worker-token': flag.str(),
  'client-tokens-file': flag.str(),
  'admin-token-file': flag.str(),
  'worker-token-file': flag.str(),
  'inspector-token-file': flag.str(),
  'secrets-file': flag.str(),
  tenants: flag.str(),
  'tls-cert': flag.str(),
  'tls-key': flag.str(),
  'tls-ca': flag.str(),
  insecure: flag.bool(),
  'allowed-origin': flag.list(),
  'allowed-host': flag.list(),
  'worker-allow': flag.list(),
  'time-scale': flag.numOr(1, { min: 1e-6, max: 1e6 }),
  executor: flag.oneOf('cost-model', 'cost-model', 'zero-cost', 'fixed'),
  'step-ms': flag.str(),
  'no-worker': flag.bool(),
  'node-grace-ms': flag.intOr(2_000, { min: 0, max: 3_600_000 }),
  'repair-ms': flag.int({ min: 0, max: 3_600_000 }),
  'heartbeat-ms': flag.int({ min: 0, max: 3_600_000 }),
  'max-streams': flag.int({ min: 1, max: 16_384 }),
  'token-flush-ms': flag.int({ min: 0, max: 1_000 }),
  'max-connections': flag.int({ min: 1, max: 1_000_000 }),
  'headers-timeout-ms': flag.int({ min: 1_000, max: 3_600_000 }),
  'request-timeout-ms': flag.int({ min: 1_000, max: 3_600_000 }),
  'drain-ms': flag.intOr(30_000, { min: 0, max: 3_600_000 }),
  json: flag.bool(),
  'stately-inspect': flag.str(),
  'state-file': flag.str(),
};

const secret = (): string => randomBytes(24).toString('base64url');
/** Where each kind of token comes from. */
const TOKEN_SOURCES = {
  client: {
    kind: 'client',
    env: 'SWITCHYARD_CLIENT_TOKENS',
    fileFlag: 'client-tokens-file',
    valueFlag: 'client-token',
  },
  admin: { kind: 'admin', env: 'SWITCHYARD_ADMIN_TOKEN', fileFlag: 'admin-token-file', valueFlag: 'admin-token' },
  worker: { kind: 'worker', env: 'SWITCHYARD_WORKER_TOKEN', fileFlag: 'worker-token-file', valueFlag: 'worker-token' },
  inspector: { kind: 'inspector', env: 'SWITCHYARD_INSPECTOR_TOKEN', fileFlag: 'inspector-token-file' },
} as const satisfies Record<string, TokenSource>;

/** Every supplied token, by kind, read (and removed from the environment) before anything else starts. */
function readAllTokens(
  f: FlagValues<typeof FLAGS>,
):
  | { ok: true; client: string[]; admin: string[]; worker: string[]; inspector: string[] }
  | { ok: false; message: string } {
  const read = {
    client: readTokens(TOKEN_SOURCES.client, { value: f['client-token'], file: f['client-tokens-file'] }),
    admin: readTokens(TOKEN_SOURCES.admin, { value: f['admin-token'], file: f['admin-token-file'] }),
    worker: readTokens(TOKEN_SOURCES.worker, { value: f['worker-token'], file: f['worker-token-file'] }),
    inspector: readTokens(TOKEN_SOURCES.inspector, { file: f['inspector-token-file'] }),
  };
  for (const r of Object.values(read)) if (!r.ok) return r;
  const tokens = (r: TokensRead): string[] => (r.ok ? r.tokens : []);
  return {
    ok: true,
    client: tokens(read.client),
    admin: tokens(read.admin),
    worker: tokens(read.worker),
    inspector: tokens(read.inspector),
  };
}

/** The tokenizers of the models a real engine serves (node-llama-cpp is imported only when there are some). */
async function loadTokenizers(
  scenario: Scenario,
): Promise<{ ok: true; map: Map<string, PromptTokenizer> } | { ok: false; message: string }> {
  const map = new Map<string, PromptTokenizer>();
  const engines = scenario.models.filter((m) => m.engine);
  if (engines.length === 0) return { ok: true, map };
  const { loadTokenizer } = await import('../actors/engine/tokenizer.ts');
  for (const m of engines) {
    try {
      map.set(m.name, await loadTokenizer(m.engine!.file));
    } catch (e) {
      return { ok: false, message: `model ${m.name}: ${(e as Error).message}` };
    }
  }
  return { ok: true, map };
}

/** The certificate and key to serve TLS with, and the CA file the worker verifies it by; undefined without TLS. */
function readTls(
  certFile: string | undefined,
  keyFile: string | undefined,
  caFile: string | undefined,
): { ok: true; cert: Buffer; key: Buffer; caFile: string } | { ok: false; message: string } | undefined {
  if (certFile === undefined && keyFile === undefined) {
    return caFile === undefined ? undefined : { ok: false, message: '--tls-ca needs --tls-cert and --tls-key' };
  }
  if (certFile === undefined || keyFile === undefined)
    return { ok: false, message: '--tls-cert and --tls-key go together' };
  const files = { '--tls-cert': certFile, '--tls-key': keyFile, '--tls-ca': caFile ?? certFile };
  const read: Record<string, Buffer> = {};
  for (const [flagName, file] of Object.entries(files)) {
    try {
      read[flagName] = readFileSync(file);
    } catch (e) {
      return { ok: false, message: `cannot read ${flagName} ${file}: ${(e as Error).message}` };
    }
  }
  // A self-signed certificate is its own authority: the worker trusts it unless told of another.
  return { ok: true, cert: read['--tls-cert']!, key: read['--tls-key']!, caFile: caFile ?? certFile };
}

/** The tenants of a tokens file (with plain client tokens as the default tenant), or undefined without one. */
function readTenants(
  file: string | undefined,
  plain: readonly string[],
): { ok: true; tenants: Tenants } | { ok: false; message: string } | undefined {
  if (file === undefined) return undefined;
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    return { ok: false, message: `cannot read --tenants ${file}: ${(e as Error).message}` };
  }
  const parsed = parseTenantsFile(text);
  if (!parsed.ok) return { ok: false, message: `invalid tenants file ${file}: ${parsed.message}` };
  return { ok: true, tenants: createTenants(parsed.tenants, plain) };
}

/** The operator layer (rollouts, the state file, the config's `rollout:` entries), or the refused state file. */
function operatorFor(
  statePath: string | undefined,
  scenario: Scenario,
  log: (line: string) => void,
): { ok: true; admin(cp: ControlPlane, node: NodeLink): AdminHooks } | { ok: false; message: string } {
  let restored: OperatorState | null = null;
  if (statePath) {
    try {
      restored = loadState(statePath, scenario.name);
    } catch (e) {
      if (e instanceof StateFileError) return { ok: false, message: `${e.message} [${e.code}]` };
      throw e;
    }
  }
  return {
    ok: true,
    admin: (cp, node) => {
      const op = createOperator(cp, node, { ...(statePath ? { statePath } : {}), restored, log });
      // The config's rollouts start `at` seconds after start-up (not again when a persisted one resumes).
      for (const r of restored ? [] : scenario.rollout)
        cp.runtime.clock.setTimeout(() => {
          const started = op.rollouts.start(r);
          log(started.ok ? `rollout of ${r.model} started` : `rollout of ${r.model}: ${started.failure.message}`);
        }, r.at * 1000);
      return { rollouts: op.rollouts, changed: op.changed };
    },
  };
}

/** Says why serve cannot start; the exit code 2. */
function refuse(message: string): number {
  process.stderr.write(`switchyard serve: ${message}\n`);
  return 2;
}

/** The server's optional limits, intervals and address lists the flags set (unset ones keep the server's defaults). */
function limitsOf(f: FlagValues<typeof FLAGS>): Partial<ServerOptions> {
  const pick = <K extends keyof ServerOptions>(k: K, v: ServerOptions[K] | undefined): Partial<ServerOptions> =>
    v !== undefined ? { [k]: v } : {};
  return {
    ...pick('heartbeatMs', f['heartbeat-ms']),
    ...pick('maxStreamsPerConnection', f['max-streams']),
    ...pick('tokenFlushMs', f['token-flush-ms']),
    ...pick('maxConnections', f['max-connections']),
    ...pick('headersTimeoutMs', f['headers-timeout-ms']),
    ...pick('requestTimeoutMs', f['request-timeout-ms']),
    ...pick('allowedHosts', f['allowed-host'].length > 0 ? f['allowed-host'] : undefined),
    ...pick('workerAllow', f['worker-allow'].length > 0 ? f['worker-allow'] : undefined),
  };
}
/** Runs `serve` until SIGINT/SIGTERM; resolves with the exit code. */
export async function runServeCommand(argv: string[]): Promise<number> {
  const args = parseOrUsage('serve', USAGE, argv, FLAGS, { maxPositionals: 0 });
  if (!args) return 2;
  if (args.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  tuneHeapForServing();
  const f = args.values;
  const file = f.config ?? DEFAULT_CONFIG;
  let scenario: Scenario;
  try {
    scenario = loadScenario(file);
  } catch (e) {
    if (e instanceof ConfigError) return refuse(`invalid config ${file}: ${e.message}`);
    throw e;
  }
  const tokenizers = await loadTokenizers(scenario);
  if (!tokenizers.ok) return refuse(tokenizers.message);
  const { executor } = f;
  const timeScale = f['time-scale'];
  const supplied = readAllTokens(f);
  if (!supplied.ok) return refuse(supplied.message);
  const clientTokens = supplied.client;
  const tls = readTls(f['tls-cert'], f['tls-key'], f['tls-ca']);
  const tenants = readTenants(f.tenants, clientTokens);
  const bad = [tls, tenants].find((x) => x?.ok === false);
  if (bad && !bad.ok) return refuse(bad.message);
  const adminGiven = supplied.admin[0];
  const workerGiven = supplied.worker[0];
  const adminToken = adminGiven ?? secret();
  const workerToken = workerGiven ?? secret();
  const log = (line: string): void => void process.stderr.write(`${line}\n`);
  const clock = createWallClock(timerFailed(log));
  const operator = operatorFor(f['state-file'], scenario, log);
  if (!operator.ok) return refuse(operator.message);
  let supervisor: WorkerSupervisor | null = null;
  let server: RunningServer;
  try {
    server = await startServer({
      scenario,
      host: f.host,
      port: f.port,
      clientTokens,
      ...(tenants?.ok ? { tenants: tenants.tenants } : {}),
      ...(tls?.ok ? { tls: { cert: tls.cert, key: tls.key } } : {}),
      insecure: f.insecure,
      workerTokens: workerGiven === undefined ? [workerToken] : supplied.worker,
      adminTokens: adminGiven === undefined ? [adminToken] : supplied.admin,
      inspectorTokens: supplied.inspector,
      nodeGraceMs: f['node-grace-ms'],
      allowedOrigins: f['allowed-origin'],
      ...limitsOf(f),
      clock,
      log,
      tokenizers: tokenizers.map,
      admin: operator.admin,
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
  const generated = {
    ...(adminGiven === undefined ? { adminToken } : {}),
    ...(workerGiven === undefined ? { workerToken } : {}),
  };
  // A generated secret is shown once: in a 0600 file when asked, else in the JSON line (--json) or the banner.
  const where = f['secrets-file'] ? `in ${f['secrets-file']}` : f.json ? 'in the JSON line' : null;
  if (f['secrets-file']) {
    try {
      writeSecrets(f['secrets-file'], generated);
    } catch (e) {
      process.stderr.write(`switchyard serve: cannot write ${f['secrets-file']}: ${(e as Error).message}\n`);
      await server.close();
      return 2;
    }
  }
  const shown = (given: string | undefined, token: string): string =>
    given !== undefined ? '(as given)' : where !== null ? `(generated, ${where})` : token;
  printBanner(out, server, scenario, {
    executor,
    timeScale,
    clientTokens: tenants?.ok ? tenants.tenants.size : clientTokens.length,
  });
  if (tenants?.ok)
    out(
      `  tenants        ${tenants.tenants
        .list()
        .map((t) => t.name)
        .join(', ')} (fair queuing by tokens of work)`,
    );
  const stately = f['stately-inspect'] ? attachStatelyInspector(server.inspector.session, f['stately-inspect']) : null;
  if (stately) out(`  stately        sending inspection events to ${f['stately-inspect']}`);
  out(`  admin          ${server.url}/admin/  admin token: ${shown(adminGiven, adminToken)}`);
  out(`  workers        ${server.nodeUrl}  worker token: ${shown(workerGiven, workerToken)}`);
  if (!f['no-worker']) {
    const workerArgs = ['--url', server.nodeUrl, '--gpus', String(scenario.node.gpus), '--executor', executor];
    workerArgs.push('--time-scale', String(timeScale));
    if (f['step-ms']) workerArgs.push('--step-ms', f['step-ms']);
    if (f['repair-ms'] !== undefined) workerArgs.push('--repair-ms', String(f['repair-ms']));
    if (f['heartbeat-ms'] !== undefined) workerArgs.push('--heartbeat-ms', String(f['heartbeat-ms']));
    if (tls?.ok) workerArgs.push('--tls-ca', tls.caFile);
    const modelFiles = scenario.models.flatMap((m) => (m.engine ? [m.engine.file] : []));
    for (const root of servedModelRoots(file, modelFiles)) workerArgs.push('--model-root', root);
    // The worker's environment holds its own token only: the others were removed from process.env above.
    supervisor = superviseWorker({
      clock,
      args: workerArgs,
      token: workerToken,
      log,
      onStart: (pid) => out(`  worker         started, pid ${pid}`),
    });
  } else {
    out(
      '  worker         not started (--no-worker): run `switchyard node-agent --url ...` with SWITCHYARD_WORKER_TOKEN',
    );
  }
  if (f.json) {
    const urls = { url: server.url, wsUrl: server.wsUrl, nodeUrl: server.nodeUrl, port: server.port };
    out(JSON.stringify({ ...urls, ...(f['secrets-file'] ? {} : generated), openClientApi: server.openClientApi }));
  }
  return stopOnSignal(
    server,
    () => supervisor,
    log,
    f['drain-ms'],
    () => stately?.stop(),
  );
}

/** What `serve` prints about where it serves. */
function printBanner(
  out: (line: string) => void,
  server: RunningServer,
  scenario: Scenario,
  o: { executor: string; timeScale: number; clientTokens: number },
): void {
  const models = scenario.models.map((m) => `${m.name} (tp ${m.tp})`).join(', ');
  out(
    `switchyard serving "${scenario.name}" on a simulated ${scenario.node.gpus}x${scenario.node.gpu} node: ${models}; placement ${scenario.placement.policy}`,
  );
  const simulated = scenario.models.filter((x) => !x.engine).map((x) => x.name);
  if (simulated.length > 0)
    out(
      `  backend        ${simulated.join(', ')}: simulated (${o.executor} executor${o.executor === 'cost-model' ? `, time scale ${o.timeScale}` : ''}; text is deterministic pseudo-text)`,
    );
  for (const m of scenario.models.filter((x) => x.engine))
    out(`  backend        ${m.name}: ${backendOf(m).runs} (one engine host per replica)`);
  out(`  OpenAI HTTP    ${server.url}/v1  (POST /v1/chat/completions, /v1/completions, GET /v1/models)`);
  out(`  streaming      ${server.wsUrl}  (subprotocols switchyard.v1.msgpack, switchyard.v1.json)`);
  out(`  metrics        ${server.url}/metrics    health ${server.url}/healthz    ready ${server.url}/readyz`);
  out(
    `  inspector      ${server.url}/inspector/#token=<admin or inspector token>  (read-only live view; stream ${server.url.replace(/^http/, 'ws')}/v1/inspect)`,
  );
  out(
    server.openClientApi
      ? '  client auth    NONE: listening on loopback only, so /v1 needs no token (set SWITCHYARD_CLIENT_TOKENS to require one)'
      : `  client auth    bearer token required on /v1 (${o.clientTokens} token${o.clientTokens > 1 ? 's' : ''} configured)`,
  );
}

/**
 * Graceful stop on SIGTERM or SIGINT: readiness turns false and new requests are refused at once, running ones finish
 * within the drain deadline and the rest get one terminal event each, then the worker is stopped and the server
 * closed; resolves with 0.
 */
function stopOnSignal(
  server: RunningServer,
  supervisor: () => WorkerSupervisor | null,
  log: (line: string) => void,
  drainMs: number,
  onStop: () => void,
): Promise<number> {
  return new Promise((resolve) => {
    let closing = false;
    const stop = (): void => {
      if (closing) return;
      closing = true;
      log(`switchyard: shutting down (draining for up to ${drainMs} ms)`);
      onStop();
      void (async () => {
        await server.drain(drainMs);
        await supervisor()?.stop();
        await server.close();
        resolve(0);
      })();
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}
