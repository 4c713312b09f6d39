// `switchyard calibrate`: times each llama.cpp model of a config on this machine and writes its engine profile.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { ConfigError, loadScenario, type ModelConfig } from '../actors/config.ts';
import { profilePath } from '../actors/calibration.ts';
import { gridFor, type EngineProfile } from '../actors/engine/calibrate.ts';
import { calibrateFile, formatProfile, QUICK_GRID } from '../actors/engine/calibrate-command.ts';
import type { ProfileCapacity } from '../actors/gpu/profile-cost-model.ts';
import type { EngineSpec } from '../actors/worker/engines.ts';
import { calibrateUpstreamModel } from '../actors/worker/upstream/calibrate.ts';
import { flag, parseOrUsage } from './args.ts';

const USAGE =
  'usage: switchyard calibrate --config file.yaml [--model name] [--threads N] [--timing cpu|wall] [--quick] [--json]\n' +
  '  --timing: step time by wall clock or by process CPU time (default cpu with one thread, which a loaded machine\n' +
  '  inflates far less; wall with more threads)\n' +
  '  writes profiles/<name>.json next to the config for each llama.cpp model (name: its `calibration`, or the\n' +
  "  model's name); a model entry with `calibration: <name>` is then simulated and planned on that profile\n";

/** The cache a replica of `m` gets when served: the engine's slots and cells, one batch of at most the budget. */
export function servingCapacity(m: ModelConfig): ProfileCapacity {
  const e = m.engine!;
  return {
    sequences: e.sequences,
    cellsPerSequence: e.contextTokens - 1,
    totalCells: e.sequences * e.contextTokens,
    batchTokens: m.batching.tokenBudget,
  };
}

/** The profile name of a model: its `calibration` when that is a bare name, else the model's name. */
const profileName = (m: ModelConfig): string =>
  m.calibration && /^[A-Za-z0-9._-]+$/.test(m.calibration) && !m.calibration.endsWith('.json') ? m.calibration : m.name;

const FLAGS = {
  config: flag.str(),
  model: flag.str(),
  threads: flag.intOr(1, { min: 1, max: 256 }),
  timing: flag.oneOf('auto', 'auto', 'cpu', 'wall'),
  quick: flag.bool(),
  json: flag.bool(),
};

/** Runs the calibrate command; returns the exit code. */
export async function runCalibrateCommand(argv: string[]): Promise<number> {
  const args = parseOrUsage('calibrate', USAGE, argv, FLAGS, { maxPositionals: 0 });
  if (!args) return 2;
  if (args.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const config = args.values.config;
  if (config === undefined) {
    process.stderr.write(USAGE);
    return 2;
  }
  let scenario;
  try {
    scenario = loadScenario(config, { calibrations: false });
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    process.stderr.write(`switchyard: invalid config ${config}: ${e.message}\n`);
    return 2;
  }
  const only = args.values.model;
  const models = scenario.models.filter(
    (m) => (m.engine?.kind === 'llama.cpp' || m.engine?.kind === 'openai') && (only === undefined || m.name === only),
  );
  if (models.length === 0) {
    process.stderr.write(`switchyard: no llama.cpp or openai model${only ? ` named ${only}` : ''} in ${config}\n`);
    return 2;
  }
  const threads = args.values.threads;
  const timing = args.values.timing === 'auto' ? (threads === 1 ? 'cpu' : 'wall') : args.values.timing;
  for (const m of models) {
    const name = profileName(m);
    const out = profilePath(m.calibration ?? name, dirname(config));
    // A model server that batches by itself is timed at the request level (actors/worker/upstream/calibrate.ts).
    if (m.engine?.kind === 'openai') {
      await calibrateUpstreamModel(m, name, out, { quick: args.values.quick, json: args.values.json });
      continue;
    }
    process.stderr.write(`calibrating ${m.name} (${m.engine!.file}), ${threads} thread(s), ${timing} time: ${out}\n`);
    const { gpu, gpuLayers } = m.engine! as EngineSpec;
    const device = { ...(gpu ? { gpu } : {}), ...(gpuLayers !== undefined ? { gpuLayers } : {}) };
    // The grid reaches the model's running sequences, token budget and context.
    const limits = { ...m.batching, cellsPerSequence: m.engine!.contextTokens - 1 };
    const grid = args.values.quick ? QUICK_GRID : gridFor(limits);
    const measured = await calibrateFile(m.engine!.file, threads, grid, timing, device);
    const profile: EngineProfile = { ...measured, name, capacity: servingCapacity(m) };
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, `${JSON.stringify(profile, null, 2)}\n`);
    process.stdout.write(`${formatProfile(profile)}\nwrote ${out}\n`);
    if (args.values.json) process.stdout.write(`${JSON.stringify({ ...profile, samples: undefined })}\n`);
  }
  return 0;
}
