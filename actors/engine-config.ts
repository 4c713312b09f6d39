// A model entry's engine: `cost-model` (the default: steps take the roofline's time), `llama.cpp` (a GGUF file run
// by an engine host per replica) or `openai` (a model server that batches by itself, speaking the OpenAI API: vLLM,
// SGLang, TGI, llama.cpp's server, another switchyard; see docs/engines.md). For llama.cpp the ledger's limits are the
// engine's real cache; for openai they are the server's concurrency (`sequences`) and context (`contextTokens`). The
// file (for openai: the GGUF whose vocabulary tokenizes the served model's prompts) is checked, and the seeded tiny
// model generated when asked, before anything starts.
//
// Routing and admission still price work with the model's named `profile` (the roofline): a conservative default
// (a real GPU profile is slower per token than the tiny model on a CPU) until a calibrated profile replaces it.
import { closeSync, mkdirSync, openSync, readSync, statSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { buildTinyModel, type GeneratedSize } from './engine/tiny-model.ts';
import { writeFileAtomic } from '../runtime/atomic-file.ts';
import type { WireEngineSpec } from '../machines/messages.ts';
import { upstreamUrlProblem } from './worker/upstream/url.ts';
import {
  arr,
  bool,
  dflt,
  int,
  obj,
  oneOf,
  optional,
  record,
  str,
  type Infer,
  type Refuse,
} from '../transport/schema.ts';

/** The gauges of the Gateway API Inference Extension's model-server protocol, under each server's own names. */
export const GAUGE_NAMES = {
  vllm: {
    waiting: ['vllm:num_requests_waiting'],
    running: ['vllm:num_requests_running'],
    kvUsage: ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'],
  },
  sglang: {
    waiting: ['sglang:num_queue_reqs'],
    running: ['sglang:num_running_reqs'],
    kvUsage: ['sglang:token_usage'],
  },
  switchyard: {
    waiting: ['switchyard_num_requests_waiting'],
    running: ['switchyard_num_requests_running'],
    kvUsage: ['switchyard_kv_cache_usage_perc'],
  },
} as const;

const gaugeList = arr(str({ min: 1, max: 200, pattern: /^[a-zA-Z_:][a-zA-Z0-9_:]*$/ }), { min: 1, max: 8 });
const path = str({ min: 1, max: 200, pattern: /^\/[\x21-\x7e]*$/ });

/** An `engine: openai` model's server: started per replica from `command`, or attached at `url`. */
const upstreamFields = obj({
  /** The server's model name (each request's `model`; `{model}` in the command). */
  model: str({ min: 1, max: 200 }),
  url: optional(str({ min: 1, max: 2048 })),
  /** argv; `{port}` (a free loopback port), `{gpus}` (the replica's GPUs, comma-separated), `{model}` filled in. */
  command: optional(arr(str({ max: 4096 }), { min: 1, max: 128 })),
  /** The command's working folder, relative to the config file. */
  cwd: optional(str({ min: 1, max: 4096 })),
  env: optional(
    record(str({ min: 1, max: 200, pattern: /^[A-Za-z_][A-Za-z0-9_]*$/ }), str({ max: 4096 }), { max: 64 }),
  ),
  health: dflt(path, '/health'),
  metrics: dflt(path, '/metrics'),
  /** Whose metric names the gauges go by; `gauges` overrides any of them. */
  server: dflt(oneOf('vllm', 'sglang', 'switchyard'), 'vllm'),
  gauges: optional(obj({ waiting: optional(gaugeList), running: optional(gaugeList), kvUsage: optional(gaugeList) })),
  prompt: dflt(oneOf('ids', 'text'), 'ids'),
  tokenIds: dflt(bool(), false),
  startTimeoutMs: dflt(int({ min: 1000, max: 86_400_000 }), 600_000),
  hangMs: dflt(int({ min: 100, max: 86_400_000 }), 60_000),
  maxErrors: dflt(int({ min: 1, max: 1000 }), 3),
  /** Requests waiting in switchyard's queue beside the `sequences` the server runs (never in the server's). */
  queue: dflt(int({ min: 0, max: 100_000 }), 64),
  sleep: dflt(bool(), false),
  logLines: dflt(int({ min: 1, max: 100_000 }), 500),
  /** Allow a `url` that is not loopback. */
  remote: dflt(bool(), false),
});
type UpstreamEntry = Infer<typeof upstreamFields>;

/** The engine fields of a model entry, with their defaults. */
export const engineFields = {
  engine: dflt(oneOf('cost-model', 'llama.cpp', 'openai'), 'cost-model'),
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
  /** Where the layers run: `cpu`, or a GPU backend of node-llama-cpp's prebuilt builds (`cuda`, `vulkan`, `metal`;
   * `auto`: the first that loads, else the CPU). Each engine host sees exactly its replica's GPUs. */
  gpu: dflt(oneOf('cpu', 'auto', 'cuda', 'vulkan', 'metal'), 'cpu'),
  /** Layers offloaded to the GPU (default: all of them when `gpu` is not `cpu`). */
  gpuLayers: optional(int({ min: 0, max: 100_000 })),
  /** The model server of an `engine: openai` model. */
  upstream: optional(upstreamFields),
} as const;

/** An engine model's entry as written (the fields above plus what the ledger needs). */
interface EngineEntry {
  engine: 'cost-model' | 'llama.cpp' | 'openai';
  file?: string | undefined;
  generate?: GeneratedSize | undefined;
  threads: number;
  contextTokens: number;
  sequences: number;
  gpu: 'cpu' | 'auto' | 'cuda' | 'vulkan' | 'metal';
  gpuLayers?: number | undefined;
  upstream?: UpstreamEntry | undefined;
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
  if (m.engine === 'openai') return openaiEngineOf(m, b, refuse);
  if (m.upstream) refuse('upstream', 'is only for engine openai');
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
      ...(m.gpu !== 'cpu' ? { gpu: m.gpu } : {}),
      ...(m.gpuLayers !== undefined ? { gpuLayers: m.gpuLayers } : {}),
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

/** An `engine: openai` model's engine and ledger limits: the server runs `sequences` requests at once, each up to
 * `contextTokens`; the rest wait in switchyard's queue. */
function openaiEngineOf(
  m: EngineEntry,
  b: { maxRunning: number; tokenBudget: number; blockTokens: number; maxContext?: number | undefined },
  refuse: Refuse,
): { engine: WireEngineSpec; limits: EngineLimits } {
  const u = m.upstream;
  if (!u) return refuse('upstream', 'is required for engine openai (the server: command or url, and its model name)');
  if (!m.file) refuse('file', "is required for engine openai (a GGUF with the served model's vocabulary)");
  if (m.kind !== 'generate') refuse('kind', 'must be generate for engine openai');
  if ((u.url === undefined) === (u.command === undefined)) refuse('upstream', 'needs exactly one of command and url');
  if (u.url !== undefined) {
    const bad = upstreamUrlProblem(u.url, u.remote);
    if (bad) refuse('upstream.url', bad);
  }
  if (u.command !== undefined && !u.command.some((a) => a.includes('{port}')))
    refuse('upstream.command', 'must take the port it listens on ({port})');
  if (b.maxContext !== undefined && b.maxContext > m.contextTokens)
    refuse('batching.maxContext', `exceeds the server's ${m.contextTokens} tokens per request (contextTokens)`);
  const maxContext = b.maxContext ?? m.contextTokens;
  const maxRunning = Math.min(b.maxRunning, m.sequences);
  const names = GAUGE_NAMES[u.server];
  const { remote: _remote, server: _server, url, command, cwd, env, gauges, ...rest } = u;
  return {
    engine: {
      kind: 'openai',
      file: m.file!,
      contextTokens: m.contextTokens,
      sequences: maxRunning,
      threads: m.threads,
      upstream: {
        ...rest,
        ...(url !== undefined ? { url: url.replace(/\/+$/, '') } : {}),
        ...(command !== undefined ? { command } : {}),
        ...(cwd !== undefined ? { cwd } : {}),
        ...(env !== undefined ? { env: { ...env } } : {}),
        gauges: {
          waiting: [...(gauges?.waiting ?? names.waiting)],
          running: [...(gauges?.running ?? names.running)],
          kvUsage: [...(gauges?.kvUsage ?? names.kvUsage)],
        },
      },
    },
    limits: {
      maxRunning,
      maxContext,
      tokenBudget: b.tokenBudget,
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
    // An openai server's working folder is the config's like its file.
    if (e.upstream?.cwd !== undefined && !isAbsolute(e.upstream.cwd)) e.upstream.cwd = resolve(baseDir, e.upstream.cwd);
    if (generate && modelFileProblem(e.file)?.endsWith('does not exist')) {
      try {
        mkdirSync(dirname(e.file), { recursive: true });
        // Written aside and renamed: a concurrent reader never sees half a file.
        writeFileAtomic(e.file, buildTinyModel({ size: generate }), { mode: 0o644 });
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
