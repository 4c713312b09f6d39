// A control-plane restart with real processes: `switchyard serve --no-worker` and a separate `switchyard node-agent`
// (as in a deployment where they are separate containers). The control plane is killed with SIGKILL while its replicas
// are loaded and a request streams; a new one starts on the same port, config and state file; the worker registers
// again. Measures the time from the new control plane listening to /readyz ready, and the worker's loads (its own
// counter, reported in its heartbeats) before and after. Used by `npm run bench:placement` and the e2e test.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const BIN = join(ROOT, 'bin/switchyard.ts');

/** What one restart showed. */
export interface RestartRun {
  /** From the new control plane printing its URLs (listening) to /readyz answering ready. */
  restartReadyS: number;
  /** Loads the worker ran after the kill (its load counter after minus before): 0 when everything was adopted. */
  reloadsAfterRestart: number;
  loadsBefore: number;
  /** Replica ids and epochs before the kill and once ready again. */
  replicasBefore: string[];
  replicasAfter: string[];
  /** The stream open during the kill ended with the dropped connection, not a hang; then a new request streamed. */
  streamCut: boolean;
  newRequestTokens: number;
  workerPidSame: boolean;
  /** What the new control plane's placement logged about adoption. */
  adoption: string[];
  /** The routing policy set through the admin API before the kill, as the new control plane restored it. */
  routingAfter: string;
}

/** The config of the run: eight 1-GPU replicas of the small model, fixed (exclusive) placement. */
export const RESTART_CONFIG = `name: restart
seed: 1
node: { gpu: H100-SXM, gpus: 8 }
placement: { policy: exclusive }
detection: { heartbeatMs: 200, missedHeartbeats: 5 }
models:
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 8
    classes:
      interactive: { ttftMs: 2000, tpotMs: 100, maxQueueMs: 60000 }
`;

interface Proc {
  p: ChildProcess;
  lines: string[];
  waitLine(re: RegExp, ms: number): Promise<string>;
}

function start(args: string[], env: Record<string, string>): Proc {
  const p = spawn(process.execPath, ['--import', 'tsx', BIN, ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: string[] = [];
  for (const s of [p.stdout, p.stderr]) {
    let rest = '';
    s?.on('data', (d: Buffer) => {
      const parts = (rest + d.toString()).split('\n');
      rest = parts.pop() ?? '';
      lines.push(...parts);
    });
  }
  const waitLine = async (re: RegExp, ms: number): Promise<string> => {
    const end = performance.now() + ms;
    for (;;) {
      const l = lines.find((x) => re.test(x));
      if (l) return l;
      if (performance.now() > end || p.exitCode !== null)
        throw new Error(`no line matching ${re}; output:\n${lines.join('\n')}`);
      await sleep(10);
    }
  };
  return { p, lines, waitLine };
}

const exited = (p: ChildProcess): Promise<void> =>
  p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise((r) => p.once('exit', () => r()));

/** Runs one restart; every process it started is gone when it resolves or throws. */
export async function runRestart(opts: { timeScale?: number; log?(line: string): void } = {}): Promise<RestartRun> {
  const log = opts.log ?? (() => {});
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-restart-'));
  const config = join(dir, 'config.yaml');
  writeFileSync(config, RESTART_CONFIG);
  const admin = 'admin-token-restart-0123456789';
  const worker = 'worker-token-restart-0123456789';
  const scale = String(opts.timeScale ?? 0.05);
  const serveArgs = (port: number): string[] => [
    'serve',
    '--config',
    config,
    '--port',
    String(port),
    '--json',
    '--no-worker',
    '--time-scale',
    scale,
    '--state-file',
    join(dir, 'state.json'),
  ];
  const env = { SWITCHYARD_ADMIN_TOKEN: admin, SWITCHYARD_WORKER_TOKEN: worker };
  const procs: Proc[] = [];
  try {
    const cp1 = start(serveArgs(0), env);
    procs.push(cp1);
    const info = JSON.parse(await cp1.waitLine(/^\{"url":/, 60_000)) as { url: string; nodeUrl: string; port: number };
    const node = start(['node-agent', '--url', info.nodeUrl, '--time-scale', scale, '--max-backoff-ms', '200'], {
      SWITCHYARD_WORKER_TOKEN: worker,
    });
    procs.push(node);
    const api = client(info.url, admin);
    await api.waitReady(60_000);
    const before = await api.status();
    const loadsBefore = await api.loadsWhen((n) => n >= 8, 10_000);
    log(`ready before the kill: ${before.replicas.join(' ')}; worker loads ${loadsBefore}`);
    // An admin change before the kill: the state file must carry it to the new control plane.
    await api.post('/admin/routing', { policy: 'round-robin' });
    const stream = api.stream(400);
    await sleep(300);
    cp1.p.kill('SIGKILL');
    await exited(cp1.p);
    const streamCut = await stream.then((r) => !r.finished);
    log(`control plane killed (SIGKILL); the open stream ${streamCut ? 'was cut' : 'had finished'}`);

    const cp2 = start(serveArgs(info.port), env);
    procs.push(cp2);
    await cp2.waitLine(/^\{"url":/, 60_000);
    const t0 = performance.now();
    await api.waitReady(60_000, 5);
    const restartReadyS = Math.round(performance.now() - t0) / 1000;
    const after = await api.status();
    const loadsAfter = await api.loadsWhen(() => true, 10_000);
    const req = await api.stream(8);
    return {
      restartReadyS,
      reloadsAfterRestart: loadsAfter - loadsBefore,
      loadsBefore,
      replicasBefore: before.replicas,
      replicasAfter: after.replicas,
      streamCut,
      newRequestTokens: req.tokens,
      workerPidSame: node.p.exitCode === null,
      adoption: after.events,
      routingAfter: after.routing,
    };
  } finally {
    for (const pr of procs.reverse()) {
      if (pr.p.exitCode === null && pr.p.signalCode === null) pr.p.kill('SIGTERM');
      const t = setTimeout(() => pr.p.kill('SIGKILL'), 5_000);
      await exited(pr.p);
      clearTimeout(t);
    }
  }
}

/** The HTTP calls the run makes. */
function client(url: string, admin: string) {
  const get = async (path: string): Promise<{ status: number; body: Record<string, unknown> }> => {
    const r = await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${admin}` } });
    return { status: r.status, body: (await r.json()) as Record<string, unknown> };
  };
  const status = async (): Promise<{ replicas: string[]; loads: number | null; events: string[]; routing: string }> => {
    const b = (await get('/admin/status')).body as {
      routing: { policy: string };
      node: { loads: number | null };
      replicas: { id: string; epoch: number; state: string }[];
      placement: { events: { kind: string; replica?: string; gpu?: number; detail?: string }[] };
    };
    return {
      routing: b.routing.policy,
      replicas: b.replicas.map((r) => `${r.id}@${r.epoch}`).sort(),
      loads: b.node.loads,
      events: b.placement.events
        .filter((e) => e.kind === 'replica.adopted' || e.kind === 'gpu.reclaimed' || e.kind === 'mode.forced')
        .map((e) => `${e.kind} ${e.replica ?? e.gpu ?? ''}`),
    };
  };
  return {
    status,
    post: async (path: string, body: unknown): Promise<number> => {
      const r = await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${admin}` },
        body: JSON.stringify(body),
      });
      await r.text();
      return r.status;
    },
    waitReady: async (ms: number, pollMs = 50): Promise<void> => {
      const end = performance.now() + ms;
      for (;;) {
        const r = await get('/readyz').catch(() => null);
        if (r?.status === 200 && r.body['ready'] === true) return;
        if (performance.now() > end) throw new Error(`not ready within ${ms} ms: ${JSON.stringify(r?.body)}`);
        await sleep(pollMs);
      }
    },
    loadsWhen: async (ok: (n: number) => boolean, ms: number): Promise<number> => {
      const end = performance.now() + ms;
      for (;;) {
        const n = (await status()).loads;
        if (n !== null && ok(n)) return n;
        if (performance.now() > end) throw new Error(`the worker's load counter read ${n}`);
        await sleep(50);
      }
    },
    /** A streamed completion; resolves with the tokens received and whether it finished (or was cut). */
    stream: async (maxTokens: number): Promise<{ tokens: number; finished: boolean }> => {
      let tokens = 0;
      let finished = false;
      try {
        const r = await fetch(`${url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'llama-3-8b', prompt: 'hello', max_tokens: maxTokens, stream: true }),
        });
        const reader = r.body!.getReader();
        const dec = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          for (const line of dec.decode(value).split('\n')) {
            if (line === 'data: [DONE]') finished = true;
            else if (line.startsWith('data: ') && line.includes('"text"')) tokens++;
          }
        }
      } catch {
        // the connection dropped with the control plane
      }
      return { tokens, finished };
    },
  };
}
