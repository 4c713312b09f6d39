#!/usr/bin/env -S npx tsx
// The switchyard command line: serve, simulate, plan, bench, chat.
import { runSimulateCommand } from './simulate-command.ts';

const USAGE = `usage: switchyard <command> [options]

commands:
  simulate <scenario.yaml> [--seed N] [--json] [--wall] [--explain req.N]
                       run a scenario in virtual time and print its report
`;

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'simulate':
      return runSimulateCommand(rest);
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

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`switchyard: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exitCode = 1;
  },
);
