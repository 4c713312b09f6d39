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

/** The control plane's command line: the worker runs in its own container (`--no-worker`). */
export function serveArgs(fleet: Fleet): string[] {
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
  ];
}

/** The worker's command line: dials the control plane over the pod's loopback, named after the pod. */
export function nodeAgentArgs(): string[] {
  return [
    'node-agent',
    '--url',
    `ws://127.0.0.1:${HTTP_PORT}/v1/node`,
    '--gpus',
    String(GPUS_PER_NODE),
    '--node',
    '$(POD_NAME)',
  ];
}
