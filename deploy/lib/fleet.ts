// The fleet description (deploy/fleets/*.yaml): pools of 8-GPU nodes, validated with errors naming the field.
import { parse } from 'yaml';
import { engineFields } from '../../actors/engine-config.ts';
import { validate, type Schema } from '../../transport/schema.ts';

/** Each pod is one node of this many GPUs; a pool's mode decides how they are split among its models. */
export const GPUS_PER_NODE = 8;

/** Where a model's GGUF file lives: a PersistentVolumeClaim or a folder of the node, mounted read-only. */
export type ModelVolume = { claim: string } | { hostPath: string };

/** A model served by llama.cpp: its file inside the volume, and the offload settings of the serve config. */
export interface FleetEngine {
  volume: ModelVolume;
  /** The GGUF file's path inside the volume (relative, no `..`). */
  file: string;
  gpu: 'cpu' | 'auto' | 'cuda' | 'vulkan' | 'metal';
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

/** CPU and memory of a node's worker container (the GPUs are always all eight). */
export interface PoolResources {
  cpu: string;
  memory: string;
}

/** One pool of identical nodes, all in one mode: `large` (one TP-8 replica) or `small` (1-GPU replicas). */
export interface Pool {
  name: string;
  mode: 'large' | 'small';
  nodes: number;
  gpu: string;
  image: string;
  startupSeconds: number;
  resources: PoolResources;
  /** Extended resources the worker requests and is limited to: the node's GPUs (`nvidia.com/gpu: 8`) and any other. */
  gpuResources: Map<string, number>;
  nodeSelector: Record<string, string>;
  models: FleetModel[];
}

/** Timings of a graceful stop: preStop delay, the control plane's drain deadline, slack for the rest. */
export interface ShutdownTimings {
  preStopSeconds: number;
  drainDeadlineSeconds: number;
  slackSeconds: number;
}

/** A whole fleet: where it runs, who may reach it, and its pools. */
export interface Fleet {
  name: string;
  namespace: string;
  image: string;
  /** The Gateway, its proxy pods, and the host names clients use (the HTTPRoute's and the Host allow-list). */
  gateway: { name: string; namespace: string; podLabels: Record<string, string>; hostnames: string[] };
  prometheus: { namespace: string; podLabels: Record<string, string> };
  /** The cluster DNS pods, the one egress every pod of the fleet has. */
  dns: { namespace: string; podLabels: Record<string, string> };
  /** Where the Kubernetes API answers (the endpoint pickers watch pods and pools): CIDR blocks and ports. */
  apiServer: { cidrs: string[]; ports: number[] };
  epp: { image: string };
  shutdown: ShutdownTimings;
  pools: Pool[];
}

/** A fleet file error; `path` names the offending field. */
export class FleetError extends Error {
  constructor(
    readonly path: string,
    message: string,
  ) {
    super(`${path}: ${message}`);
    this.name = 'FleetError';
  }
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const MODEL_NAME = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const GPU_TYPES = ['H100-SXM', 'H200', 'A100-80GB'];
const PROFILES = ['llama-3-8b', 'llama-3-70b', 'llama-3-70b-fp8'];
const QUANTITY = /^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$/;
const HOSTNAME = /^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const CIDR = /^(\d{1,3}\.){3}\d{1,3}\/\d{1,2}$|^[0-9a-f:]+\/\d{1,3}$/i;

type Raw = Record<string, unknown>;

function record(v: unknown, path: string): Raw {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new FleetError(path, 'must be a mapping');
  return v as Raw;
}

function text(v: unknown, path: string, pattern?: RegExp, max = 253): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > max) {
    throw new FleetError(path, `must be a non-empty string of at most ${max} characters`);
  }
  if (pattern && !pattern.test(v)) throw new FleetError(path, `"${v}" does not match ${String(pattern)}`);
  return v;
}

function integer(v: unknown, path: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new FleetError(path, `must be an integer from ${min} to ${max}`);
  }
  return v;
}

function labels(v: unknown, path: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(record(v, path))) out[k] = text(val, `${path}.${k}`, undefined, 63);
  return out;
}

function list<T>(v: unknown, path: string, item: (x: unknown, p: string) => T, max = 64): T[] {
  if (!Array.isArray(v) || v.length > max) throw new FleetError(path, `must be a list of at most ${max} entries`);
  return v.map((x, i) => item(x, `${path}[${i}]`));
}

function optional<T>(raw: Raw, key: string, path: string, read: (v: unknown, p: string) => T, fallback: T): T {
  return raw[key] === undefined ? fallback : read(raw[key], `${path}.${key}`);
}

const MODEL_KEYS = new Set(['name', 'profile', 'replicas', 'classes', 'engine', 'volume', 'file']);
const OFFLOAD_KEYS = ['gpu', 'gpuLayers', 'threads', 'contextTokens', 'sequences'] as const;
const LLAMA_KEYS = ['volume', 'file', ...OFFLOAD_KEYS];
for (const k of OFFLOAD_KEYS) MODEL_KEYS.add(k);
/** A Kubernetes object name (DNS subdomain), as a PersistentVolumeClaim's. */
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** A path of plain segments: no empty segment, no `.` or `..`, no leading or trailing slash. */
const PLAIN_PATH = /^(?!.*(^|\/)\.{1,2}(\/|$))[^/\0]+(\/[^/\0]+)*$/;

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
  if (!host.startsWith('/') || host === '/' || !PLAIN_PATH.test(host.slice(1))) {
    throw new FleetError(
      `${path}.hostPath`,
      `must be an absolute folder without . or .. segments (not /); got "${host}"`,
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
  if (!PLAIN_PATH.test(file) || !file.toLowerCase().endsWith('.gguf')) {
    throw new FleetError(
      `${path}.file`,
      `must be a .gguf path inside the volume, without . or .. segments; got "${file}"`,
    );
  }
  const gpuLayers =
    raw['gpuLayers'] === undefined
      ? undefined
      : engineField(engineFields.gpuLayers, raw['gpuLayers'], `${path}.gpuLayers`);
  return {
    volume,
    file,
    gpu: engineField(engineFields.gpu, raw['gpu'], `${path}.gpu`),
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

function parseModel(v: unknown, path: string, mode: Pool['mode']): FleetModel {
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

/** Gives each small-pool model its share of the eight GPUs: stated replicas, the rest split evenly. */
function splitSmallReplicas(models: FleetModel[], path: string): void {
  const stated = models.reduce((s, m) => s + m.replicas, 0);
  const unstated = models.filter((m) => m.replicas === 0);
  const left = GPUS_PER_NODE - stated;
  if (left < unstated.length || (unstated.length === 0 && stated > GPUS_PER_NODE)) {
    throw new FleetError(`${path}.models`, `replicas must fit on ${GPUS_PER_NODE} GPUs (asked for ${stated})`);
  }
  unstated.forEach((m, i) => {
    m.replicas = Math.floor(left / unstated.length) + (i < left % unstated.length ? 1 : 0);
  });
}

/** An extended resource's name: a domain prefix, a slash, a name (`nvidia.com/gpu`, `amd.com/gpu`). */
const EXTENDED_RESOURCE = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

/**
 * The worker's extended resources, default `nvidia.com/gpu: 8`. A pod is one whole node: exactly one entry is the
 * node's GPUs (a name ending in `/gpu`), counting eight; other entries (an RDMA device, say) pass through.
 */
function parseGpuResources(raw: Raw, path: string): Map<string, number> {
  if (raw['gpuResources'] === undefined) return new Map([['nvidia.com/gpu', GPUS_PER_NODE]]);
  const out = new Map<string, number>();
  for (const [name, n] of Object.entries(record(raw['gpuResources'], `${path}.gpuResources`))) {
    const at = `${path}.gpuResources.${name}`;
    if (!EXTENDED_RESOURCE.test(name) || name.length > 253 || name.split('/')[0]!.endsWith('kubernetes.io')) {
      throw new FleetError(at, 'must be an extended resource name with a domain prefix (e.g. nvidia.com/gpu)');
    }
    out.set(name, integer(n, at, 1, 1024));
  }
  const gpus = [...out].filter(([name]) => name.endsWith('/gpu'));
  if (gpus.length !== 1 || gpus[0]![1] !== GPUS_PER_NODE) {
    throw new FleetError(
      `${path}.gpuResources`,
      `must ask for the node's ${GPUS_PER_NODE} GPUs once (one <vendor>/gpu: ${GPUS_PER_NODE} entry)`,
    );
  }
  return out;
}

function parsePool(v: unknown, path: string, image: string): Pool {
  const raw = record(v, path);
  const mode = text(raw['mode'], `${path}.mode`);
  if (mode !== 'large' && mode !== 'small') throw new FleetError(`${path}.mode`, 'must be large or small');
  const gpu = optional(raw, 'gpu', path, text, 'H100-SXM');
  if (!GPU_TYPES.includes(gpu)) throw new FleetError(`${path}.gpu`, `must be one of ${GPU_TYPES.join(', ')}`);
  if (!Array.isArray(raw['models']) || raw['models'].length === 0) {
    throw new FleetError(`${path}.models`, 'must list at least one model');
  }
  const models = raw['models'].map((m, i) => parseModel(m, `${path}.models[${i}]`, mode));
  if (mode === 'large' && models.length !== 1) throw new FleetError(`${path}.models`, 'a large pool serves one model');
  if (mode === 'small') splitSmallReplicas(models, path);
  const res = optional(raw, 'resources', path, record, {});
  return {
    name: text(raw['name'], `${path}.name`, DNS_LABEL, 30),
    mode,
    nodes: integer(raw['nodes'], `${path}.nodes`, 1, 512),
    gpu,
    image: optional(raw, 'image', path, text, image),
    startupSeconds: optional(
      raw,
      'startupSeconds',
      path,
      (x, p) => integer(x, p, 60, 7200),
      mode === 'large' ? 1800 : 900,
    ),
    resources: {
      cpu: optional(res, 'cpu', `${path}.resources`, (x, p) => text(String(x), p, QUANTITY), '32'),
      memory: optional(res, 'memory', `${path}.resources`, (x, p) => text(x, p, QUANTITY), '256Gi'),
    },
    gpuResources: parseGpuResources(raw, path),
    nodeSelector: optional(raw, 'nodeSelector', path, labels, {}),
    models,
  };
}

function parseShutdown(raw: Raw): ShutdownTimings {
  return {
    preStopSeconds: optional(raw, 'preStopSeconds', 'shutdown', (x, p) => integer(x, p, 0, 600), 10),
    drainDeadlineSeconds: optional(raw, 'drainDeadlineSeconds', 'shutdown', (x, p) => integer(x, p, 1, 3600), 60),
    slackSeconds: optional(raw, 'slackSeconds', 'shutdown', (x, p) => integer(x, p, 1, 600), 15),
  };
}

/** Parses and validates a fleet file's text; throws FleetError naming the bad field. */
export function parseFleet(source: string): Fleet {
  const raw = record(parse(source) as unknown, '(root)');
  const image = text(raw['image'], 'image');
  if (!Array.isArray(raw['pools']) || raw['pools'].length === 0) throw new FleetError('pools', 'must list a pool');
  const pools = raw['pools'].map((p, i) => parsePool(p, `pools[${i}]`, image));
  const seen = new Set<string>();
  pools.forEach((p, i) => {
    if (seen.has(p.name)) throw new FleetError(`pools[${i}].name`, `duplicate pool "${p.name}"`);
    seen.add(p.name);
  });
  const gw = optional(raw, 'gateway', '(root)', record, {});
  const prom = optional(raw, 'prometheus', '(root)', record, {});
  const gatewayName = optional(gw, 'name', 'gateway', (x, p) => text(x, p, DNS_LABEL), 'inference-gateway');
  const dns = optional(raw, 'dns', '(root)', record, {});
  const api = optional(raw, 'apiServer', '(root)', record, {});
  return {
    name: text(raw['name'], 'name', DNS_LABEL, 30),
    namespace: optional(raw, 'namespace', '(root)', (x, p) => text(x, p, DNS_LABEL, 63), 'switchyard'),
    image,
    gateway: {
      name: gatewayName,
      namespace: optional(gw, 'namespace', 'gateway', (x, p) => text(x, p, DNS_LABEL, 63), 'gateway-system'),
      podLabels: optional(gw, 'podLabels', 'gateway', labels, {
        'gateway.networking.k8s.io/gateway-name': gatewayName,
      }),
      hostnames: optional(gw, 'hostnames', 'gateway', (x, p) => list(x, p, (h, q) => text(h, q, HOSTNAME)), []),
    },
    prometheus: {
      namespace: optional(prom, 'namespace', 'prometheus', (x, p) => text(x, p, DNS_LABEL, 63), 'monitoring'),
      podLabels: optional(prom, 'podLabels', 'prometheus', labels, { 'app.kubernetes.io/name': 'prometheus' }),
    },
    dns: {
      namespace: optional(dns, 'namespace', 'dns', (x, p) => text(x, p, DNS_LABEL, 63), 'kube-system'),
      podLabels: optional(dns, 'podLabels', 'dns', labels, { 'k8s-app': 'kube-dns' }),
    },
    apiServer: {
      // Narrow this to the API server's addresses: the default lets the endpoint pickers reach any host on these ports.
      cidrs: optional(api, 'cidrs', 'apiServer', (x, p) => list(x, p, (c, q) => text(c, q, CIDR)), ['0.0.0.0/0']),
      ports: optional(api, 'ports', 'apiServer', (x, p) => list(x, p, (n, q) => integer(n, q, 1, 65_535)), [443, 6443]),
    },
    epp: {
      image: optional(optional(raw, 'epp', '(root)', record, {}), 'image', 'epp', text, EPP_IMAGE),
    },
    shutdown: parseShutdown(optional(raw, 'shutdown', '(root)', record, {})),
    pools,
  };
}

/** The endpoint picker image: GIE v1.5.0, the last release with the full EPP in kubernetes-sigs. */
export const EPP_IMAGE = 'registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0';

/** Every model the fleet serves, once, in the order pools first name them. */
export function fleetModels(fleet: Fleet): string[] {
  return [...new Set(fleet.pools.flatMap((p) => p.models.map((m) => m.name)))];
}
