// Runs the node agent as a separate OS process and restarts it when it dies, with back-off and a restart intensity:
// past `maxRestarts` within `windowMs` the supervisor gives up and says so instead of looping (the control plane stays up).
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Clock, TimerId } from '../runtime/clock.ts';
import { cpuProfileArgs } from '../runtime/cpu-profile.ts';

/** Exit code of a worker whose token was refused: restarting cannot help. */
export const EXIT_UNAUTHORIZED = 3;

/** Options of the supervisor. */
export interface SupervisorOptions {
  clock: Clock;
  /** Arguments after `switchyard node-agent`. */
  args: readonly string[];
  /** Passed in the environment, never on the command line (where `ps` would show it). */
  token: string;
  maxRestarts?: number;
  windowMs?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
  log(line: string): void;
  /** Each time a worker process starts. */
  onStart?(pid: number): void;
}

/** A supervised worker. */
export interface WorkerSupervisor {
  /** The live worker's pid, or null. */
  pid(): number | null;
  restarts(): number;
  /** True once the supervisor gave up restarting. */
  gaveUp(): boolean;
  /** Stops supervising and terminates the worker; resolves when it has exited. */
  stop(): Promise<void>;
}

const BIN = fileURLToPath(new URL('../bin/switchyard.ts', import.meta.url));

/** Starts and supervises a worker process. */
export function superviseWorker(opts: SupervisorOptions): WorkerSupervisor {
  const maxRestarts = opts.maxRestarts ?? 10;
  const windowMs = opts.windowMs ?? 60_000;
  let child: ChildProcess | null = null;
  let stopping = false;
  let gaveUp = false;
  let restarts = 0;
  let recent: number[] = [];
  let backoff = opts.baseBackoffMs ?? 200;
  let timer: TimerId | null = null;
  let exited: Promise<void> = Promise.resolve();

  const start = (): void => {
    timer = null;
    const c = spawn(
      process.execPath,
      [...cpuProfileArgs(), '--import', import.meta.resolve('tsx'), BIN, 'node-agent', ...opts.args],
      {
        env: { ...process.env, SWITCHYARD_WORKER_TOKEN: opts.token },
        // The IPC channel is how the worker learns that serve died (even by SIGKILL): it then exits instead of lingering.
        stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
      },
    );
    child = c;
    const startedAt = opts.clock.now();
    for (const s of [c.stdout, c.stderr]) {
      let rest = '';
      s?.setEncoding('utf8');
      s?.on('data', (d: string) => {
        const lines = (rest + d).split('\n');
        rest = lines.pop() ?? '';
        if (rest.length > 64 * 1024) rest = '';
        for (const l of lines) if (l.length > 0) opts.log(`[worker ${c.pid ?? '?'}] ${l}`);
      });
    }
    exited = new Promise((resolve) => {
      c.once('exit', (code, signal) => {
        if (child === c) child = null;
        resolve();
        if (stopping) return;
        opts.log(`worker ${c.pid ?? '?'} exited (${signal ?? `code ${code}`})`);
        if (code === EXIT_UNAUTHORIZED) {
          gaveUp = true;
          opts.log('worker token refused; not restarting');
          return;
        }
        const now = opts.clock.now();
        // A worker that ran for a while earns a fresh back-off.
        if (now - startedAt > windowMs) backoff = opts.baseBackoffMs ?? 200;
        recent = recent.filter((t) => now - t < windowMs);
        if (recent.length >= maxRestarts) {
          gaveUp = true;
          opts.log(
            `worker died ${recent.length + 1} times within ${windowMs} ms; giving up (the control plane stays up, /readyz says why)`,
          );
          return;
        }
        recent.push(now);
        restarts++;
        opts.log(`restarting worker in ${backoff} ms`);
        timer = opts.clock.setTimeout(start, backoff);
        backoff = Math.min(opts.maxBackoffMs ?? 5_000, backoff * 2);
      });
    });
    c.once('spawn', () => {
      if (c.pid !== undefined) opts.onStart?.(c.pid);
    });
  };
  start();

  return {
    pid: () => child?.pid ?? null,
    restarts: () => restarts,
    gaveUp: () => gaveUp,
    stop: async () => {
      stopping = true;
      if (timer !== null) opts.clock.clearTimeout(timer);
      const c = child;
      if (c && c.exitCode === null && c.signalCode === null) {
        c.kill('SIGTERM');
        const kill = opts.clock.setTimeout(() => c.kill('SIGKILL'), 3_000);
        await exited;
        opts.clock.clearTimeout(kill);
      }
    },
  };
}
