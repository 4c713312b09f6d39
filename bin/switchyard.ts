#!/usr/bin/env -S npx tsx
// The switchyard command line: serve, simulate, plan, bench, chat.
import { runSimulateCommand } from './simulate-command.ts';
import { runPlanCommand } from './plan-command.ts';
import { runServeCommand } from './serve-command.ts';
import { runNodeAgentCommand } from './node-agent-command.ts';
import { runChatCommand } from './chat-command.ts';
import { runCalibrateCommand } from './calibrate-command.ts';
import { runRolloutCommand } from './rollout-command.ts';

const USAGE = `usage: switchyard <command> [options]

commands:
  simulate <scenario.yaml> [--seed N] [--json] [--wall] [--explain req.N]
                       run a scenario in virtual time and print its report
  plan <scenario.yaml> [--seed N] [--json]
                       simulate candidate placements (all-large, all-small, switch, share, variants) against the
                       scenario's targets; says "infeasible" and what must change when none meets them
  serve [--config file.yaml] [--port 8080] [--host 127.0.0.1] [--time-scale 1] ...
                       serve the config (default: bin/default-config.yaml) with a node agent process
  node-agent --url ws://host:port/v1/node [--token T]
                       run a worker process that registers simulated GPUs with a control plane
  calibrate --config file.yaml [--model name] [--threads N] [--quick]
                       time each llama.cpp model's engine over step shapes, fit its step-time model, write
                       profiles/<name>.json next to the config (a model's \`calibration: <name>\` simulates on it)
  chat --model <name> "prompt" [--url http://127.0.0.1:8080] [--token T]
                       stream a reply from a running server
  rollout --model M --from v1 --to v2 [--steps N] [--url http://127.0.0.1:8080] [--admin-token T]
                       start a version rollout on a running server (POST /admin/rollout)
`;

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'simulate':
      return runSimulateCommand(rest);
    case 'plan':
      return runPlanCommand(rest);
    case 'serve':
      return exitWhenDone(runServeCommand(rest));
    case 'node-agent':
      return exitWhenDone(runNodeAgentCommand(rest));
    case 'chat':
      return exitWhenDone(runChatCommand(rest));
    case 'calibrate':
      return exitWhenDone(runCalibrateCommand(rest));
    case 'rollout':
      return exitWhenDone(runRolloutCommand(rest));
    case undefined:
    case '-h':
    case '--help':
      process.stdout.write(USAGE);
      return cmd === undefined ? 2 : 0;
    default:
      process.stderr.write(`switchyard: unknown command "${cmd}"\n${USAGE}`);
      return 2;
  }
}

/** Long-running commands hold sockets and timers: exit explicitly once they are done. */
async function exitWhenDone(p: Promise<number>): Promise<number> {
  const code = await p;
  process.exit(code);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`switchyard: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exitCode = 1;
  },
);
