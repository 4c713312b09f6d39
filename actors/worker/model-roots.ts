// Where a worker may open model files: only under its model roots (`node-agent --model-root`), compared by real path
// so that neither `..` nor a symlink inside a root reaches a file outside. The control plane names a file; the worker
// decides whether to open it.
import { realpathSync } from 'node:fs';
import { dirname, isAbsolute, relative, resolve } from 'node:path';
import type { EngineFailure } from '../engine/engine.ts';

/** The roots a worker uses when none are given: `.cache/models` under the working directory. */
export function defaultModelRoots(cwd: string = process.cwd()): string[] {
  return [resolve(cwd, '.cache/models')];
}

/**
 * The roots `serve` gives the worker it starts: the config's folder, the default roots, and the folder of each model
 * file the config names (the operator chose those files; the worker still refuses any other).
 */
export function servedModelRoots(configPath: string, files: readonly string[]): string[] {
  const roots = [dirname(resolve(configPath)), ...defaultModelRoots(), ...files.map((f) => dirname(resolve(f)))];
  return [...new Set(roots)];
}

const realOrNull = (path: string): string | null => {
  try {
    return realpathSync(path);
  } catch {
    return null;
  }
};

const inside = (root: string, file: string): boolean => {
  const rel = relative(root, file);
  return rel !== '' && !rel.startsWith('..') && !isAbsolute(rel);
};

/** Why the worker refuses to open `file` (outside every root, or missing), or null when its real path is inside. */
export function modelFileRefusal(file: string, roots: readonly string[]): EngineFailure | null {
  const refuse = (why: string): EngineFailure => ({
    code: 'invalid_model_file',
    message: `model file ${file} ${why}`,
    retryable: false,
  });
  if (!isAbsolute(file)) return refuse('is not an absolute path');
  const real = realOrNull(file);
  if (real === null) return refuse('does not exist or cannot be resolved');
  const realRoots = roots.map(realOrNull).filter((r): r is string => r !== null);
  if (realRoots.some((root) => inside(root, real))) return null;
  return refuse(`is outside the worker's model roots (${roots.join(', ') || 'none'}; see --model-root)`);
}
