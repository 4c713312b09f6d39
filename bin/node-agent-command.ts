// `switchyard node-agent`: the worker process. Registers its GPUs with a control plane over WebSocket and executes
// steps with the cost-model executor in real time, reconnecting with back-off until it is stopped.
import { readFileSync } from 'node:fs';
import { resolve as resolvePath } from 'node:path';
import { startNodeProcess, type ExecutorKind } from '../actors/worker/process.ts';
import { EXIT_UNAUTHORIZED } from '../actors/worker-supervisor.ts';
import { defaultModelRoots } from '../actors/worker/model-roots.ts';
import { isLoopback } from '../transport/ws.ts';
import { flag, parseOrUsage } from './args.ts';
import { presentedToken, type TokenSource } from './secrets.ts';

/** Where the worker token comes from: the environment or a file, never a flag's value (`ps` shows those). */
const WORKER_TOKEN: TokenSource = {
  kind: 'worker',
  env: 'SWITCHYARD_WORKER_TOKEN',
  fileFlag: 'token-file',
  valueFlag: 'token',
};
import { tuneHeapForServing } from '../runtime/heap-tuning.ts';

const USAGE = `usage: switchyard node-agent --url ws://127.0.0.1:8080/v1/node [--token-file F | SWITCHYARD_WORKER_TOKEN=T]
                            [--gpus 8] [--node name] [--executor cost-model|zero-cost|fixed] [--step-ms 1]
                            [--time-scale 1] [--repair-ms 60000] [--max-backoff-ms 1000] [--orphan-grace-ms 10000]
                            [--tls-ca ca.pem] [--insecure] [--model-root dir ...]
--tls-ca: the certificate authority that signed the control plane's certificate (wss:// with a private certificate)
--insecure: allow plain ws:// to a control plane that is not on this host (the token and the work travel unencrypted)
--model-root: a folder model files may be opened from (repeatable; default .cache/models under the working folder);
              a model file the control plane names outside every root fails that replica's load
`;

/** The command's flags (exported so the deploy manifests' command lines are checked against them). */
export const FLAGS = {
  url: flag.str(),
  token: flag.str(),
  'token-file': flag.str(),
  gpus: flag.intOr(8, { min: 1, max: 64 }),
  node: flag.strOr('node'),
  executor: flag.oneOf('cost-model', 'cost-model', 'zero-cost', 'fixed'),
  'step-ms': flag.numOr(1, { min: 0, max: 60_000 }),
  'time-scale': flag.numOr(1, { min: 1e-6, max: 1e6 }),
  'repair-ms': flag.int({ min: 0 }),
  'heartbeat-ms': flag.int({ min: 0 }),
  'tls-ca': flag.str(),
  insecure: flag.bool(),
  'model-root': flag.list(),
  // Reconnect attempts to a restarted control plane at least this often (a restart is ready again within it).
  'max-backoff-ms': flag.intOr(1_000, { min: 10, max: 600_000 }),
  'orphan-grace-ms': flag.intOr(10_000, { min: 0, max: 3_600_000 }),
};

/** Why `url` may not be dialled: plain ws:// to a host other than this one, unless `insecure`; null when it may. */
export function plainTextRefusal(url: string, insecure: boolean): string | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return `--url ${url} is not a URL`;
  }
  if (parsed.protocol === 'wss:') return null;
  if (parsed.protocol !== 'ws:') return `--url must be ws:// or wss://, got ${parsed.protocol}`;
  if (isLoopback(parsed.hostname) || insecure) return null;
  return `--url ${url} sends the worker token in plain text to another host: use wss:// (--tls-ca), or --insecure`;
}

/** Runs the node-agent command until SIGINT/SIGTERM; resolves with the exit code. */
export function runNodeAgentCommand(argv: string[]): Promise<number> {
  const args = parseOrUsage('node-agent', USAGE, argv, FLAGS, { maxPositionals: 0 });
  if (!args) return Promise.resolve(2);
  const { url, executor, gpus } = args.values;
  const presented = presentedToken(WORKER_TOKEN, { value: args.values.token, file: args.values['token-file'] });
  if (!presented.ok) {
    process.stderr.write(`switchyard node-agent: ${presented.message}\n`);
    return Promise.resolve(2);
  }
  const token = presented.token;
  if (url === undefined || !token) {
    process.stderr.write(USAGE);
    return Promise.resolve(2);
  }
  const refusal = plainTextRefusal(url, args.values.insecure);
  if (refusal !== null) {
    process.stderr.write(`switchyard node-agent: ${refusal}\n`);
    return Promise.resolve(2);
  }
  const caFile = args.values['tls-ca'];
  let ca: Buffer | undefined;
  try {
    ca = caFile !== undefined ? readFileSync(caFile) : undefined;
  } catch (e) {
    process.stderr.write(`switchyard node-agent: cannot read --tls-ca ${caFile}: ${(e as Error).message}\n`);
    return Promise.resolve(2);
  }
  const given = args.values['model-root'];
  const modelRoots = given.length > 0 ? given.map((r) => resolvePath(r)) : defaultModelRoots();
  const repairMs = args.values['repair-ms'];
  const heartbeatMs = args.values['heartbeat-ms'];
  tuneHeapForServing();
  return new Promise((resolve) => {
    const worker = startNodeProcess({
      url,
      token,
      ...(ca !== undefined ? { ca } : {}),
      node: args.values.node,
      gpus: Array.from({ length: gpus }, (_, i) => i),
      executor: executor as ExecutorKind,
      fixedStepMs: args.values['step-ms'],
      timeScale: args.values['time-scale'],
      ...(repairMs !== undefined ? { repairMs } : {}),
      ...(heartbeatMs !== undefined ? { heartbeatMs } : {}),
      maxBackoffMs: args.values['max-backoff-ms'],
      orphanGraceMs: args.values['orphan-grace-ms'],
      modelRoots,
      log: (line) => process.stdout.write(`${line}\n`),
      onUnauthorized: () => {
        process.stderr.write('switchyard node-agent: the control plane refused the worker token\n');
        worker.stop();
        resolve(EXIT_UNAUTHORIZED);
      },
    });
    const stop = (): void => {
      worker.stop();
      resolve(0);
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    // Started by `serve`: leave with it.
    if (process.send) process.once('disconnect', stop);
  });
}
