// What the manifests assume of the switchyard CLI: commands, flags, ports, env vars, paths. Change it here only.
import { GPUS_PER_NODE, type Fleet } from './fleet.ts';

// The image's entrypoint is the switchyard CLI (deploy/Dockerfile), so containers pass only `args`.

/** The control plane's one HTTP port: OpenAI API, /v1/ws, /v1/node (workers), /metrics, /healthz, /readyz. */
export const HTTP_PORT = 8080;

/** Where the pool's ConfigMap is mounted and the file `serve --config` reads. */
export const CONFIG_DIR = '/etc/switchyard';
/** The key of the switchyard config in the pool's ConfigMap. */
export const CONFIG_KEY = 'config.yaml';

/** The metric names switchyard exposes for the endpoint picker (gauges, also labelled by `model`). */
export const METRICS = {
  queued: 'switchyard_num_requests_waiting',
  running: 'switchyard_num_requests_running',
  kvUsage: 'switchyard_kv_cache_usage_perc',
} as const;

/** Keys of the tokens Secret and the env var each one feeds (the worker sees only its own). */
export const TOKEN_KEYS = {
  client: { key: 'client-tokens', env: 'SWITCHYARD_CLIENT_TOKENS' },
  admin: { key: 'admin-token', env: 'SWITCHYARD_ADMIN_TOKEN' },
  worker: { key: 'worker-token', env: 'SWITCHYARD_WORKER_TOKEN' },
} as const;

/** The paths a client uses, the only ones the gateway's HTTPRoute sends to a pod (never /v1/node, /v1/inspect, /admin). */
export const CLIENT_PATHS = ['/v1/chat/completions', '/v1/completions', '/v1/models', '/v1/ws'] as const;

/** The worker link's path: reached over the pod's loopback only. */
export const WORKER_PATH = '/v1/node';

/** Where the worker finds model files: the `models` volume, its only model root. */
export const MODELS_DIR = '/models';

/** The addresses the worker dials the control plane from: the pod's loopback (both containers share the network). */
export const WORKER_SOURCES = ['127.0.0.1/32', '::1/128'] as const;

/** The env var the pod's IP is given in (downward API), named in args as $(POD_IP). */
export const POD_IP_ENV = 'POD_IP';

/**
 * `serve` flags the manifests use that restrict where requests may come from; renamed here only:
 * workerAllow: the addresses /v1/node accepts (comma-separated addresses and CIDR blocks);
 * allowedHost: the Host names requests may name (comma-separated).
 */
export const SOURCE_FLAGS = { workerAllow: '--worker-allow', allowedHost: '--allowed-host' } as const;

/** The Host names the control plane accepts: the gateway's host names, and the pod's IP for the kubelet's probes and
 * the scrapers (they name the pod by address). Empty when the fleet names no host (the Host is then not checked). */
export function allowedHosts(fleet: Fleet): string[] {
  return fleet.gateway.hostnames.length > 0 ? [...fleet.gateway.hostnames, `$(${POD_IP_ENV})`] : [];
}

/** The control plane's command line: the worker runs in its own container (`--no-worker`). */
export function serveArgs(fleet: Fleet): string[] {
  const hosts = allowedHosts(fleet);
  return [
    'serve',
    '--config',
    `${CONFIG_DIR}/${CONFIG_KEY}`,
    '--no-worker',
    '--host',
    '0.0.0.0',
    '--port',
    String(HTTP_PORT),
    '--drain-ms',
    String(fleet.shutdown.drainDeadlineSeconds * 1000),
    // TLS ends at the gateway; the pod port is plain HTTP that only the NetworkPolicy's peers can reach.
    '--insecure',
    SOURCE_FLAGS.workerAllow,
    WORKER_SOURCES.join(','),
    ...(hosts.length > 0 ? [SOURCE_FLAGS.allowedHost, hosts.join(',')] : []),
  ];
}

/** The worker's command line: dials the control plane over the pod's loopback, named after the pod, opening model
 * files from the models volume only. */
export function nodeAgentArgs(): string[] {
  return [
    'node-agent',
    '--url',
    `ws://127.0.0.1:${HTTP_PORT}${WORKER_PATH}`,
    '--gpus',
    String(GPUS_PER_NODE),
    '--node',
    '$(POD_NAME)',
    '--model-root',
    MODELS_DIR,
  ];
}
