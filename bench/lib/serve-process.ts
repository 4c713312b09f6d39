// A `switchyard serve` child process for live benchmarks: started with the given flags on a free port, resolved once
// it prints its URLs and its /readyz answers 200 (within 120 s), stopped with SIGTERM (SIGKILL after 5 s).
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createWallClock } from '../../runtime/clock.ts';
import { cpuProfileArgs } from '../../runtime/cpu-profile.ts';

const BIN = fileURLToPath(new URL('../../bin/switchyard.ts', import.meta.url));
const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => clock.setTimeout(r, ms));

/** A running serve process. */
export interface ServeProcess {
  url: string;
  wsUrl: string;
  stop(): Promise<void>;
}

/** Starts `switchyard serve <flags> --port 0 --json` and resolves once the model is ready. */
export async function startServeProcess(flags: readonly string[]): Promise<ServeProcess> {
  const args = [...cpuProfileArgs(), '--import', 'tsx', BIN, 'serve', ...flags, '--port', '0', '--json'];
  const proc = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  const info = await new Promise<{ url: string; wsUrl: string }>((resolve, reject) => {
    let rest = '';
    const onData = (d: Buffer): void => {
      const parts = (rest + d.toString()).split('\n');
      rest = parts.pop() ?? '';
      for (const l of parts) {
        if (lines.length < 200) lines.push(l);
        if (l.startsWith('{"url"')) resolve(JSON.parse(l) as { url: string; wsUrl: string });
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.once('exit', (code) => reject(new Error(`serve exited (${code}):\n${lines.join('\n')}`)));
  });
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const until = performance.now() + 120_000;
  for (;;) {
    const r = await fetch(`${info.url}/readyz`).catch(() => null);
    if (r?.status === 200) break;
    if (performance.now() > until) throw new Error(`model not ready within 120 s:\n${lines.join('\n')}`);
    await sleep(200);
  }
  return {
    ...info,
    stop: () => stopProcess(proc, exited),
  };
}

/** Stops a child with SIGTERM, SIGKILL after 5 s, and resolves once it has exited (`exited`). */
export async function stopProcess(proc: ChildProcess, exited: Promise<void>): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  proc.kill('SIGTERM');
  const t = clock.setTimeout(() => proc.kill('SIGKILL'), 5_000);
  await exited;
  clock.clearTimeout(t);
}
