// An upstream model server the worker starts for one replica: the config's command template with `{port}`, `{gpus}`
// and `{model}` filled in, on exactly the replica's GPUs, in a process group of its own (so a kill reaches whatever it
// starts), with its stdout and stderr kept in a bounded ring of lines.
//
// The command is the operator's (config), but it arrives over the node link: the worker runs only executables its
// own environment allows (SWITCHYARD_UPSTREAM_COMMANDS, a `:`-separated list of names or absolute paths).
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { hostEnvironment } from '../../engine/host-env.ts';

/** The worker's allow-list of upstream executables (empty: no command may be started). */
export const UPSTREAM_COMMANDS_ENV = 'SWITCHYARD_UPSTREAM_COMMANDS';

/** Why the worker refuses to run `argv0`, or null when its allow-list names it. */
export function commandRefusal(argv0: string, env: NodeJS.ProcessEnv = process.env): string | null {
  const allowed = (env[UPSTREAM_COMMANDS_ENV] ?? '').split(':').filter((s) => s !== '');
  if (allowed.includes(argv0)) return null;
  return `the worker does not run ${JSON.stringify(argv0.slice(0, 200))}: add it to ${UPSTREAM_COMMANDS_ENV} in the worker's environment`;
}

/** A free TCP port on loopback (asked of the kernel, then released for the server to take). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => (port > 0 ? resolve(port) : reject(new Error('no port'))));
    });
  });
}

/** The command with its placeholders filled in. */
export function fillCommand(
  argv: readonly string[],
  v: { port: number; gpus: readonly number[]; model: string },
): string[] {
  return argv.map((a) =>
    a.replaceAll('{port}', String(v.port)).replaceAll('{gpus}', v.gpus.join(',')).replaceAll('{model}', v.model),
  );
}

/** A bounded ring of log lines. */
export interface LogRing {
  push(line: string): void;
  lines(): string[];
}

/** A ring keeping the last `max` lines, each cut at 2000 characters. */
export function createLogRing(max: number): LogRing {
  const ring: string[] = [];
  let next = 0;
  return {
    push: (line) => {
      const l = line.length > 2000 ? `${line.slice(0, 2000)}…` : line;
      if (ring.length < max) ring.push(l);
      else ring[next] = l;
      next = (next + 1) % max;
    },
    lines: () => (ring.length < max ? [...ring] : [...ring.slice(next), ...ring.slice(0, next)]),
  };
}

/** A started server process. */
export interface ServerProcess {
  readonly pid: number | undefined;
  readonly log: LogRing;
  /** Sends `signal` to the server's whole process group. */
  signal(signal: NodeJS.Signals): void;
}

/** Starts `argv` on `gpus` in its own process group; `exited` hears its exit (code or signal), once. */
export function startServerProcess(o: {
  argv: readonly string[];
  cwd?: string | undefined;
  env?: Partial<Record<string, string>> | undefined;
  gpus: readonly number[];
  logLines: number;
  exited(code: number | null, signal: NodeJS.Signals | null): void;
}): ServerProcess {
  const visible = o.gpus.join(',');
  const env: Record<string, string> = { ...hostEnvironment(process.env) };
  for (const [k, v] of Object.entries(o.env ?? {})) if (v !== undefined) env[k] = v;
  // Exactly the replica's GPUs, whatever the config's env says.
  env['CUDA_VISIBLE_DEVICES'] = visible;
  env['HIP_VISIBLE_DEVICES'] = visible;
  env['GGML_VK_VISIBLE_DEVICES'] = visible;
  const log = createLogRing(o.logLines);
  const child: ChildProcess = spawn(o.argv[0]!, o.argv.slice(1), {
    cwd: o.cwd,
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  for (const s of [child.stdout, child.stderr]) {
    let rest = '';
    s?.setEncoding('utf8');
    s?.on('data', (d: string) => {
      const parts = (rest + d).split('\n');
      rest = parts.pop() ?? '';
      if (rest.length > 8192) {
        parts.push(rest);
        rest = '';
      }
      for (const l of parts) log.push(l);
    });
  }
  let gone = false;
  const exit = (code: number | null, signal: NodeJS.Signals | null): void => {
    if (gone) return;
    gone = true;
    o.exited(code, signal);
  };
  child.on('exit', exit);
  child.on('error', (e) => {
    log.push(`spawn failed: ${e.message}`);
    exit(null, null);
  });
  return {
    pid: child.pid,
    log,
    signal: (sig) => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, sig);
      } catch {
        try {
          child.kill(sig);
        } catch {
          // gone already
        }
      }
    },
  };
}
