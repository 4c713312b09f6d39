// A fleet file's model entry: its profile, replicas and classes, and for `engine: llama.cpp` the GGUF file, the volume
// it is read from and the serve config's offload settings (checked by that config's own field schemas).
import { engineFields } from '../../actors/engine-config.ts';
import { validate, type Infer, type Schema } from '../../transport/schema.ts';
import { FleetError, GPUS_PER_NODE, integer, optional, record, text, type Raw } from './fleet-fields.ts';

/** Where a model's GGUF file lives: a PersistentVolumeClaim or a folder of the node, mounted read-only. */
export type ModelVolume = { claim: string } | { hostPath: string };

/** A model served by llama.cpp: its file inside the volume, and the offload settings of the serve config. */
export interface FleetEngine {
  volume: ModelVolume;
  /** The GGUF file's path inside the volume (relative, no `..`). */
  file: string;
  gpu: Infer<typeof engineFields.gpu>;
  gpuLayers?: number;
  threads: number;
  contextTokens: number;
  sequences: number;
}

/** A model a pool serves; `replicas` is only for small pools (one GPU each), `classes` passes through. */
export interface FleetModel {
  name: string;
  profile: string;
  replicas: number;
  /** Class name → limit name → value, in the order written (names from the file are Map keys). */
  classes?: Map<string, Map<string, number>>;
  /** Absent: the cost-model simulation (`engine: cost-model`, the default). */
  engine?: FleetEngine;
}

const MODEL_NAME = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const PROFILES = ['llama-3-8b', 'llama-3-70b', 'llama-3-70b-fp8'];

/** The fields only a llama.cpp model has: where its file is, and the serve config's offload settings. */
const LLAMA_KEYS = ['volume', 'file', 'gpu', 'gpuLayers', 'threads', 'contextTokens', 'sequences'];
const MODEL_KEYS = new Set(['name', 'profile', 'replicas', 'classes', 'engine', ...LLAMA_KEYS]);
/** A Kubernetes object name (DNS subdomain), as a PersistentVolumeClaim's. */
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** A path of plain segments: none empty, `.` or `..`, none with a control character; no leading or trailing slash. */
function plainPath(path: string): boolean {
  return path.split('/').every((seg) => seg !== '' && seg !== '.' && seg !== '..' && !/[\x00-\x1f\x7f]/.test(seg));
}

/** One value checked by the serve config's own schema for that field (engine-config.ts): one set of ranges. */
function engineField<T>(schema: Schema<T>, v: unknown, path: string): T {
  const r = validate(schema, v);
  if (!r.ok) throw new FleetError(path, r.error.message);
  return r.value;
}

function parseVolume(v: unknown, path: string): ModelVolume {
  const raw = new Map(Object.entries(record(v, path)));
  const keys = [...raw.keys()];
  if (keys.length !== 1 || (keys[0] !== 'claim' && keys[0] !== 'hostPath')) {
    throw new FleetError(path, 'must give exactly one of claim (a PersistentVolumeClaim) or hostPath (a node folder)');
  }
  if (keys[0] === 'claim') return { claim: text(raw.get('claim'), `${path}.claim`, DNS_SUBDOMAIN) };
  const host = text(raw.get('hostPath'), `${path}.hostPath`, undefined, 4096);
  if (!host.startsWith('/') || host === '/' || !plainPath(host.slice(1))) {
    throw new FleetError(
      `${path}.hostPath`,
      `must be an absolute folder without . or .. segments (not /); got ${JSON.stringify(host)}`,
    );
  }
  return { hostPath: host };
}

/** The llama.cpp fields of a model entry (null for the cost model); any of them without `engine: llama.cpp` is refused. */
function parseEngine(raw: Raw, path: string): FleetEngine | null {
  const engine = engineField(engineFields.engine, raw['engine'], `${path}.engine`);
  if (engine !== 'llama.cpp') {
    const stray = LLAMA_KEYS.find((k) => raw[k] !== undefined);
    if (stray) throw new FleetError(`${path}.${stray}`, 'is only for engine llama.cpp (the cost model reads no file)');
    return null;
  }
  if (raw['volume'] === undefined) throw new FleetError(`${path}.volume`, 'is required for engine llama.cpp');
  const volume = parseVolume(raw['volume'], `${path}.volume`);
  const file = text(raw['file'], `${path}.file`, undefined, 1024);
  if (!plainPath(file) || !file.toLowerCase().endsWith('.gguf')) {
    throw new FleetError(
      `${path}.file`,
      `must be a .gguf path inside the volume, without . or .. segments; got ${JSON.stringify(file)}`,
    );
  }
  const gpu = engineField(engineFields.gpu, raw['gpu'], `${path}.gpu`);
  if (gpu === 'metal')
    throw new FleetError(`${path}.gpu`, 'is metal, which no fleet node (Linux) has: use cuda, vulkan, auto or cpu');
  const gpuLayers =
    raw['gpuLayers'] === undefined
      ? undefined
      : engineField(engineFields.gpuLayers, raw['gpuLayers'], `${path}.gpuLayers`);
  return {
    volume,
    file,
    gpu,
    ...(gpuLayers !== undefined ? { gpuLayers } : {}),
    threads: engineField(engineFields.threads, raw['threads'], `${path}.threads`),
    contextTokens: engineField(engineFields.contextTokens, raw['contextTokens'], `${path}.contextTokens`),
    sequences: engineField(engineFields.sequences, raw['sequences'], `${path}.sequences`),
  };
}

function parseClasses(v: unknown, path: string): Map<string, Map<string, number>> {
  const classes = new Map<string, Map<string, number>>();
  for (const [cls, limits] of Object.entries(record(v, path))) {
    const values = new Map<string, number>();
    for (const [k, n] of Object.entries(record(limits, `${path}.${cls}`))) {
      values.set(k, integer(n, `${path}.${cls}.${k}`, 0, 1e9));
    }
    classes.set(cls, values);
  }
  return classes;
}

/** Reads one model entry of a pool in `mode`; unknown fields are refused by name. */
export function parseModel(v: unknown, path: string, mode: 'large' | 'small'): FleetModel {
  const raw = record(v, path);
  const unknown = Object.keys(raw).find((k) => !MODEL_KEYS.has(k));
  if (unknown !== undefined) {
    throw new FleetError(`${path}.${unknown}`, `unknown field (known: ${[...MODEL_KEYS].join(', ')})`);
  }
  const name = text(raw['name'], `${path}.name`, MODEL_NAME, 50);
  const profile = text(raw['profile'], `${path}.profile`);
  if (!PROFILES.includes(profile)) throw new FleetError(`${path}.profile`, `must be one of ${PROFILES.join(', ')}`);
  if (mode === 'large' && raw['replicas'] !== undefined) {
    throw new FleetError(`${path}.replicas`, 'a large pool runs exactly one replica over all eight GPUs');
  }
  const replicas = mode === 'large' ? 1 : optional(raw, 'replicas', path, (x, p) => integer(x, p, 1, GPUS_PER_NODE), 0);
  const model: FleetModel = { name, profile, replicas };
  if (raw['classes'] !== undefined) model.classes = parseClasses(raw['classes'], `${path}.classes`);
  const engine = parseEngine(raw, path);
  if (engine) model.engine = engine;
  return model;
}
