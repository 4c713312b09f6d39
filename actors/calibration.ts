// Resolves a config's calibrated engine profiles by name and fits the models' batching limits to the engine's cache.
import { isAbsolute, join, resolve } from 'node:path';
import { engineProfileAt, EngineProfileError } from './gpu/profile-cost-model.ts';
import { ConfigError, type Scenario } from './config.ts';

/** Where a profile named in a config lives: `profiles/<name>.json` next to the config, or the .json path given. */
export function profilePath(name: string, configDir: string): string {
  if (isAbsolute(name)) return name;
  if (name.endsWith('.json') || name.includes('/')) return resolve(configDir, name);
  return resolve(configDir, join('profiles', `${name}.json`));
}

/**
 * Reads every model's `calibration` profile (a ConfigError naming the field when it cannot be read) and bounds the
 * model's batching by the engine it was measured on: no more running sequences than the engine's slots, no longer
 * context than a sequence's cells, no bigger step than the engine's batch. Models without one are left as they are.
 */
export function applyCalibrations(scenario: Scenario, configDir: string): Scenario {
  scenario.models.forEach((m, i) => {
    if (!m.calibration) return;
    const file = profilePath(m.calibration, configDir);
    let cap;
    try {
      cap = engineProfileAt(file).capacity;
    } catch (e) {
      if (e instanceof EngineProfileError) throw new ConfigError(`models[${i}].calibration`, e.message);
      throw e;
    }
    if (m.tp !== 1) throw new ConfigError(`models[${i}].tp`, 'a calibrated engine runs as one host: tp must be 1');
    m.calibration = file;
    const b = m.batching;
    b.maxRunning = Math.min(b.maxRunning, cap.sequences);
    b.maxContext = Math.min(b.maxContext, cap.cellsPerSequence);
    b.tokenBudget = Math.min(b.tokenBudget, cap.batchTokens);
  });
  return scenario;
}
