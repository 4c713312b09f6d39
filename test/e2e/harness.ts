// End-to-end harness: runs the real `switchyard serve` command (which spawns the node-agent process) on port 0, parses
// the URLs and tokens it prints, and waits on its probes. Every process started here is killed by `stop()`.
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startNodeProcess, type NodeProcess } from '../../actors/worker/process.ts';

/** The repository root. */
export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const BIN = join(ROOT, 'bin/switchyard.ts');

/** A running `switchyard serve`. */
export interface Served {
  url: string;
  wsUrl: string;
  nodeUrl: string;
  adminToken: string;
  workerToken: string;
  proc: ChildProcess;
  /** Every line printed so far (stdout and stderr). */
  lines: string[];
  /** Pids of the worker processes started so far, in order. */
  workerPids(): number[];
  waitForLine(re: RegExp, timeoutMs?: number): Promise<string>;
  /** GET a path as JSON with its status. */
  get(path: string, token?: string): Promise<{ status: number; body: unknown; headers: Headers }>;
  post(path: string, body: unknown, token?: string): Promise<{ status: number; body: unknown; headers: Headers }>;
  waitReady(model: string, ready?: boolean, timeoutMs?: number): Promise<void>;
  stop(): Promise<void>;
}

/** Writes a config to a temporary file and returns its path. */
export function writeConfig(yaml: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-e2e-'));
  const file = join(dir, 'config.yaml');
  writeFileSync(file, yaml);
  return file;
}

/** Runs a switchyard command to completion; resolves with its exit code and output. */
export function runCommand(
  args: readonly string[],
  env: Record<string, string> = {},
  timeoutMs = 30_000,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, ['--import', 'tsx', BIN, ...args], {
      cwd: ROOT,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const t = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('exit', (code) => {
      clearTimeout(t);
      resolve({ code, stdout, stderr });
    });
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Where and how `serve` starts the server: another folder (a fresh clone's layout), or another command line in
 * front of the serve flags (`npm start --`); such a server runs in a process group of its own, stopped as one. */
export interface ServeHow {
  cwd?: string;
  command?: readonly string[];
}

/** Starts `switchyard serve --port 0 --json <args>` and waits until it prints its URLs. */
export async function serve(
  args: readonly string[],
  env: Record<string, string> = {},
  how: ServeHow = {},
): Promise<Served> {
  const [cmd, ...pre] = how.command ?? [process.execPath, '--import', 'tsx', BIN, 'serve'];
  const proc = spawn(cmd!, [...pre, '--port', '0', '--json', ...args], {
    cwd: how.cwd ?? ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: how.command !== undefined,
  });
  const lines: string[] = [];
  const waiters: { re: RegExp; resolve(l: string): void }[] = [];
  const onLine = (l: string): void => {
    lines.push(l);
    for (const w of [...waiters]) {
      if (w.re.test(l)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(l);
      }
    }
  };
  for (const s of [proc.stdout, proc.stderr]) {
    let rest = '';
    s.on('data', (d: Buffer) => {
      const parts = (rest + d.toString()).split('\n');
      rest = parts.pop() ?? '';
      for (const l of parts) onLine(l);
    });
  }
  const waitForLine = (re: RegExp, timeoutMs = 30_000): Promise<string> => {
    const seen = lines.find((l) => re.test(l));
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const w = { re, resolve: (l: string) => (clearTimeout(t), resolve(l)) };
      const t = setTimeout(() => {
        waiters.splice(waiters.indexOf(w), 1);
        reject(new Error(`no line matching ${re} within ${timeoutMs} ms; output:\n${lines.join('\n')}`));
      }, timeoutMs);
      waiters.push(w);
    });
  };
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const info = JSON.parse(await waitForLine(/^\{"url":/)) as {
    url: string;
    wsUrl: string;
    nodeUrl: string;
    adminToken: string;
    workerToken: string;
  };
  const request = async (
    method: string,
    path: string,
    body: unknown,
    token?: string,
  ): Promise<{ status: number; body: unknown; headers: Headers }> => {
    const res = await fetch(`${info.url}${path}`, {
      method,
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON (metrics)
    }
    return { status: res.status, body: parsed, headers: res.headers };
  };
  const served: Served = {
    ...info,
    proc,
    lines,
    workerPids: () =>
      lines
        .map((l) => /worker +started, pid (\d+)/.exec(l))
        .filter((m) => m !== null)
        .map((m) => Number(m![1])),
    waitForLine,
    get: (path, token) => request('GET', path, undefined, token),
    post: (path, body, token) => request('POST', path, body, token),
    waitReady: async (model, ready = true, timeoutMs = 45_000) => {
      const until = performance.now() + timeoutMs;
      for (;;) {
        const r = await request('GET', '/readyz', undefined).catch(() => null);
        const m = (r?.body as { models?: Record<string, { ready: boolean }> } | undefined)?.models?.[model];
        if (m && m.ready === ready) return;
        if (performance.now() > until)
          throw new Error(
            `${model} not ready=${ready} within ${timeoutMs} ms: ${JSON.stringify(r?.body)}\n${lines.join('\n')}`,
          );
        await sleep(100);
      }
    },
    stop: async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        const group = how.command !== undefined && proc.pid !== undefined;
        const kill = (sig: NodeJS.Signals): void => {
          try {
            if (group) process.kill(-proc.pid!, sig);
            else proc.kill(sig);
          } catch {
            // already gone
          }
        };
        kill('SIGTERM');
        const t = setTimeout(() => kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(t);
      }
      for (const pid of served.workerPids()) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    },
  };
  return served;
}

/** Starts a worker process for an in-process server (`startServer`): eight GPUs whose steps take a fixed 2 ms, run a
 * hundred times faster. */
export function startFastWorker(nodeUrl: string, token: string): NodeProcess {
  return startNodeProcess({
    url: nodeUrl,
    token,
    gpus: [0, 1, 2, 3, 4, 5, 6, 7],
    executor: 'fixed',
    fixedStepMs: 2,
    timeScale: 0.01,
  });
}
