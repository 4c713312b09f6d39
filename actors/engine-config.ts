// A model entry's engine: `cost-model` (the default: steps take the roofline's time) or `llama.cpp` (a GGUF file run
// by an engine host per replica). For llama.cpp the ledger's limits are the engine's real cache, and the file is
// checked (and the seeded tiny model generated when asked) before anything starts.
//
// Routing and admission still price work with the model's named `profile` (the roofline): a conservative default
// (a real GPU profile is slower per token than the tiny model on a CPU) until a calibrated profile replaces it.
import { closeSync, mkdirSync, openSync, readSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { buildTinyModel, type GeneratedSize } from './engine/tiny-model.ts';
import type { WireEngineSpec } from '../machines/messages.ts';
import { dflt, int, oneOf, optional, str, type Refuse } from '../transport/schema.ts';

/** The engine fields of a model entry, with their defaults. */
export const engineFields = {
  engine: dflt(oneOf('cost-model', 'llama.cpp'), 'cost-model'),
  /** The GGUF file, relative to the config file. */
  file: optional(str({ min: 1, max: 4096 })),
  /** Writes the seeded tiny model to `file` when it is missing (tests, CI, the quick start). */
  generate: optional(oneOf('tiny', 'bench', 'm100')),
  /** CPU threads of each engine host. */
  threads: dflt(int({ min: 1, max: 256 }), 1),
  /** KV cells per sequence as llama.cpp allocates them: a multiple of 256; one cell stays free. */
  contextTokens: dflt(int({ min: 256, max: 1_048_576 }), 512),
  /** Concurrent sequences of each engine (its slots). */
  sequences: dflt(int({ min: 1, max: 256 }), 4),
} as const;

/** An engine model's entry as written (the fields above plus what the ledger needs). */
interface EngineEntry {
  engine: 'cost-model' | 'llama.cpp';
  file?: string | undefined;
  generate?: GeneratedSize | undefined;
  threads: number;
  contextTokens: number;
  sequences: number;
  kind: string;
}

/** The ledger limits a llama.cpp engine imposes on a model's batching. */
export interface EngineLimits {
  maxRunning: number;
  maxContext: number;
  tokenBudget: number;
  kvBlocks: number;
  watermark: number;
}

/** A llama.cpp model's engine (file not yet resolved) and ledger limits, or null for a cost-model model. */
export function engineOf(
  m: EngineEntry,
  b: { maxRunning: number; tokenBudget: number; blockTokens: number; maxContext?: number | undefined },
  refuse: Refuse,
): { engine: WireEngineSpec; limits: EngineLimits } | null {
  if (m.engine !== 'llama.cpp') return null;
  if (!m.file) refuse('file', 'is required for engine llama.cpp (a GGUF path, relative to the config file)');
  if (m.kind !== 'generate') refuse('kind', 'must be generate for engine llama.cpp');
  if (m.contextTokens % 256 !== 0)
    refuse('contextTokens', `must be a multiple of 256 (llama.cpp rounds it up); got ${m.contextTokens}`);
  const cells = m.contextTokens - 1;
  if (b.maxContext !== undefined && b.maxContext > cells)
    refuse('batching.maxContext', `exceeds the engine's ${cells} cells per sequence (contextTokens - 1)`);
  const maxContext = b.maxContext ?? cells;
  const maxRunning = Math.min(b.maxRunning, m.sequences);
  return {
    engine: {
      kind: 'llama.cpp',
      file: m.file!,
      contextTokens: m.contextTokens,
      sequences: m.sequences,
      threads: m.threads,
    },
    limits: {
      maxRunning,
      maxContext,
      tokenBudget: Math.min(b.tokenBudget, m.contextTokens),
      // Each engine sequence has its own fixed block of cells: the pool is the slots times a full sequence.
      kvBlocks: maxRunning * Math.ceil(maxContext / b.blockTokens),
      watermark: 0,
    },
  };
}

const GGUF_VERSIONS = [2, 3];

/** Why a GGUF file cannot be served (missing, unreadable, not GGUF), naming it; null when it looks right. */
export function modelFileProblem(file: string): string | null {
  let fd: number;
  try {
    if (!statSync(file).isFile()) return `model file ${file} is not a file`;
    fd = openSync(file, 'r');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return `model file ${file} ${code === 'ENOENT' ? 'does not exist' : 'cannot be read'}`;
  }
  try {
    const head = Buffer.alloc(8);
    const n = readSync(fd, head, 0, 8, 0);
    if (n < 8 || head.toString('latin1', 0, 4) !== 'GGUF') return `model file ${file} is not a GGUF file`;
    const v = head.readUInt32LE(4);
    if (!GGUF_VERSIONS.includes(v)) return `model file ${file} has unsupported GGUF version ${v}`;
    return null;
  } catch {
    return `model file ${file} cannot be read`;
  } finally {
    closeSync(fd);
  }
}

/**
 * Resolves each engine's file against the config file's folder, writes the seeded tiny model where asked and
 * missing, and checks every file; answers the first problem as [field, message], or null.
 */
export function prepareModelFiles(
  models: readonly { engine?: WireEngineSpec; generate?: GeneratedSize }[],
  baseDir: string,
): [string, string] | null {
  for (let i = 0; i < models.length; i++) {
    const { engine: e, generate } = models[i]!;
    if (!e) continue;
    e.file = isAbsolute(e.file) ? e.file : resolve(baseDir, e.file);
    if (generate && modelFileProblem(e.file)?.endsWith('does not exist')) {
      try {
        mkdirSync(dirname(e.file), { recursive: true });
        // Written aside and renamed: a concurrent reader never sees half a file.
        const tmp = `${e.file}.${process.pid}.tmp`;
        writeFileSync(tmp, buildTinyModel({ size: generate }));
        renameSync(tmp, e.file);
      } catch (err) {
        return [`models[${i}].file`, `cannot write the ${generate} model to ${e.file}: ${(err as Error).message}`];
      }
    }
    const problem = modelFileProblem(e.file);
    if (problem) return [`models[${i}].file`, problem];
  }
  return null;
}

/**
 * The scenario as simulated: every model on the cost model (steps take the roofline's time, nothing is spawned),
 * keeping the ledger limits of its engine's cache. Serving passes its scenario as it is.
 */
export function withoutEngines<S extends { models: readonly { engine?: WireEngineSpec }[] }>(scenario: S): S {
  if (!scenario.models.some((m) => m.engine)) return scenario;
  return {
    ...scenario,
    models: scenario.models.map((m) => {
      if (!m.engine) return m;
      const { engine: _engine, ...rest } = m;
      return rest;
    }),
  };
}
