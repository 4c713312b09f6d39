// Loading a scenario for a command: a bad file is reported naming the bad field, and the command exits 2.
import { ConfigError, loadScenario, type Scenario } from '../actors/config.ts';

/** Loads `file`, or writes why it is invalid to stderr and returns null. */
export function scenarioOrReport(file: string): Scenario | null {
  try {
    return loadScenario(file);
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`switchyard: invalid scenario ${file}: ${e.message}\n`);
      return null;
    }
    throw e;
  }
}
