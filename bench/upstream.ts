// `npm run bench:upstream`: what switchyard costs in front of a model server that batches by itself (`engine: openai`).
// The upstream is a `switchyard serve` of the tiny llama model (llama.cpp, one replica, 4 sequences), started here on
// a loopback port; the front is a `switchyard serve` whose one replica attaches to it (`upstream.url`). The same
// request stream (fixed prompts, a fixed number in flight) goes to the upstream directly and through the front, in
// interleaved rounds (direct, front, front, direct, ...), over HTTP streaming (/v1/completions, SSE) from this process.
// Each round prints its throughput (completion tokens per second) and p99 TTFT both ways; the verdict is the median
// over rounds of the throughput ratio (front / direct) and of the p99 TTFT added. Ends with one JSON line.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
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
const ROUNDS = arg('rounds', 5);
const REQUESTS = arg('requests', 48);
const INFLIGHT = arg('inflight', 4);
const MAX_TOKENS = arg('max-tokens', 32);
/** `llama` (default): the upstream is a switchyard serve of the tiny model; `fixture`: the test fixture server, whose
 * steps are timers (it takes next to no CPU), so what remains is the cost of the path itself. */
const UPSTREAM = process.argv.includes('--upstream') ? process.argv[process.argv.indexOf('--upstream') + 1]! : 'llama';
const FIXTURE = join(new URL('..', import.meta.url).pathname, 'test/fixtures/openai-server.ts');

/** CPU ms (user + system) of a process alone, from /proc (0 once it has exited). */
function cpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
  } catch {
    return 0;
  }
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

/** CPU ms of a process and all its descendants. */
function treeCpuMs(pid: number): number {
  return cpuMs(pid) + childrenOf(pid).reduce((a, c) => a + treeCpuMs(c), 0);
}

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

interface Run {
  tokens: number;
  seconds: number;
  ttftMs: number[];
  /** CPU ms of the upstream's processes and of the front's during the run (the front's control plane alone too). */
  upCpuMs: number;
  frontCpuMs: number;
  frontCpCpuMs: number;
}

/** The processes whose CPU each run counts (set once they are started). */
const trees = { up: 0, front: 0 };

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
  const up0 = treeCpuMs(trees.up);
  const front0 = treeCpuMs(trees.front);
  const cp0 = cpuMs(trees.front);
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
    upCpuMs: treeCpuMs(trees.up) - up0,
    frontCpuMs: treeCpuMs(trees.front) - front0,
    frontCpCpuMs: cpuMs(trees.front) - cp0,
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
    // Warm both paths (JIT, connections, the engine's first batches).
    await stream(direct, -1);
    await stream(front, -1);
    console.log(
      `${REQUESTS} requests per round, ${INFLIGHT} in flight, ${MAX_TOKENS} tokens each; upstream: ${UPSTREAM === 'fixture' ? 'the fixture server (timer steps)' : 'tiny llama on llama.cpp'}`,
    );
    const ratios: number[] = [];
    const added: number[] = [];
    const addedP50: number[] = [];
    const frontCpu: number[] = [];
    const upCpuDirect: number[] = [];
    const upCpuThrough: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      // Interleaved, alternating which goes first: drift on the shared machine falls on both.
      const order = r % 2 === 0 ? [direct, front] : [front, direct];
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
      frontCpu.push(f.frontCpuMs / f.tokens);
      upCpuDirect.push(d.upCpuMs / d.tokens);
      upCpuThrough.push(f.upCpuMs / f.tokens);
      console.log(
        `round ${r + 1}: direct ${dTput.toFixed(0)} tok/s p99 TTFT ${dP99.toFixed(1)} ms | through switchyard ${fTput.toFixed(0)} tok/s p99 TTFT ${fP99.toFixed(1)} ms | ratio ${(fTput / dTput).toFixed(3)}, added ${(fP99 - dP99).toFixed(1)} ms (p50 TTFT ${median(d.ttftMs).toFixed(1)} / ${median(f.ttftMs).toFixed(1)} ms)`,
      );
      console.log(
        `  CPU per output token: upstream ${(d.upCpuMs / d.tokens).toFixed(3)} ms direct, ${(f.upCpuMs / f.tokens).toFixed(3)} ms through; front ${(f.frontCpuMs / f.tokens).toFixed(3)} ms (control plane ${(f.frontCpCpuMs / f.tokens).toFixed(3)}, worker ${((f.frontCpuMs - f.frontCpCpuMs) / f.tokens).toFixed(3)}; ${((f.frontCpuMs / 1000 / f.seconds) * 100).toFixed(0)} % of a core)`,
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
        frontCpuMsPerToken: Number(median(frontCpu).toFixed(4)),
        upstreamCpuMsPerToken: {
          direct: Number(median(upCpuDirect).toFixed(4)),
          through: Number(median(upCpuThrough).toFixed(4)),
        },
        upstream: UPSTREAM,
        pass: throughputRatio >= 0.95 && p99AddedTtftMs <= 5,
      }),
    );
  } finally {
    stop();
  }
}

await main();
