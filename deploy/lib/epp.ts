// Per model: the InferencePool selecting every pod that serves it, and its endpoint picker (EPP) reading
// switchyard's metric names. Targets GIE v1.5.0: InferencePool inference.networking.k8s.io/v1, EPP config v1alpha1.
import type { IConfigMap, IService, IServiceAccount } from 'kubernetes-models/v1';
import type { IDeployment } from 'kubernetes-models/apps/v1';
import type { IRole, IRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { stringify } from 'yaml';
import type { InferencePool } from './crd-types.ts';
import type { Fleet } from './fleet.ts';
import { ENGINE_LABEL, ENGINE_NAME, eppSelectorLabels, fleetLabels, modelSelectorLabels, names } from './names.ts';
import { RESTRICTED, terminationGraceSeconds } from './node-pool.ts';
import { HTTP_PORT, METRICS } from './switchyard-cli.ts';

/** The EPP's ports: ext-proc gRPC for the gateway, gRPC health, its own Prometheus metrics. */
export const EPP_PORTS = { extProc: 9002, health: 9003, metrics: 9090 } as const;

/** The key of the EndpointPickerConfig in the EPP's ConfigMap. */
export const EPP_CONFIG_KEY = 'epp-config.yaml';

/**
 * The EndpointPickerConfig: GIE v1.4+ reads metric names from the core-metrics-extractor's engineConfigs (v1.5.0
 * refuses the old --total-queued-requests-metric style flags). Pods are labelled engine-type=switchyard, and the
 * selectors pick this model's series out of pods that may serve several models.
 */
export function eppConfig(model: string): Record<string, unknown> {
  const sel = (metric: string): string => `${metric}{model="${model}"}`;
  return {
    apiVersion: 'inference.networking.x-k8s.io/v1alpha1',
    kind: 'EndpointPickerConfig',
    plugins: [
      { type: 'metrics-data-source', parameters: { scheme: 'http', path: '/metrics' } },
      {
        type: 'core-metrics-extractor',
        parameters: {
          engineLabelKey: ENGINE_LABEL,
          defaultEngine: ENGINE_NAME,
          engineConfigs: [
            {
              name: ENGINE_NAME,
              queuedRequestsSpec: sel(METRICS.queued),
              runningRequestsSpec: sel(METRICS.running),
              kvUsageSpec: sel(METRICS.kvUsage),
              // switchyard has no LoRA adapters and no vLLM-style cache-info gauge: "" disables both.
              loraSpec: '',
              cacheInfoSpec: '',
            },
          ],
        },
      },
      { type: 'queue-scorer' },
      { type: 'kv-cache-utilization-scorer' },
      { type: 'max-score-picker' },
    ],
    schedulingProfiles: [
      {
        name: 'default',
        plugins: [
          { pluginRef: 'queue-scorer', weight: 2 },
          { pluginRef: 'kv-cache-utilization-scorer', weight: 2 },
          { pluginRef: 'max-score-picker' },
        ],
      },
    ],
    dataLayer: {
      sources: [{ pluginRef: 'metrics-data-source', extractors: [{ pluginRef: 'core-metrics-extractor' }] }],
    },
  };
}

/** The model's InferencePool: every ready pod of the fleet labelled as serving the model, on the HTTP port. */
export function inferencePool(fleet: Fleet, model: string): InferencePool {
  return {
    apiVersion: 'inference.networking.k8s.io/v1',
    kind: 'InferencePool',
    metadata: { name: names.inferencePool(fleet, model), namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: {
      selector: { matchLabels: modelSelectorLabels(fleet, model) },
      targetPorts: [{ number: HTTP_PORT }],
      appProtocol: 'http',
      endpointPickerRef: {
        kind: 'Service',
        name: names.epp(fleet, model),
        port: { number: EPP_PORTS.extProc },
        // If the picker is down the gateway still forwards (to any pool pod) rather than failing every request.
        failureMode: 'FailOpen',
      },
    },
  };
}

function eppMeta(fleet: Fleet, model: string): { name: string; namespace: string; labels: Record<string, string> } {
  return {
    name: names.epp(fleet, model),
    namespace: fleet.namespace,
    labels: { ...fleetLabels(fleet), ...eppSelectorLabels(fleet, model) },
  };
}

/** The EPP's identity and the read access it needs: pods, its InferencePool, GIE's objective CRDs. */
export function eppRbac(fleet: Fleet, model: string): [IServiceAccount, IRole, IRoleBinding] {
  const meta = eppMeta(fleet, model);
  const read = ['get', 'watch', 'list'];
  return [
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: meta },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: meta,
      rules: [
        { apiGroups: [''], resources: ['pods'], verbs: read },
        { apiGroups: ['inference.networking.k8s.io'], resources: ['inferencepools'], verbs: read },
        {
          apiGroups: ['inference.networking.x-k8s.io'],
          resources: ['inferenceobjectives', 'inferencemodelrewrites'],
          verbs: read,
        },
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: meta,
      subjects: [{ kind: 'ServiceAccount', name: meta.name, namespace: fleet.namespace }],
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: meta.name },
    },
  ];
}

/** The EPP's EndpointPickerConfig as a ConfigMap. */
export function eppConfigMap(fleet: Fleet, model: string): IConfigMap {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: eppMeta(fleet, model),
    data: { [EPP_CONFIG_KEY]: stringify(eppConfig(model), { lineWidth: 0, aliasDuplicateObjects: false }) },
  };
}

/** The EPP Deployment: one replica (its scorers keep state), replaced by Recreate as GIE recommends. */
export function eppDeployment(fleet: Fleet, model: string): IDeployment {
  const meta = eppMeta(fleet, model);
  const grpc = (periodSeconds: number): { grpc: { port: number; service: string }; periodSeconds: number } => ({
    grpc: { port: EPP_PORTS.health, service: 'inference-extension' },
    periodSeconds,
  });
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: meta,
    spec: {
      replicas: 1,
      strategy: { type: 'Recreate' },
      selector: { matchLabels: eppSelectorLabels(fleet, model) },
      template: {
        metadata: { labels: meta.labels },
        spec: {
          serviceAccountName: meta.name,
          // As long as the longest grace period of the pool's pods, so in-flight picks outlive a node's drain.
          terminationGracePeriodSeconds: terminationGraceSeconds(fleet),
          containers: [
            {
              name: 'epp',
              image: fleet.epp.image,
              args: [
                '--pool-name',
                names.inferencePool(fleet, model),
                '--pool-group',
                'inference.networking.k8s.io',
                '--config-file',
                `/config/${EPP_CONFIG_KEY}`,
                '--refresh-metrics-interval',
                '50ms',
                '--zap-encoder',
                'json',
                '--tracing=false',
                '--metrics-endpoint-auth=false',
              ],
              env: [
                // The EPP finds its pool's namespace here, so an overlay may move the fleet to another namespace.
                { name: 'NAMESPACE', valueFrom: { fieldRef: { fieldPath: 'metadata.namespace' } } },
                { name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
              ],
              ports: [
                { name: 'grpc', containerPort: EPP_PORTS.extProc },
                { name: 'grpc-health', containerPort: EPP_PORTS.health },
                { name: 'metrics', containerPort: EPP_PORTS.metrics },
              ],
              livenessProbe: { ...grpc(10), initialDelaySeconds: 5 },
              readinessProbe: grpc(2),
              resources: { requests: { cpu: '2', memory: '4Gi' }, limits: { memory: '8Gi' } },
              securityContext: RESTRICTED,
              volumeMounts: [{ name: 'config', mountPath: '/config', readOnly: true }],
            },
          ],
          volumes: [{ name: 'config', configMap: { name: meta.name } }],
        },
      },
    },
  };
}

/** The EPP's Service: the InferencePool's endpointPickerRef points the gateway's ext-proc at it. */
export function eppService(fleet: Fleet, model: string): IService {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: eppMeta(fleet, model),
    spec: {
      type: 'ClusterIP',
      selector: eppSelectorLabels(fleet, model),
      ports: [
        { name: 'grpc-ext-proc', port: EPP_PORTS.extProc, targetPort: 'grpc', protocol: 'TCP', appProtocol: 'http2' },
        { name: 'http-metrics', port: EPP_PORTS.metrics, targetPort: 'metrics', protocol: 'TCP' },
      ],
    },
  };
}
