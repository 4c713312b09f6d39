// One pool's manifests: the node Deployment (control plane + worker containers), its PDB and its ConfigMap.
import type { IConfigMap } from 'kubernetes-models/v1';
import type { IContainer, IEnvVar, IProbe, ISecurityContext } from 'kubernetes-models/v1';
import type { IDeployment } from 'kubernetes-models/apps/v1';
import type { IPodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { createHash } from 'node:crypto';
import { stringify } from 'yaml';
import type { Fleet, Pool } from './fleet.ts';
import { modelPodVolumes, modelVolumeMounts } from './model-volumes.ts';
import { fleetLabels, names, poolPodLabels, poolSelectorLabels } from './names.ts';
import { poolConfig } from './switchyard-config.ts';
import {
  CONFIG_DIR,
  CONFIG_KEY,
  HTTP_PORT,
  MODELS_DIR,
  nodeAgentArgs,
  POD_IP_ENV,
  serveArgs,
  TOKEN_KEYS,
} from './switchyard-cli.ts';

/** Non-root, read-only root filesystem, no capabilities, no privilege escalation: every container here. */
export const RESTRICTED: ISecurityContext = {
  runAsNonRoot: true,
  runAsUser: 10001,
  runAsGroup: 10001,
  allowPrivilegeEscalation: false,
  readOnlyRootFilesystem: true,
  capabilities: { drop: ['ALL'] },
  seccompProfile: { type: 'RuntimeDefault' },
};

/** Seconds between startup-probe attempts; the threshold is the pool's model-load budget divided by this. */
export const STARTUP_PERIOD_SECONDS = 10;

/** The grace period a pod needs: preStop delay + the control plane's drain deadline + slack to stop the worker. */
export function terminationGraceSeconds(fleet: Fleet): number {
  const s = fleet.shutdown;
  return s.preStopSeconds + s.drainDeadlineSeconds + s.slackSeconds;
}

function secretEnv(fleet: Fleet, token: keyof typeof TOKEN_KEYS): IEnvVar {
  const t = TOKEN_KEYS[token];
  return { name: t.env, valueFrom: { secretKeyRef: { name: names.tokens(fleet), key: t.key } } };
}

function httpProbe(path: string, periodSeconds: number, failureThreshold: number): IProbe {
  return { httpGet: { path, port: 'http' }, periodSeconds, timeoutSeconds: 5, failureThreshold };
}

function controlPlane(fleet: Fleet, pool: Pool): IContainer {
  return {
    name: 'control-plane',
    image: pool.image,
    args: serveArgs(fleet),
    ports: [{ name: 'http', containerPort: HTTP_PORT, protocol: 'TCP' }],
    env: [
      // The pod's address, allowed as a Host: the kubelet's probes and the scrapers name the pod by it.
      { name: POD_IP_ENV, valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
      secretEnv(fleet, 'client'),
      secretEnv(fleet, 'admin'),
      secretEnv(fleet, 'worker'),
    ],
    // Liveness waits for startup, which waits (generously) for the worker to load the models.
    startupProbe: httpProbe('/readyz', STARTUP_PERIOD_SECONDS, Math.ceil(pool.startupSeconds / STARTUP_PERIOD_SECONDS)),
    livenessProbe: httpProbe('/healthz', 10, 3),
    readinessProbe: httpProbe('/readyz', 5, 2),
    // The delay lets the gateway and the endpoint picker see the pod go unready before SIGTERM starts the drain.
    lifecycle: { preStop: { sleep: { seconds: fleet.shutdown.preStopSeconds } } },
    resources: { requests: { cpu: '2', memory: '4Gi' }, limits: { memory: '4Gi' } },
    securityContext: RESTRICTED,
    volumeMounts: [
      { name: 'config', mountPath: CONFIG_DIR, readOnly: true },
      { name: 'tmp', mountPath: '/tmp', subPath: 'control-plane' },
      ...modelVolumeMounts(pool),
    ],
  };
}

function worker(fleet: Fleet, pool: Pool): IContainer {
  const s = fleet.shutdown;
  const extended = Object.fromEntries(pool.gpuResources);
  return {
    name: 'worker',
    image: pool.image,
    args: nodeAgentArgs(),
    env: [{ name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } }, secretEnv(fleet, 'worker')],
    // The worker outlives the control plane's drain: it is signalled only once running requests had their deadline.
    lifecycle: { preStop: { sleep: { seconds: s.preStopSeconds + s.drainDeadlineSeconds } } },
    // Extended resources are requested and limited alike (Kubernetes refuses a request without an equal limit).
    resources: {
      requests: { cpu: pool.resources.cpu, memory: pool.resources.memory, ...extended },
      limits: { memory: pool.resources.memory, ...extended },
    },
    securityContext: RESTRICTED,
    volumeMounts: [
      // The model root; each model volume is mounted read-only inside it, so every GGUF file stays under the root.
      { name: 'models', mountPath: MODELS_DIR },
      ...modelVolumeMounts(pool),
      { name: 'tmp', mountPath: '/tmp', subPath: 'worker' },
      { name: 'dshm', mountPath: '/dev/shm' },
    ],
  };
}

/** The pool's Deployment: one pod per 8-GPU node, control plane and worker as separate containers. */
export function poolDeployment(fleet: Fleet, pool: Pool): IDeployment {
  const configHash = createHash('sha256').update(configText(fleet, pool)).digest('hex');
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: names.pool(fleet, pool), namespace: fleet.namespace, labels: poolPodLabels(fleet, pool) },
    spec: {
      replicas: pool.nodes,
      selector: { matchLabels: poolSelectorLabels(fleet, pool) },
      // No surge: a surge pod would need a spare 8-GPU node; replace one node at a time instead.
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 0, maxUnavailable: 1 } },
      template: {
        // The hash rolls the pods when the config changes (a mounted ConfigMap is not re-read by `serve`).
        metadata: { labels: poolPodLabels(fleet, pool), annotations: { 'switchyard.dev/config-sha256': configHash } },
        spec: {
          terminationGracePeriodSeconds: terminationGraceSeconds(fleet),
          enableServiceLinks: false,
          automountServiceAccountToken: false,
          securityContext: { runAsNonRoot: true, fsGroup: 10001, seccompProfile: { type: 'RuntimeDefault' } },
          ...(Object.keys(pool.nodeSelector).length > 0 ? { nodeSelector: pool.nodeSelector } : {}),
          // GPU nodes are tainted with their GPU resource's name (the NVIDIA and AMD operators' convention).
          tolerations: [...pool.gpuResources.keys()]
            .filter((r) => r.endsWith('/gpu'))
            .map((key) => ({ key, operator: 'Exists', effect: 'NoSchedule' })),
          containers: [controlPlane(fleet, pool), worker(fleet, pool)],
          volumes: [
            { name: 'config', configMap: { name: names.poolConfig(fleet, pool) } },
            { name: 'tmp', emptyDir: { sizeLimit: '1Gi' } },
            { name: 'models', emptyDir: { sizeLimit: pool.mode === 'large' ? '400Gi' : '100Gi' } },
            { name: 'dshm', emptyDir: { medium: 'Memory', sizeLimit: '16Gi' } },
            ...modelPodVolumes(pool),
          ],
        },
      },
    },
  };
}

/** At most one node of the pool down for voluntary disruptions (drains, upgrades). */
export function poolDisruptionBudget(fleet: Fleet, pool: Pool): IPodDisruptionBudget {
  return {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: { name: names.pool(fleet, pool), namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: { maxUnavailable: 1, selector: { matchLabels: poolSelectorLabels(fleet, pool) } },
  };
}

function configText(fleet: Fleet, pool: Pool): string {
  return stringify(poolConfig(fleet, pool), { lineWidth: 0, aliasDuplicateObjects: false });
}

/** The pool's switchyard config as a ConfigMap, mounted read-only at /etc/switchyard. */
export function poolConfigMap(fleet: Fleet, pool: Pool): IConfigMap {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: names.poolConfig(fleet, pool), namespace: fleet.namespace, labels: fleetLabels(fleet) },
    data: { [CONFIG_KEY]: configText(fleet, pool) },
  };
}
