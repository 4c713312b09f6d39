// `switchyard node-agent`: the worker process. Registers its GPUs with a control plane over WebSocket and executes
// steps with the cost-model executor in real time, reconnecting with back-off until it is stopped.
import { startNodeProcess, type ExecutorKind } from '../actors/worker/process.ts';
import { EXIT_UNAUTHORIZED } from '../actors/worker-supervisor.ts';
import { parseArgs, intFlag } from './args.ts';

const USAGE = `usage: switchyard node-agent --url ws://127.0.0.1:8080/v1/node [--token T | SWITCHYARD_WORKER_TOKEN=T]
                            [--gpus 8] [--node name] [--executor cost-model|zero-cost|fixed] [--step-ms 1]
                            [--time-scale 1] [--repair-ms 60000]
`;

/** Runs the node-agent command until SIGINT/SIGTERM; resolves with the exit code. */
export function runNodeAgentCommand(argv: string[]): Promise<number> {
  const args = parseArgs(argv, [
    'url',
    'token',
    'gpus',
    'node',
    'executor',
    'step-ms',
    'time-scale',
    'repair-ms',
    'heartbeat-ms',
  ]);
  const url = args.flags.get('url');
  const token = (args.flags.get('token') as string | undefined) ?? process.env['SWITCHYARD_WORKER_TOKEN'];
  if (typeof url !== 'string' || !token) {
    process.stderr.write(USAGE);
    return Promise.resolve(2);
  }
  const executor = String(args.flags.get('executor') ?? 'cost-model');
  if (!['cost-model', 'zero-cost', 'fixed'].includes(executor)) {
    process.stderr.write(`switchyard node-agent: --executor must be cost-model, zero-cost or fixed\n`);
    return Promise.resolve(2);
  }
  const timeScale = Number(args.flags.get('time-scale') ?? 1);
  if (!(timeScale > 0)) {
    process.stderr.write('switchyard node-agent: --time-scale must be a number > 0\n');
    return Promise.resolve(2);
  }
  const gpus = intFlag(args, 'gpus', 8);
  return new Promise((resolve) => {
    const worker = startNodeProcess({
      url,
      token,
      node: String(args.flags.get('node') ?? 'node'),
      gpus: Array.from({ length: gpus }, (_, i) => i),
      executor: executor as ExecutorKind,
      fixedStepMs: Number(args.flags.get('step-ms') ?? 1),
      timeScale,
      ...(args.flags.has('repair-ms') ? { repairMs: intFlag(args, 'repair-ms', 60_000) } : {}),
      ...(args.flags.has('heartbeat-ms') ? { heartbeatMs: intFlag(args, 'heartbeat-ms', 5_000) } : {}),
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
