// Calibration of an `engine: openai` model server at the request level: it schedules its own steps, so what can be
// timed is what its answers show — the time to the first token (TTFT) of `B` requests of `L` prompt tokens sent
// together, and the time per output token (TPOT) while `B` decode together — over a grid of batches and lengths.
// The step-time coefficients of the cost model are fitted to them (non-negative least squares), so `simulate` and
// `plan` price the server as they price a llama.cpp engine:
//
//   TTFT(B, L) ≈ one step prefilling B prompts of L tokens: base + perPrefillToken·B·L + perPrefillPair·B·L²/2
//                + perPrefillSeq·B
//   TPOT(B, C) ≈ one step decoding B sequences of C context tokens each: base + perDecodeSeq·B + perContextToken·B·C
//
// Its load time is the start of its command until its health path answers; with `upstream.sleep`, the time it takes
// to fall asleep and to wake is measured too (the placement prices a switch with it).
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname } from 'node:path';
import type { Clock } from '../../../runtime/clock.ts';
import { createWallClock } from '../../../runtime/clock.ts';
import type { SubmitSeq } from '../../../machines/core-messages.ts';
import type { WireEngineSpec, WireUpstreamSpec } from '../../../machines/messages.ts';
import type { CalibrationSample, EngineProfile, ProfileCapacity } from '../../gpu/profile-cost-model.ts';
import { fitOf, leastSquares, toCoefficients } from '../../engine/calibrate.ts';
import { loadCodec, type ModelCodec } from './codec.ts';
import { completionBody, streamCompletion } from './completion.ts';
import { createUpstreamHttp, type UpstreamHttp } from './http.ts';
import { fillCommand, freePort, startServerProcess, type ServerProcess } from './server.ts';
import { sleepServer, wakeServer } from './sleep.ts';

/** The grid of request-level measurements: batches (requests sent together) by prompt lengths. */
export interface UpstreamGrid {
  batches: readonly number[];
  promptTokens: readonly number[];
  /** Output tokens of each request (the TPOT is timed over them). */
  outputTokens: number;
  repetitions: number;
}

/** The default grid: 1 to 8 requests together, prompts of 16 to 192 tokens, 24 output tokens, twice each. */
export const UPSTREAM_GRID: UpstreamGrid = Object.freeze({
  batches: [1, 2, 4, 8],
  promptTokens: [16, 64, 192],
  outputTokens: 24,
  repetitions: 2,
});

/** A quick grid (tests, a first look). */
export const UPSTREAM_QUICK_GRID: UpstreamGrid = Object.freeze({
  batches: [1, 4],
  promptTokens: [16, 96],
  outputTokens: 12,
  repetitions: 1,
});

/** A calibrated model server's profile: an engine profile whose engine is `openai`, with its sleep and wake times
 * when it has a sleep mode. */
export type UpstreamProfile = Omit<EngineProfile, 'engine'> & { engine: 'openai'; sleepS?: number; wakeS?: number };

/** What one request of a batch showed. */
interface Timed {
  ttftMs: number;
  tpotMs: number | null;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? 0 : s[Math.floor((s.length - 1) / 2)]!;
};

/** Features of a sample, in the order of the fitted coefficients (no pass term: the server's batching is its own). */
const features = (s: CalibrationSample): number[] => [
  1,
  s.prefillTokens,
  s.prefillPairs,
  s.decodeSeqs,
  s.contextTokens,
  s.prefillSeqs ?? 0,
];

/** Fits the coefficients to request-level samples: least squares, dropping a feature whose coefficient comes out
 * negative and fitting again, so every term is a cost. */
export function fitRequestLevel(samples: readonly CalibrationSample[]): Pick<EngineProfile, 'coefficients' | 'fit'> {
  const rows = samples.map(features);
  const y = samples.map((s) => s.seconds);
  const active = [0, 1, 2, 3, 4, 5];
  let b = new Array<number>(6).fill(0);
  for (let round = 0; round < 6 && active.length > 0; round++) {
    const sub = leastSquares(
      rows.map((r) => active.map((j) => r[j]!)),
      y,
    );
    b = new Array<number>(6).fill(0);
    active.forEach((j, k) => (b[j] = sub[k]!));
    let worst = -1;
    for (const j of active) if (b[j]! < 0 && (worst < 0 || b[j]! < b[worst]!)) worst = j;
    if (worst < 0) break;
    active.splice(active.indexOf(worst), 1);
    b[worst] = 0;
  }
  const errors = samples.map((s, i) => {
    const p = rows[i]!.reduce((a, x, j) => a + x * b[j]!, 0);
    return Math.abs(p - s.seconds) / Math.max(1e-9, s.seconds);
  });
  return { coefficients: toCoefficients(b), fit: fitOf(errors) };
}

/** The samples of one batch: its TTFT as a prefill step of B prompts, its TPOT as a decode step of B sequences. */
export function samplesOf(
  batch: number,
  promptTokens: number,
  outputTokens: number,
  timed: readonly Timed[],
): CalibrationSample[] {
  const out: CalibrationSample[] = [
    {
      prefillTokens: batch * promptTokens,
      prefillPairs: (batch * promptTokens * promptTokens) / 2,
      prefillSeqs: batch,
      decodeSeqs: 0,
      contextTokens: 0,
      passes: 0,
      seconds: median(timed.map((t) => t.ttftMs)) / 1000,
    },
  ];
  const tpot = timed.map((t) => t.tpotMs).filter((t): t is number => t !== null);
  if (tpot.length > 0)
    out.push({
      prefillTokens: 0,
      prefillPairs: 0,
      prefillSeqs: 0,
      decodeSeqs: batch,
      contextTokens: batch * Math.round(promptTokens + outputTokens / 2),
      passes: 0,
      seconds: median(tpot) / 1000,
    });
  return out;
}

/** A prompt of exactly `n` token ids, distinct per request (so no prefix is reused between them). */
function promptIds(codec: ModelCodec, n: number, tag: string): number[] {
  const ids: number[] = [];
  const words = codec.encode(` ${tag} the switchyard routes every request to a replica of its model and version`);
  for (let i = 0; ids.length < n; i++) ids.push(words[i % words.length]!);
  return ids.slice(0, n);
}

/** Sends `prompts` together, `outputTokens` each; answers each one's TTFT and TPOT (ms), or throws what failed. */
function timeBatch(
  http: UpstreamHttp,
  spec: WireUpstreamSpec,
  codec: ModelCodec,
  prompts: readonly number[][],
  outputTokens: number,
  clock: Clock,
): Promise<Timed[]> {
  return Promise.all(
    prompts.map(
      (prompt, i) =>
        new Promise<Timed>((resolve, reject) => {
          const seq: SubmitSeq = {
            id: `calibrate-${i}`,
            priority: 0,
            order: i,
            promptTokens: prompt.length,
            outputTokens,
            maxTokens: outputTokens,
            estOutputTokens: outputTokens,
            generated: 0,
            prompt: codec.bos !== null ? [codec.bos, ...prompt] : prompt,
            sampling: { temperature: 0 },
          };
          const t0 = clock.now();
          let first = -1;
          let last = -1;
          let firstN = 0;
          let n = 0;
          const body = completionBody({ ...spec }, seq, outputTokens, codec, codec.bos);
          streamCompletion(http, body, codec, {
            accepted: () => undefined,
            tokens: (ids) => {
              const t = clock.now();
              if (first < 0) ((first = t), (firstN = Math.max(1, ids.length)));
              last = t;
              n += Math.max(1, ids.length);
            },
            finished: (_reason, usage) => {
              if (first < 0) return reject(new Error('the server streamed no token'));
              const made = Math.max(n, usage ?? 0);
              const after = made - firstN;
              resolve({ ttftMs: first - t0, tpotMs: after > 0 && last > first ? (last - first) / after : null });
            },
            failed: (_whose, message) => reject(new Error(message)),
          });
        }),
    ),
  );
}

/** A server for calibration: started from the command on GPUs 0..tp-1 (the load timed), or attached at its URL. */
interface Calibrated {
  http: UpstreamHttp;
  loadS: number;
  proc: ServerProcess | null;
}

async function startServer(
  spec: WireUpstreamSpec,
  tp: number,
  sequences: number,
  clock: Clock,
  log: (l: string) => void,
): Promise<Calibrated> {
  let proc: ServerProcess | null = null;
  let base = spec.url ?? '';
  let exited = '';
  const t0 = clock.now();
  if (spec.command) {
    const port = await freePort();
    const gpus = Array.from({ length: tp }, (_, g) => g);
    base = `http://127.0.0.1:${port}`;
    const argv = fillCommand(spec.command, { port, gpus, model: spec.model });
    log(`starting ${argv.join(' ').slice(0, 300)}`);
    proc = startServerProcess({
      argv,
      cwd: spec.cwd,
      env: spec.env,
      gpus,
      logLines: spec.logLines,
      exited: (code, signal) => (exited = signal ?? `code ${code}`),
    });
  }
  const http = createUpstreamHttp(base, sequences + 4);
  for (;;) {
    const r = await http.call('GET', spec.health, { timeoutMs: 2_000, maxBytes: 1 << 16 });
    if ('status' in r && r.status === 200) break;
    const tail = proc?.log.lines().slice(-5).join(' | ') ?? '';
    if (exited) throw new Error(`the server exited (${exited}): ${tail.slice(0, 600)}`);
    if (clock.now() - t0 > spec.startTimeoutMs) {
      proc?.signal('SIGKILL');
      throw new Error(`its health path ${spec.health} did not answer 200 within ${spec.startTimeoutMs} ms`);
    }
    await new Promise<void>((resolve) => clock.setTimeout(resolve, 100));
  }
  return { http, loadS: spec.command ? (clock.now() - t0) / 1000 : 0, proc };
}

/** What calibrating one model needs: its engine, GPUs per replica, the serving batch budget, and the grid. */
export interface UpstreamCalibrationOptions {
  name: string;
  engine: WireEngineSpec & { upstream: WireUpstreamSpec };
  tp: number;
  tokenBudget: number;
  grid?: UpstreamGrid;
  log?(line: string): void;
  clock?: Clock;
  /** The vocabulary (tests inject one); default: a vocab-only load of the engine's file. */
  codec?: ModelCodec;
}

/** Starts (or attaches to) the server, times the grid and, with a sleep mode, its sleep and wake; fits the profile. */
export async function calibrateUpstream(o: UpstreamCalibrationOptions): Promise<UpstreamProfile> {
  const spec = o.engine.upstream;
  const grid = o.grid ?? UPSTREAM_GRID;
  const clock = o.clock ?? createWallClock();
  const log = o.log ?? ((l: string) => void process.stderr.write(`${l}\n`));
  const codec = o.codec ?? (await loadCodec(o.engine.file));
  const sequences = o.engine.sequences;
  const server = await startServer(spec, o.tp, sequences, clock, log);
  try {
    const out = grid.outputTokens;
    const room = o.engine.contextTokens - out - 2;
    // One request first: the server's own warm-up (first allocations, compiled kernels) is not a sample.
    await timeBatch(server.http, spec, codec, [promptIds(codec, 8, 'warm')], 4, clock);
    const samples: CalibrationSample[] = [];
    for (let rep = 0; rep < grid.repetitions; rep++) {
      for (const batch of grid.batches.filter((b) => b <= sequences)) {
        for (const len of grid.promptTokens.filter((l) => l <= room)) {
          const prompts = Array.from({ length: batch }, (_, i) =>
            promptIds(codec, len, `r${rep} b${batch} l${len} ${i}`),
          );
          const timed = await timeBatch(server.http, spec, codec, prompts, out, clock);
          samples.push(...samplesOf(batch, len, out, timed));
        }
      }
    }
    if (samples.length === 0) throw new Error(`no grid point fits ${o.engine.contextTokens} tokens per request`);
    const switching = spec.sleep ? await timeSleepWake(server.http, spec, clock) : {};
    const capacity: ProfileCapacity = {
      sequences,
      cellsPerSequence: o.engine.contextTokens,
      totalCells: sequences * o.engine.contextTokens,
      batchTokens: o.tokenBudget,
    };
    return {
      kind: 'switchyard.engine-profile',
      version: 1,
      name: o.name,
      engine: 'openai',
      model: spec.model,
      threads: o.engine.threads,
      timing: 'wall',
      machine: { cpus: availableParallelism(), platform: process.platform, arch: process.arch },
      loadS: server.loadS,
      ...switching,
      capacity,
      ...fitRequestLevel(samples),
      samples,
    };
  } finally {
    server.proc?.signal('SIGTERM');
    server.http.close();
  }
}

/** Puts the server to sleep and wakes it, twice; the medians (s). A server without a sleep mode is an error. */
async function timeSleepWake(
  http: UpstreamHttp,
  spec: WireUpstreamSpec,
  clock: Clock,
): Promise<{ sleepS: number; wakeS: number }> {
  const sleeps: number[] = [];
  const wakes: number[] = [];
  const now = (): number => clock.now();
  for (let i = 0; i < 2; i++) {
    const s = await sleepServer(http, spec.startTimeoutMs, now);
    if ('error' in s) throw new Error(`upstream.sleep is set but the server did not fall asleep: ${s.error}`);
    const w = await wakeServer(http, spec.startTimeoutMs, now);
    if ('error' in w) throw new Error(`the server did not wake: ${w.error}`);
    sleeps.push(s.ms);
    wakes.push(w.ms);
  }
  return { sleepS: median(sleeps) / 1000, wakeS: median(wakes) / 1000 };
}

/** One line per figure of a calibrated server's profile. */
export function formatUpstreamProfile(p: UpstreamProfile): string {
  const c = p.coefficients;
  const ms = (s: number): string => `${(s * 1000).toFixed(3)} ms`;
  return [
    `${p.name}: engine openai (${p.model}), ${p.fit.points} points, fit ${(p.fit.meanRelError * 100).toFixed(1)} % mean, ${(p.fit.maxRelError * 100).toFixed(1)} % max`,
    `  load ${p.loadS.toFixed(2)} s${p.sleepS !== undefined ? `, sleep ${ms(p.sleepS)}, wake ${ms(p.wakeS ?? 0)}` : ''}`,
    `  base ${ms(c.baseS)}, per prefill token ${ms(c.perPrefillTokenS)}, per prefill pair ${ms(c.perPrefillPairS)}, per prefill seq ${ms(c.perPrefillSeqS ?? 0)}`,
    `  per decode seq ${ms(c.perDecodeSeqS)}, per context token ${ms(c.perContextTokenS)}`,
  ].join('\n');
}

/** `switchyard calibrate` for an `engine: openai` model: calibrates it and writes its profile to `out`. */
export async function calibrateUpstreamModel(
  m: { name: string; tp: number; engine?: WireEngineSpec | undefined; batching: { tokenBudget: number } },
  name: string,
  out: string,
  o: { quick: boolean; json: boolean },
): Promise<void> {
  const e = m.engine;
  if (e?.kind !== 'openai' || !e.upstream) throw new Error(`${m.name} is not an engine openai model`);
  process.stderr.write(`calibrating ${m.name} (server ${e.upstream.model}) at the request level: ${out}\n`);
  const profile = await calibrateUpstream({
    name,
    engine: { ...e, upstream: e.upstream },
    tp: m.tp,
    tokenBudget: m.batching.tokenBudget,
    grid: o.quick ? UPSTREAM_QUICK_GRID : UPSTREAM_GRID,
  });
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify(profile, null, 2)}\n`);
  process.stdout.write(`${formatUpstreamProfile(profile)}\nwrote ${out}\n`);
  if (o.json) process.stdout.write(`${JSON.stringify({ ...profile, samples: undefined })}\n`);
}
