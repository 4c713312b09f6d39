// `npm run bench:upstream`: what switchyard costs in front of a model server that batches by itself (`engine: openai`).
// The upstream is a `switchyard serve` of the tiny llama model (llama.cpp, one replica, 4 sequences), started here on
// a loopback port; the front is a `switchyard serve` whose one replica attaches to it (`upstream.url`). The same
// request stream (fixed prompts, a fixed number in flight) goes to the upstream directly and through the front, in
// interleaved rounds (direct, front, front, direct, ...), over HTTP streaming (/v1/completions, SSE) from this process.
// Each round prints its throughput (completion tokens per second) and p99 TTFT both ways; the verdict is the median
// over rounds of the throughput ratio (front / direct) and of the p99 TTFT added. Ends with one JSON line.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureTinyModel } from '../actors/engine/tiny-model.ts';
import { freePort } from '../actors/worker/upstream/server.ts';

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

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Starts `switchyard serve` on `port` with `config`; resolves once /readyz answers 200. */
async function serveOn(config: string, port: number, env: Record<string, string> = {}): Promise<ChildProcess> {
  const p = spawn(process.execPath, ['--import', 'tsx', BIN, 'serve', '--config', config, '--port', String(port)], {
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

interface Run {
  tokens: number;
  seconds: number;
  ttftMs: number[];
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
  return { tokens, seconds: (performance.now() - t0) / 1000, ttftMs };
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
    upstream: { model: tiny, url: 'http://127.0.0.1:${upPort}', health: /readyz, server: switchyard, prompt: text }
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
    procs.push(await serveOn(upConfig, upPort));
    const frontPort = await freePort();
    procs.push(await serveOn(frontConfig, frontPort));
    const direct = `http://127.0.0.1:${upPort}`;
    const front = `http://127.0.0.1:${frontPort}`;
    // Warm both paths (JIT, connections, the engine's first batches).
    await stream(direct, -1);
    await stream(front, -1);
    console.log(
      `${REQUESTS} requests per round, ${INFLIGHT} in flight, ${MAX_TOKENS} tokens each; tiny llama on llama.cpp`,
    );
    const ratios: number[] = [];
    const added: number[] = [];
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
      console.log(
        `round ${r + 1}: direct ${dTput.toFixed(0)} tok/s p99 TTFT ${dP99.toFixed(1)} ms | through switchyard ${fTput.toFixed(0)} tok/s p99 TTFT ${fP99.toFixed(1)} ms | ratio ${(fTput / dTput).toFixed(3)}, added ${(fP99 - dP99).toFixed(1)} ms (p50 TTFT ${median(d.ttftMs).toFixed(1)} / ${median(f.ttftMs).toFixed(1)} ms)`,
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
        pass: throughputRatio >= 0.95 && p99AddedTtftMs <= 5,
      }),
    );
  } finally {
    stop();
  }
}

await main();
