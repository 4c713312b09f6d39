// The fleet description (deploy/fleets/*.yaml): pools of 8-GPU nodes, validated with errors naming the field.
import { parse } from 'yaml';
import { FleetError, GPUS_PER_NODE, integer, labels, list, optional, record, text, type Raw } from './fleet-fields.ts';
import { parseModel, type FleetModel } from './fleet-model.ts';

export { FleetError, GPUS_PER_NODE } from './fleet-fields.ts';
export type { FleetEngine, FleetModel, ModelVolume } from './fleet-model.ts';

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

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const GPU_TYPES = ['H100-SXM', 'H200', 'A100-80GB'];
const QUANTITY = /^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$/;
const HOSTNAME = /^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const CIDR = /^(\d{1,3}\.){3}\d{1,3}\/\d{1,2}$|^[0-9a-f:]+\/\d{1,3}$/i;

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
