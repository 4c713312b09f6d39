// `npm run bench:live`: live serving overhead over loopback. A load generator in its own process drives first a bare
// two-hop ws+msgpack relay (bench/live-relay.ts), then `switchyard serve` with the zero-cost executor, and measures
// streamed tokens/s (closed loop), TTFT and TBT at 1,000 req/s (open loop; with a zero-cost executor every millisecond
// of them is switchyard's own; the added TTFT is switchyard's p99 minus the relay's p99 in the same run, each over
// three rounds that alternate between the two, so that drift in the machine's load hits both alike), completed
// streaming requests/s of the OpenAI endpoint against a bare node:http SSE server streaming the same 16 tokens
// (bench/live-http.ts; one closed-loop HTTP load generator for both, alternated in the same run), and 10,000
// concurrent open streams with the server's memory per stream.
// Prints a table and ends with one JSON line. Subcommands relay-server, relay-worker, loadgen, http-bare and
// http-loadgen run the other processes. `--quick` (CI) takes shorter windows under the same loads.
import { spawn, type ChildProcess } from 'node:child_process';
import { cpuProfileArgs } from '../runtime/cpu-profile.ts';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createWallClock } from '../runtime/clock.ts';
import { percentile, runLoadgen, type LoadSpec } from './live-loadgen.ts';
import { runRelayServer, runRelayWorker } from './live-relay.ts';
import { runHttpBare, runHttpLoadgen, type HttpLoadSpec } from './live-http.ts';
import { stopProcess } from './lib/serve-process.ts';
import { quick } from './lib/data.ts';

const SELF = fileURLToPath(import.meta.url);
const BIN = fileURLToPath(new URL('../bin/switchyard.ts', import.meta.url));
const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => clock.setTimeout(r, ms));

/** Figures of the run (the final JSON line). */
interface Figures {
  relayRatio: number;
  httpRatio: number;
  /** Median over the latency rounds of switchyard's p99 TTFT minus the relay's in the same round. */
  p99AddedTtftMs: number;
  p99AddedTtftMsRounds: number[];
  p99AddedTbtMs: number;
  concurrentStreams: number;
  bytesPerStream: number;
  [k: string]: number | boolean | number[];
}

// Eight single-GPU replicas of the small model with room for thousands of sequences each (the executor is zero-cost,
// so KV is nominal), and queue budgets that never shed. Routing spreads by least requests: this measures serving
// overhead, and the cost policy's predictions (in model time) do not describe a zero-cost executor.
const CONFIG = `
name: bench-live
node: { gpu: H100-SXM, gpus: 8 }
routing: { policy: least-requests }
detection: { heartbeatMs: 1000, missedHeartbeats: 5 }
models:
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 8
    batching: { policy: chunked, maxRunning: 4096, tokenBudget: 16384, kvBlocks: 4000000 }
    classes:
      interactive: { maxQueueMs: 600000, maxQueued: 100000, maxQueuedTokens: 100000000 }
`;

interface Proc {
  proc: ChildProcess;
  lines: string[];
  next(re: RegExp, timeoutMs?: number): Promise<string>;
  stop(): Promise<void>;
}

function run(args: readonly string[], input = false): Proc {
  const proc = spawn(process.execPath, [...cpuProfileArgs(), '--import', 'tsx', ...args], {
    stdio: [input ? 'pipe' : 'ignore', 'pipe', 'pipe'],
  });
  const lines: string[] = [];
  const waiters: { re: RegExp; from: number; resolve(l: string): void }[] = [];
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
    s?.on('data', (d: Buffer) => {
      const parts = (rest + d.toString()).split('\n');
      rest = parts.pop() ?? '';
      parts.forEach(onLine);
    });
  }
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  let seen = 0;
  return {
    proc,
    lines,
    next: (re, timeoutMs = 120_000) => {
      const i = lines.findIndex((l, k) => k >= seen && re.test(l));
      if (i >= 0) {
        seen = i + 1;
        return Promise.resolve(lines[i]!);
      }
      return new Promise((resolve, reject) => {
        const t = clock.setTimeout(
          () => reject(new Error(`no ${re} from ${args.join(' ')}:\n${lines.slice(-20).join('\n')}`)),
          timeoutMs,
        );
        waiters.push({
          re,
          from: seen,
          resolve: (l) => {
            clock.clearTimeout(t);
            seen = lines.length;
            resolve(l);
          },
        });
      });
    },
    stop: () => stopProcess(proc, exited),
  };
}

async function loadgen(spec: LoadSpec): Promise<Record<string, number>> {
  // Numeric figures, plus firstFailure (a string) when something was refused.
  const p = run([SELF, 'loadgen', JSON.stringify(spec)]);
  const line = await p.next(/^\{/, 180_000);
  await p.stop();
  return JSON.parse(line) as Record<string, number>;
}

/** Rounded to the microsecond (figures in ms) or to three decimals (ratios). */
const r3 = (x: number): number => Math.round(x * 1000) / 1000;

/** Latency figures over several rounds of the same load: percentiles of every round's samples together, counts
 * summed. */
function pooled(rounds: Record<string, unknown>[]): Record<string, number> {
  const all = (k: string): number[] => rounds.flatMap((r) => r[k] as number[]);
  const sum = (k: string): number => rounds.reduce((a, r) => a + (r[k] as number), 0);
  const ttft = all('ttftMs');
  const tbt = all('tbtMs');
  return {
    ttftP50Ms: r3(percentile(ttft, 50)),
    ttftP99Ms: r3(percentile(ttft, 99)),
    tbtP50Ms: r3(percentile(tbt, 50)),
    tbtP99Ms: r3(percentile(tbt, 99)),
    finished: sum('finished'),
    rejected: sum('rejected'),
    achievedRate: Math.round(sum('achievedRate') / rounds.length),
  };
}

/** Each round's own p99 TTFT. */
const roundP99s = (rounds: Record<string, unknown>[]): string => rounds.map((r) => r['ttftP99Ms'] as number).join(', ');

async function httpLoadgen(spec: HttpLoadSpec): Promise<Record<string, number>> {
  const p = run([SELF, 'http-loadgen', JSON.stringify(spec)]);
  const line = await p.next(/^\{/, 180_000);
  await p.stop();
  return JSON.parse(line) as Record<string, number>;
}

// `--quick` shortens the measured windows and the memory sampling; the warm-ups (a cold server's JIT costs the
// complex side more than the bare one), the loads (connections, rates, tokens per request, streams held) and every
// figure's definition stay those of the full run.
const WINDOWS = quick
  ? {
      tpWarmupMs: 1500,
      tpWindowMs: 2000,
      latencyMs: 2500,
      httpWarmupRoundMs: 4000,
      httpWarmupMs: 1000,
      httpWindowMs: 1500,
      memSamples: 8,
    }
  : {
      tpWarmupMs: 1500,
      tpWindowMs: 4000,
      latencyMs: 5000,
      httpWarmupRoundMs: 4000,
      httpWarmupMs: 1000,
      httpWindowMs: 2500,
      memSamples: 15,
    };

/** HTTP rounds: switchyard and the bare SSE server alternate, so drift in the machine's load hits both alike. */
const HTTP_ROUNDS = 2;
/** Latency rounds, likewise: the relay and switchyard alternate (which goes first alternates too). The added p99 TTFT
 * is the median over the rounds of (switchyard's p99 − the relay's p99 in the same round); the other latency figures
 * are taken over all of a side's rounds' requests together. */
const LATENCY_ROUNDS = 5;
const httpSpec = (url: string, model: string): HttpLoadSpec => ({
  url,
  model,
  conns: 64,
  maxTokens: 16,
  warmupMs: WINDOWS.httpWarmupMs,
  windowMs: WINDOWS.httpWindowMs,
});

/** The value of one series (its name with any labels, as /metrics prints it) in a /metrics text, or NaN. */
function seriesValue(text: string, series: string): number {
  const m = new RegExp(`^${series.replace(/[{}"]/g, '\\$&')} ([0-9.e+-]+)`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

async function metric(url: string, name: string): Promise<number> {
  return seriesValue(await (await fetch(`${url}/metrics`)).text(), name);
}

/** serve's garbage collections so far (prom-client's default nodejs_gc_duration_seconds): young (scavenge) count and
 * total pause, and full collections (mark-compact); a kind with no collection yet has no series. */
async function gcTotals(url: string): Promise<{ young: number; youngS: number; full: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (series: string, kind: string): number =>
    seriesValue(text, `nodejs_gc_duration_seconds_${series}{kind="${kind}"}`) || 0;
  return { young: read('count', 'minor'), youngS: read('sum', 'minor'), full: read('count', 'major') };
}

// Live memory: the minimum of samples over a few seconds, which approximates the heap right after a collection
// (streaming tokens makes garbage, so one reading mostly measures how long ago the last collection was).
async function memory(
  url: string,
  samples = WINDOWS.memSamples,
): Promise<{ rss: number; heap: number; external: number }> {
  const m = { rss: Infinity, heap: Infinity, external: Infinity };
  for (let i = 0; i < samples; i++) {
    m.rss = Math.min(m.rss, await metric(url, 'process_resident_memory_bytes'));
    m.heap = Math.min(m.heap, await metric(url, 'nodejs_heap_size_used_bytes'));
    m.external = Math.min(m.external, await metric(url, 'nodejs_external_memory_bytes'));
    await sleep(200);
  }
  return m;
}

const throughputSpec = (url: string, model: string): LoadSpec => ({
  mode: 'throughput',
  url,
  model,
  conns: 8,
  perConn: 128,
  maxTokens: 256,
  warmupMs: WINDOWS.tpWarmupMs,
  windowMs: WINDOWS.tpWindowMs,
});
const latencySpec = (url: string, model: string): Extract<LoadSpec, { mode: 'latency' }> => ({
  mode: 'latency',
  url,
  model,
  conns: 8,
  rate: 1000,
  durationMs: WINDOWS.latencyMs,
  maxTokens: 16,
});

async function main(): Promise<void> {
  const streams = Number(process.env['BENCH_STREAMS'] ?? 10_000);
  process.stderr.write(`bench:live: relay baseline${quick ? ' [quick]' : ''}...\n`);
  const relay = run([SELF, 'relay-server']);
  const relayUrl = (JSON.parse(await relay.next(/^\{"url"/)) as { url: string }).url;
  const relayWorker = run([SELF, 'relay-worker', relayUrl.replace('http', 'ws') + '/v1/node']);
  await relay.next(/"worker":true/);
  const relayWs = relayUrl.replace('http', 'ws') + '/v1/ws';
  const relayTp = await loadgen(throughputSpec(relayWs, 'relay'));

  process.stderr.write('bench:live: switchyard serve (zero-cost executor)...\n');
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-bench-'));
  const config = join(dir, 'live.yaml');
  writeFileSync(config, CONFIG);
  const startServe = async (
    executor: readonly string[],
  ): Promise<{ sy: Proc; info: { url: string; wsUrl: string } }> => {
    const p = run([BIN, 'serve', '--config', config, '--port', '0', '--json', ...executor, '--time-scale', '0.001']);
    const i = JSON.parse(await p.next(/^\{"url"/)) as { url: string; wsUrl: string };
    for (;;) {
      const r = await fetch(`${i.url}/readyz`).catch(() => null);
      if (r?.status === 200) break;
      await sleep(100);
    }
    return { sy: p, info: i };
  };
  const { sy, info } = await startServe(['--executor', 'zero-cost']);
  const syTp = await loadgen(throughputSpec(info.wsUrl, 'llama-3-8b'));
  process.stderr.write(
    `bench:live: TTFT at 1,000 req/s, ${LATENCY_ROUNDS} rounds each, relay and switchyard alternating...\n`,
  );
  const relayRounds: Record<string, unknown>[] = [];
  const syRounds: Record<string, unknown>[] = [];
  // serve's collections over the latency rounds (the relay's rounds add almost none: serve is idle then).
  const gcBefore = await gcTotals(info.url);
  for (let i = 0; i < LATENCY_ROUNDS; i++) {
    const relayRound = (): Promise<void> =>
      loadgen({ ...latencySpec(relayWs, 'relay'), samples: true }).then((r) => void relayRounds.push(r));
    const syRound = (): Promise<void> =>
      loadgen({ ...latencySpec(info.wsUrl, 'llama-3-8b'), samples: true }).then((r) => void syRounds.push(r));
    if (i % 2 === 0) {
      await relayRound();
      await syRound();
    } else {
      await syRound();
      await relayRound();
    }
  }
  const gcAfter = await gcTotals(info.url);
  const youngGcs = gcAfter.young - gcBefore.young;
  const gc = {
    youngGcs,
    youngGcPauseMs: r3(((gcAfter.youngS - gcBefore.youngS) * 1000) / Math.max(1, youngGcs)),
    fullGcs: gcAfter.full - gcBefore.full,
  };
  await relayWorker.stop();
  await relay.stop();
  const relayLat = pooled(relayRounds);
  const syLat = pooled(syRounds);
  if (process.env['BENCH_DEBUG'])
    process.stderr.write(`${sy.lines.join('\n')}\n${JSON.stringify(syTp)}\n${JSON.stringify(syLat)}\n`);

  process.stderr.write('bench:live: OpenAI streaming endpoint against a bare node:http SSE server...\n');
  const bare = run([SELF, 'http-bare']);
  const bareUrl = (JSON.parse(await bare.next(/^\{"url"/)) as { url: string }).url;
  const syHttp: Record<string, number>[] = [];
  const bareHttp: Record<string, number>[] = [];
  // One unmeasured round per side first. Switchyard's HTTP path is still cold after the WebSocket phases (the JIT
  // and the young generation's sizing reach steady state only after several seconds of this load): one serve process
  // gave 1,495, 2,054, 2,228, 2,011, 2,380 and 2,333 streams/s in six back-to-back rounds. The bare server, already
  // steady after its first second, gets the same warm-up. The measured rounds and their definition are unchanged.
  for (const [url, model] of [
    [bareUrl, 'bare'],
    [info.url, 'llama-3-8b'],
  ] as const)
    await httpLoadgen({ ...httpSpec(url, model), warmupMs: WINDOWS.httpWarmupRoundMs, windowMs: 500 });
  for (let i = 0; i < HTTP_ROUNDS; i++) {
    bareHttp.push(await httpLoadgen(httpSpec(bareUrl, 'bare')));
    syHttp.push(await httpLoadgen(httpSpec(info.url, 'llama-3-8b')));
  }
  await bare.stop();
  await sy.stop();
  const sum = (rs: Record<string, number>[], k: string): number => rs.reduce((a, r) => a + (r[k] ?? 0), 0);
  const syRps = Math.round(sum(syHttp, 'requestsPerS') / HTTP_ROUNDS);
  const bareRps = Math.round(sum(bareHttp, 'requestsPerS') / HTTP_ROUNDS);
  const httpFailed = sum(syHttp, 'failed') + sum(bareHttp, 'failed');
  const httpShort = sum(syHttp, 'short') + sum(bareHttp, 'short');

  // Holding streams is measured on a fresh server whose steps take 500 ms: every stream still gets a token each step,
  // but little garbage is made, so the heap reflects what the open streams themselves hold.
  process.stderr.write(`bench:live: holding ${streams} streams (500 ms steps)...\n`);
  const hold = await startServe(['--executor', 'fixed', '--step-ms', '500']);
  await sleep(2000);
  const before = await memory(hold.info.url);
  const holder = run(
    [
      SELF,
      'loadgen',
      JSON.stringify({ mode: 'hold', url: hold.info.wsUrl, model: 'llama-3-8b', conns: 20, streams, maxTokens: 8000 }),
    ],
    true,
  );
  const held = JSON.parse(await holder.next(/^\{"held"/, 180_000)) as { held: number; ended: number; openMs: number };
  const live = await metric(hold.info.url, 'switchyard_live_requests');
  const during = await memory(hold.info.url);
  holder.proc.stdin?.write('close\n');
  await holder.next(/"closed":true/);
  await holder.stop();
  await hold.sy.stop();

  const perStream = (a: number, b: number): number => Math.round((b - a) / Math.max(1, held.held));
  const heapPer = perStream(before.heap + before.external, during.heap + during.external);
  const rssPer = perStream(before.rss, during.rss);
  // Each round's added p99 TTFT (the pair ran back to back), and their median.
  const addedRounds = syRounds.map((r, i) => r3((r['ttftP99Ms'] as number) - (relayRounds[i]!['ttftP99Ms'] as number)));
  const sorted = [...addedRounds].sort((a, b) => a - b);
  const addedTtft = sorted[Math.floor(sorted.length / 2)]!;
  const figures: Figures = {
    relayRatio: r3(syTp['tokensPerS']! / Math.max(1, relayTp['tokensPerS']!)),
    httpRatio: r3(syRps / Math.max(1, bareRps)),
    p99AddedTtftMs: addedTtft,
    p99AddedTtftMsRounds: addedRounds,
    p99AddedTbtMs: r3(syLat['tbtP99Ms']! - relayLat['tbtP99Ms']!),
    concurrentStreams: Math.min(held.held, live),
    bytesPerStream: heapPer,
    rssBytesPerStream: rssPer,
    tokensPerS: syTp['tokensPerS']!,
    relayTokensPerS: relayTp['tokensPerS']!,
    httpRequestsPerS: syRps,
    bareHttpRequestsPerS: bareRps,
    httpFailed,
    httpShortStreams: httpShort,
    p99TtftMs: syLat['ttftP99Ms']!,
    p50TtftMs: syLat['ttftP50Ms']!,
    p99TbtMs: syLat['tbtP99Ms']!,
    p50TbtMs: syLat['tbtP50Ms']!,
    requestRate: syLat['achievedRate']!,
    relayP99TtftMs: relayLat['ttftP99Ms']!,
    relayP99TbtMs: relayLat['tbtP99Ms']!,
    serveYoungGcs: gc.youngGcs,
    serveYoungGcPauseMs: gc.youngGcPauseMs,
    serveFullGcs: gc.fullGcs,
    meetsRelayRatio: syTp['tokensPerS']! >= 0.5 * relayTp['tokensPerS']!,
    meetsHttpRatio: syRps >= 0.5 * bareRps && httpFailed === 0,
    meetsTtft: addedTtft <= 5,
    meetsStreams: Math.min(held.held, live) >= streams,
    quick,
  };

  const row = (name: string, a: string, b: string, target = ''): string =>
    `${name.padEnd(30)} ${a.padStart(14)} ${b.padStart(14)}   ${target}`;
  const out: string[] = [];
  out.push('live serving over loopback (zero-cost executor; load generator in its own process)');
  out.push('');
  out.push(row('', 'switchyard', 'bare relay', 'target'));
  out.push(
    row(
      'streamed tokens/s',
      String(syTp['tokensPerS']),
      String(relayTp['tokensPerS']),
      `ratio ${figures.relayRatio} (>= 0.5)`,
    ),
  );
  out.push(
    row(
      `TTFT p50 / p99 ms @${syLat['achievedRate']} req/s`,
      `${syLat['ttftP50Ms']} / ${syLat['ttftP99Ms']}`,
      `${relayLat['ttftP50Ms']} / ${relayLat['ttftP99Ms']}`,
      `p99 added ${addedTtft} (median of rounds, <= 5 ms)`,
    ),
  );
  out.push(
    `  ${LATENCY_ROUNDS} alternating rounds; each round's p99: switchyard ${roundP99s(syRounds)}; relay ${roundP99s(relayRounds)}; added ${addedRounds.join(', ')}`,
  );
  out.push(
    `  serve's collections over the latency rounds: ${gc.youngGcs} young (mean pause ${gc.youngGcPauseMs} ms), ${gc.fullGcs} full`,
  );
  out.push(
    row(
      'TBT p50 / p99 ms',
      `${syLat['tbtP50Ms']} / ${syLat['tbtP99Ms']}`,
      `${relayLat['tbtP50Ms']} / ${relayLat['tbtP99Ms']}`,
    ),
  );
  out.push(
    row(
      'requests finished / rejected',
      `${syLat['finished']} / ${syLat['rejected']}`,
      `${relayLat['finished']} / ${relayLat['rejected']}`,
    ),
  );
  out.push(
    row('OpenAI SSE streams/s (16 tok)', String(syRps), `${bareRps} bare`, `ratio ${figures.httpRatio} (>= 0.5)`),
  );
  out.push(
    `  per round: switchyard ${syHttp.map((r) => r['requestsPerS']).join(', ')}; bare ${bareHttp.map((r) => r['requestsPerS']).join(', ')}; failed ${httpFailed}, short ${httpShort}`,
  );
  out.push('');
  out.push(
    `concurrent open streams held: ${figures.concurrentStreams} of ${streams}, each streaming (opened in ${held.openMs} ms; server saw ${live} live)`,
  );
  out.push(`server memory per stream: ${heapPer} B of JS heap + external, ${rssPer} B of RSS`);
  out.push(
    `  before: rss ${(before.rss / 1e6).toFixed(1)} MB, heap ${(before.heap / 1e6).toFixed(1)} MB; while held: rss ${(during.rss / 1e6).toFixed(1)} MB, heap ${(during.heap / 1e6).toFixed(1)} MB`,
  );
  out.push('');
  process.stdout.write(`${out.join('\n')}\n${JSON.stringify(figures)}\n`);
}

const [cmd, arg] = process.argv.slice(2);
if (cmd === 'relay-server') void runRelayServer();
else if (cmd === 'relay-worker') void runRelayWorker(arg!);
else if (cmd === 'loadgen') void runLoadgen(JSON.parse(arg!) as LoadSpec).then(() => process.exit(0));
else if (cmd === 'http-bare') void runHttpBare();
else if (cmd === 'http-loadgen') void runHttpLoadgen(JSON.parse(arg!) as HttpLoadSpec).then(() => process.exit(0));
else
  main().then(
    () => process.exit(0),
    (e: unknown) => {
      process.stderr.write(`bench:live failed: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exit(1);
    },
  );
