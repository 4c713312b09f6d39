// `npm run bench:upstream`: what switchyard costs in front of a model server that batches by itself (`engine: openai`).
// The upstream is a `switchyard serve` of the tiny llama model (llama.cpp, one replica, 4 sequences), started here on
// a loopback port; the front is a `switchyard serve` whose one replica attaches to it (`upstream.url`). The same
// request stream (fixed prompts, a fixed number in flight) goes to the upstream directly and through the front, in
// interleaved rounds (direct, front, front, direct, ...), over HTTP streaming (/v1/completions, SSE) from this process.
// Each round prints its throughput (completion tokens per second) and p99 TTFT both ways; the verdict is the median
// over rounds of the throughput ratio (front / direct) and of the p99 TTFT added. Ends with one JSON line.
//
// Where the time goes: each round also prints, per request, the CPU each process used and the time it spent runnable
// but waiting for a core (/proc schedstat: the upstream's processes, the front's control plane and its worker, this
// client). `--relay` adds a third path through a bare node:http pass-through proxy, the floor any relay in Node
// reaches on the machine. `--upstream fixture` replaces the llama.cpp upstream with the fixture server (timer steps).
// `--quick`: 3 rounds of 24 requests; `--rounds`, `--requests`, `--inflight`, `--max-tokens` set them one by one.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureTinyModel } from '../actors/engine/tiny-model.ts';
import { freePort } from '../actors/worker/upstream/server.ts';
import { cpuProfileArgs } from '../runtime/cpu-profile.ts';

const ROOT = new URL('..', import.meta.url).pathname;
const BIN = join(ROOT, 'bin/switchyard.ts');
const arg = (name: string, dflt: number): number => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
/** `--quick`: 3 rounds of 24 requests (the default is 5 of 48). */
const QUICK = process.argv.includes('--quick');
const ROUNDS = arg('rounds', QUICK ? 3 : 5);
const REQUESTS = arg('requests', QUICK ? 24 : 48);
const INFLIGHT = arg('inflight', 4);
const MAX_TOKENS = arg('max-tokens', 32);
/** `llama` (default): the upstream is a switchyard serve of the tiny model; `fixture`: the test fixture server, whose
 * steps are timers (it takes next to no CPU), so what remains is the cost of the path itself. */
const UPSTREAM = process.argv.includes('--upstream') ? process.argv[process.argv.indexOf('--upstream') + 1]! : 'llama';
/** `--relay`: a third path through a bare pass-through proxy (see RELAY), interleaved with the other two. */
const WITH_RELAY = process.argv.includes('--relay');
const FIXTURE = join(new URL('..', import.meta.url).pathname, 'test/fixtures/openai-server.ts');

/** CPU time and time spent runnable but waiting for a core (ms), of one process or a tree of them. */
interface Sched {
  cpuMs: number;
  waitMs: number;
}

/** A process's CPU and run-queue wait, summed over its threads (from /proc/<pid>/task/<tid>/schedstat: ns on a
 * core, ns waiting on a run queue); zeros once it has exited. */
function schedOf(pid: number): Sched {
  const out = { cpuMs: 0, waitMs: 0 };
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tids) {
    try {
      const [run, wait] = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ').map(Number);
      out.cpuMs += run! / 1e6;
      out.waitMs += wait! / 1e6;
    } catch {
      // the thread ended
    }
  }
  return out;
}

/** The children of a process. */
function childrenOf(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8')
      .split(' ')
      .filter((t) => t.trim() !== '')
      .map(Number);
  } catch {
    return [];
  }
}

/** The CPU and run-queue wait of a process and all its descendants. */
function treeSched(pid: number): Sched {
  const own = schedOf(pid);
  for (const c of childrenOf(pid)) {
    const t = treeSched(c);
    own.cpuMs += t.cpuMs;
    own.waitMs += t.waitMs;
  }
  return own;
}

const minus = (a: Sched, b: Sched): Sched => ({ cpuMs: a.cpuMs - b.cpuMs, waitMs: a.waitMs - b.waitMs });

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Starts `switchyard serve` on `port` with `config`; resolves once /readyz answers 200. */
async function serveOn(config: string, port: number, env: Record<string, string> = {}): Promise<ChildProcess> {
  // SWITCHYARD_CPU_PROF_DIR: the front's and the upstream's processes write CPU profiles there when they exit.
  const argv = [...cpuProfileArgs(), '--import', 'tsx', BIN, 'serve', '--config', config, '--port', String(port)];
  const p = spawn(process.execPath, argv, {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
    detached: true,
  });
  const end = performance.now() + 180_000;
  for (;;) {
    const ok = await fetch(`http://127.0.0.1:${port}/readyz`)
      .then((r) => r.status === 200)
      .catch(() => false);
    if (ok) return p;
    if (p.exitCode !== null || performance.now() > end) throw new Error(`serve on ${port} did not become ready`);
    await sleep(200);
  }
}

/** Starts the fixture server on `port` (model `tiny`); resolves once /health answers 200. */
async function fixtureOn(port: number): Promise<ChildProcess> {
  const p = spawn(process.execPath, ['--import', 'tsx', FIXTURE, '--port', String(port), '--model', 'tiny'], {
    cwd: ROOT,
    stdio: ['ignore', 'ignore', 'inherit'],
    detached: true,
  });
  const end = performance.now() + 60_000;
  for (;;) {
    const ok = await fetch(`http://127.0.0.1:${port}/health`)
      .then((r) => r.status === 200)
      .catch(() => false);
    if (ok) return p;
    if (p.exitCode !== null || performance.now() > end) throw new Error(`the fixture on ${port} did not start`);
    await sleep(100);
  }
}

/** A bare pass-through proxy (node:http server → node:http client with keep-alive, the response piped back): no
 * parsing, no routing, no second process. What any relay in Node costs on this machine, the floor for the front. */
const RELAY = `
import { createServer, request, Agent } from 'node:http';
const [up, port] = [process.env.RELAY_UP, Number(process.env.RELAY_PORT)];
const agent = new Agent({ keepAlive: true, maxSockets: 64 });
createServer((req, res) => {
  const out = request(up + req.url, { method: req.method, headers: req.headers, agent }, (r) => {
    res.writeHead(r.statusCode, r.headers);
    r.pipe(res);
  });
  out.on('error', () => res.destroy());
  req.pipe(out);
}).listen(port, '127.0.0.1');
`;

/** Starts the bare relay on `port` in front of `up`; resolves once it forwards /health or /readyz. */
async function relayOn(port: number, up: string, health: string): Promise<ChildProcess> {
  const p = spawn(process.execPath, ['--input-type=module', '-e', RELAY], {
    cwd: ROOT,
    env: { ...process.env, RELAY_UP: up, RELAY_PORT: String(port) },
    stdio: ['ignore', 'ignore', 'inherit'],
    detached: true,
  });
  const end = performance.now() + 30_000;
  for (;;) {
    const ok = await fetch(`http://127.0.0.1:${port}${health}`)
      .then((r) => r.status === 200)
      .catch(() => false);
    if (ok) return p;
    if (p.exitCode !== null || performance.now() > end) throw new Error(`the relay on ${port} did not start`);
    await sleep(100);
  }
}

interface Run {
  tokens: number;
  seconds: number;
  ttftMs: number[];
  /** CPU and run-queue wait during the run: the upstream's processes, the front's control plane and its worker (its
   * children), and this process (the client). */
  up: Sched;
  frontCp: Sched;
  frontWorker: Sched;
  relay: Sched;
  client: Sched;
}

/** The processes whose CPU each run counts (set once they are started). */
const trees = { up: 0, front: 0, relay: 0 };

/** Where each run's CPU and waits are read: every process of both paths, at once. */
function schedNow(): { up: Sched; frontCp: Sched; frontWorker: Sched; relay: Sched; client: Sched } {
  const frontCp = schedOf(trees.front);
  return {
    up: treeSched(trees.up),
    frontCp,
    frontWorker: minus(treeSched(trees.front), frontCp),
    relay: schedOf(trees.relay),
    client: schedOf(process.pid),
  };
}

/** One streamed request: its TTFT (first chunk with text) and completion tokens. */
async function one(base: string, prompt: string): Promise<{ ttftMs: number; tokens: number }> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'tiny',
      prompt,
      max_tokens: MAX_TOKENS,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (res.status !== 200 || !res.body) throw new Error(`${base}: ${res.status} ${await res.text()}`);
  let ttft = -1;
  let tokens = 0;
  let rest = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body) {
    rest += decoder.decode(chunk as Uint8Array, { stream: true });
    const events = rest.split('\n\n');
    rest = events.pop() ?? '';
    for (const e of events) {
      const data = e.startsWith('data: ') ? e.slice(6) : '';
      if (data === '' || data === '[DONE]') continue;
      const v = JSON.parse(data) as { choices: { text: string }[]; usage?: { completion_tokens: number } };
      if (ttft < 0 && (v.choices[0]?.text ?? '') !== '') ttft = performance.now() - t0;
      if (v.usage) tokens = v.usage.completion_tokens;
    }
  }
  return { ttftMs: ttft, tokens };
}

/** The request stream: REQUESTS prompts, INFLIGHT at a time. */
async function stream(base: string, round: number): Promise<Run> {
  const prompts = Array.from({ length: REQUESTS }, (_, i) => `Request ${i} of round ${round}: the yard`);
  const ttftMs: number[] = [];
  let tokens = 0;
  let next = 0;
  const s0 = schedNow();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: INFLIGHT }, async () => {
      while (next < prompts.length) {
        const r = await one(base, prompts[next++]!);
        ttftMs.push(r.ttftMs);
        tokens += r.tokens;
      }
    }),
  );
  return {
    tokens,
    seconds: (performance.now() - t0) / 1000,
    ttftMs,
    ...(() => {
      const s1 = schedNow();
      return {
        up: minus(s1.up, s0.up),
        frontCp: minus(s1.frontCp, s0.frontCp),
        frontWorker: minus(s1.frontWorker, s0.frontWorker),
        relay: minus(s1.relay, s0.relay),
        client: minus(s1.client, s0.client),
      };
    })(),
  };
}

const quantile = (xs: readonly number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]!;
};
const median = (xs: readonly number[]): number => quantile(xs, 0.5);

async function main(): Promise<void> {
  const file = join(ROOT, '.cache/models/tiny.gguf');
  await ensureTinyModel(file);
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-bench-upstream-'));
  const upPort = await freePort();
  const upConfig = join(dir, 'upstream.yaml');
  writeFileSync(
    upConfig,
    `name: upstream
node: { gpu: H100-SXM, gpus: 1 }
placement: { policy: exclusive }
models:
  - { name: tiny, profile: llama-3-8b, replicas: 1, engine: llama.cpp, file: ${file}, threads: 1, contextTokens: 512,
      sequences: ${INFLIGHT}, batching: { tokenBudget: 256 }, classes: { interactive: { maxQueueMs: 120000 } } }
`,
  );
  const frontConfig = join(dir, 'front.yaml');
  writeFileSync(
    frontConfig,
    `name: front
node: { gpu: H100-SXM, gpus: 1 }
placement: { policy: exclusive }
detection: { heartbeatMs: 1000, missedHeartbeats: 5 }
models:
  - name: tiny
    profile: llama-3-8b
    replicas: 1
    engine: openai
    file: ${file}
    contextTokens: 511
    sequences: ${INFLIGHT}
    batching: { tokenBudget: 256 }
    classes: { interactive: { maxQueueMs: 120000 } }
    upstream: ${
      UPSTREAM === 'fixture'
        ? `{ model: tiny, url: 'http://127.0.0.1:${upPort}', server: vllm, prompt: ids, tokenIds: true }`
        : `{ model: tiny, url: 'http://127.0.0.1:${upPort}', health: /readyz, server: switchyard, prompt: text }`
    }
`,
  );
  const procs: ChildProcess[] = [];
  const stop = (): void => {
    for (const p of procs) {
      try {
        process.kill(-p.pid!, 'SIGTERM');
      } catch {
        // gone
      }
    }
  };
  process.on('exit', stop);
  try {
    procs.push(UPSTREAM === 'fixture' ? await fixtureOn(upPort) : await serveOn(upConfig, upPort));
    trees.up = procs[0]!.pid!;
    const frontPort = await freePort();
    procs.push(await serveOn(frontConfig, frontPort));
    trees.front = procs[1]!.pid!;
    const direct = `http://127.0.0.1:${upPort}`;
    const front = `http://127.0.0.1:${frontPort}`;
    let relay = '';
    if (WITH_RELAY) {
      const relayPort = await freePort();
      procs.push(await relayOn(relayPort, direct, UPSTREAM === 'fixture' ? '/health' : '/readyz'));
      trees.relay = procs[2]!.pid!;
      relay = `http://127.0.0.1:${relayPort}`;
    }
    const paths = relay ? [direct, front, relay] : [direct, front];
    // Warm every path (JIT, connections, the engine's first batches).
    for (const base of paths) await stream(base, -1);
    console.log(
      `${REQUESTS} requests per round, ${INFLIGHT} in flight, ${MAX_TOKENS} tokens each; upstream: ${UPSTREAM === 'fixture' ? 'the fixture server (timer steps)' : 'tiny llama on llama.cpp'}`,
    );
    const ratios: number[] = [];
    const added: number[] = [];
    const addedP50: number[] = [];
    const relayRatios: number[] = [];
    const relayAdded: number[] = [];
    // Per round: each process's CPU and run-queue wait per request (ms), by path.
    const perReq = new Map<string, { cpu: number[]; wait: number[] }>();
    const note = (name: string, x: Sched, requests: number): void => {
      let e = perReq.get(name);
      if (!e) perReq.set(name, (e = { cpu: [], wait: [] }));
      e.cpu.push(x.cpuMs / requests);
      e.wait.push(x.waitMs / requests);
    };
    const shown = (x: Sched, n: number): string => `${(x.cpuMs / n).toFixed(2)}/${(x.waitMs / n).toFixed(2)}`;
    for (let r = 0; r < ROUNDS; r++) {
      // Interleaved, alternating which goes first: drift on the shared machine falls on both.
      const order = r % 2 === 0 ? paths : [...paths].reverse();
      const runs = new Map<string, Run>();
      for (const base of order) runs.set(base, await stream(base, r));
      const d = runs.get(direct)!;
      const f = runs.get(front)!;
      const dTput = d.tokens / d.seconds;
      const fTput = f.tokens / f.seconds;
      const dP99 = quantile(d.ttftMs, 0.99);
      const fP99 = quantile(f.ttftMs, 0.99);
      ratios.push(fTput / dTput);
      added.push(fP99 - dP99);
      addedP50.push(median(f.ttftMs) - median(d.ttftMs));
      note('upstream direct', d.up, REQUESTS);
      note('upstream through', f.up, REQUESTS);
      note('front control plane', f.frontCp, REQUESTS);
      note('front worker', f.frontWorker, REQUESTS);
      note('client direct', d.client, REQUESTS);
      note('client through', f.client, REQUESTS);
      console.log(
        `round ${r + 1}: direct ${dTput.toFixed(0)} tok/s p99 TTFT ${dP99.toFixed(1)} ms | through switchyard ${fTput.toFixed(0)} tok/s p99 TTFT ${fP99.toFixed(1)} ms | ratio ${(fTput / dTput).toFixed(3)}, added ${(fP99 - dP99).toFixed(1)} ms (p50 TTFT ${median(d.ttftMs).toFixed(1)} / ${median(f.ttftMs).toFixed(1)} ms; ${(d.tokens / REQUESTS).toFixed(1)} / ${(f.tokens / REQUESTS).toFixed(1)} tokens per request)`,
      );
      const n = REQUESTS;
      const b = relay ? runs.get(relay)! : null;
      if (b) {
        const bTput = b.tokens / b.seconds;
        const bP99 = quantile(b.ttftMs, 0.99);
        relayRatios.push(bTput / dTput);
        relayAdded.push(bP99 - dP99);
        note('relay', b.relay, REQUESTS);
        note('upstream relayed', b.up, REQUESTS);
        note('client relayed', b.client, REQUESTS);
        console.log(
          `  bare relay: ${bTput.toFixed(0)} tok/s p99 TTFT ${bP99.toFixed(1)} ms | ratio ${(bTput / dTput).toFixed(3)}, added ${(bP99 - dP99).toFixed(1)} ms (p50 TTFT ${median(b.ttftMs).toFixed(1)} ms); per request CPU/waiting: relay ${shown(b.relay, n)}, upstream ${shown(b.up, n)}, client ${shown(b.client, n)}`,
        );
      }
      console.log(
        `  per request, CPU/waiting for a core (ms): upstream ${shown(d.up, n)} direct, ${shown(f.up, n)} through; front control plane ${shown(f.frontCp, n)}, worker ${shown(f.frontWorker, n)}; client ${shown(d.client, n)} direct, ${shown(f.client, n)} through; front ${(((f.frontCp.cpuMs + f.frontWorker.cpuMs) / 1000 / f.seconds) * 100).toFixed(0)} % of a core`,
      );
    }
    const throughputRatio = median(ratios);
    const p99AddedTtftMs = median(added);
    console.log(
      JSON.stringify({
        bench: 'upstream',
        rounds: ROUNDS,
        requests: REQUESTS,
        inflight: INFLIGHT,
        maxTokens: MAX_TOKENS,
        throughputRatio: Number(throughputRatio.toFixed(4)),
        p99AddedTtftMs: Number(p99AddedTtftMs.toFixed(2)),
        p50AddedTtftMs: Number(median(addedP50).toFixed(2)),
        perRequestMs: Object.fromEntries(
          [...perReq].map(([k, v]) => [
            k,
            { cpu: Number(median(v.cpu).toFixed(3)), wait: Number(median(v.wait).toFixed(3)) },
          ]),
        ),
        ...(relay
          ? {
              relay: {
                throughputRatio: Number(median(relayRatios).toFixed(4)),
                p99AddedTtftMs: Number(median(relayAdded).toFixed(2)),
              },
            }
          : {}),
        upstream: UPSTREAM,
        pass: throughputRatio >= 0.95 && p99AddedTtftMs <= 5,
      }),
    );
  } finally {
    stop();
  }
}

await main();
