// CLI: calibrate-command <model.gguf> [--threads N] [--out profile.json] [--quick]: times the engine, prints the fit.
import { writeFile } from 'node:fs/promises';
import { basename } from 'node:path';
import {
  calibrate,
  decodesPerRound,
  DEFAULT_GRID,
  predictS,
  type CalibrationGrid,
  type EngineProfile,
  type StepTiming,
} from './calibrate.ts';
import { describeOrigin, passesOf, profileOrigin } from '../gpu/profile-cost-model.ts';
import type { EngineLoadOptions } from './engine.ts';
import { loadLlamaEngine } from './llama-engine.ts';

/** A small grid for a quick look (and CI): 22 shapes, 3 repetitions. */
export const QUICK_GRID: CalibrationGrid = Object.freeze({
  prefillTokens: [0, 32, 128],
  decodeSeqs: [0, 1, 4],
  contextTokens: [32, 256],
  cachedTokens: [0, 128],
  repetitions: 3,
});

/**
 * Loads the model, calibrates it on `grid` with `threads` threads (on the GPU build and layers of `device`, the CPU
 * when absent), and returns the profile. Steps are timed by `timing`, but by wall time whenever an accelerator runs
 * them (calibrate.ts' timingFor).
 */
export async function calibrateFile(
  file: string,
  threads: number,
  grid: CalibrationGrid,
  timing: StepTiming = 'wall',
  device: Pick<EngineLoadOptions, 'gpu' | 'gpuLayers'> = {},
): Promise<EngineProfile> {
  const maxDecode = Math.max(...grid.decodeSeqs);
  const maxChunks = Math.max(1, ...(grid.prefillChunks ?? [1]));
  const maxContext = Math.max(...grid.contextTokens);
  const maxCached = Math.max(0, ...(grid.cachedTokens ?? [0]));
  // The decoding sequences are set up again each round: their context drifts by at most one round's decodes.
  const drift = decodesPerRound(grid);
  const started = performance.now();
  const engine = await loadLlamaEngine(file, {
    ...device,
    threads,
    sequences: Math.max(maxDecode + maxChunks, ...(grid.decodeOnlySeqs ?? [])),
    contextTokens: Math.max(maxContext + drift + 2, maxCached + Math.max(...grid.prefillTokens) + 1),
    batchTokens: Math.max(Math.max(...grid.prefillTokens) + maxDecode, maxContext, maxCached),
  });
  const loadS = (performance.now() - started) / 1e3;
  try {
    return await calibrate(engine, { name: basename(file, '.gguf'), threads, loadS, grid, timing });
  } finally {
    await engine.unload();
  }
}

/** One line per sample: measured and fitted milliseconds. */
export function formatProfile(p: EngineProfile): string {
  const lines = ['prefill decode context passes   measured ms   fitted ms   error'];
  for (const s of p.samples) {
    const fitted = predictS(p.coefficients, s) * 1e3;
    const ms = s.seconds * 1e3;
    const err = ((fitted - ms) / ms) * 100;
    const cells = [
      String(s.prefillTokens).padStart(7),
      String(s.decodeSeqs).padStart(6),
      String(s.contextTokens).padStart(7),
      String(passesOf(s)).padStart(6),
      `  ${ms.toFixed(3).padStart(11)}`,
      `  ${fitted.toFixed(3).padStart(9)}`,
      `  ${err.toFixed(1).padStart(5)} %`,
    ];
    lines.push(cells.join(' '));
  }
  const c = p.coefficients;
  lines.push(
    `fit over ${p.fit.points} shapes: mean relative error ${(p.fit.meanRelError * 100).toFixed(1)} %, ` +
      `max ${(p.fit.maxRelError * 100).toFixed(1)} %`,
    `t = ${(c.baseS * 1e3).toFixed(4)} ms + ${(c.perPrefillTokenS * 1e6).toFixed(3)} us/prefill token + ` +
      `${(c.perPrefillPairS * 1e9).toFixed(3)} ns/prefill pair + ` +
      `${((c.perPrefillCachedS ?? 0) * 1e9).toFixed(3)} ns/cached token a chunk reads + ` +
      `${(c.perDecodeSeqS * 1e6).toFixed(3)} us/decode seq + ` +
      `${(c.perContextTokenS * 1e9).toFixed(3)} ns/context token + ` +
      `${((c.perPrefillSeqS ?? 0) * 1e6).toFixed(3)} us/prefill chunk + ` +
      `${((c.perPassS ?? 0) * 1e6).toFixed(3)} us/pass + ` +
      `${((c.perSinglePassS ?? 0) * 1e6).toFixed(3)} us/single-decode pass`,
    `fitted on ${describeOrigin(profileOrigin(p), p.threads)}, steps timed by ${p.timing ?? 'wall'} time`,
  );
  return lines.join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const file = args.find((a, i) => !a.startsWith('--') && args[i - 1] !== '--threads' && args[i - 1] !== '--out');
  const opt = (name: string): string | undefined => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  if (!file) {
    console.error('usage: calibrate-command <model.gguf> [--threads N] [--out profile.json] [--quick]');
    process.exit(2);
  }
  const profile = await calibrateFile(
    file,
    Number(opt('--threads') ?? 1),
    args.includes('--quick') ? QUICK_GRID : DEFAULT_GRID,
  );
  console.log(formatProfile(profile));
  const out = opt('--out');
  if (out) await writeFile(out, `${JSON.stringify(profile, null, 2)}\n`);
  console.log(JSON.stringify({ ...profile, samples: undefined }));
}
