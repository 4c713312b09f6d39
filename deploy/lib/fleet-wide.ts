// Objects shared by a fleet's pools: network policies, the PodMonitor, the HTTPRoute and the tokens Secret template.
import type { ISecret } from 'kubernetes-models/v1';
import type { INetworkPolicy, INetworkPolicyPeer } from 'kubernetes-models/networking.k8s.io/v1';
import type { HTTPRoute, PodMonitor } from './crd-types.ts';
import { EPP_PORTS } from './epp.ts';
import { fleetModels, type Fleet } from './fleet.ts';
import { fleetLabels, names, nodeSelectorLabels } from './names.ts';
import { TOKEN_KEYS } from './switchyard-cli.ts';

/** The value every key of the Secret template carries: never a token, always something `serve` must refuse. */
export const TOKEN_PLACEHOLDER = 'REPLACE-ME-see-docs-kubernetes-md';

/** The label every endpoint picker pod of a fleet carries. */
const EPP_COMPONENT = { 'app.kubernetes.io/component': 'endpoint-picker' };

function gatewayPeer(fleet: Fleet): INetworkPolicyPeer {
  return {
    namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': fleet.gateway.namespace } },
    podSelector: { matchLabels: fleet.gateway.podLabels },
  };
}

function prometheusPeer(fleet: Fleet): INetworkPolicyPeer {
  return {
    namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': fleet.prometheus.namespace } },
    podSelector: { matchLabels: fleet.prometheus.podLabels },
  };
}

/**
 * Ingress to the node pods: the gateway (client traffic the EPP picked this pod for), the fleet's EPPs (scraping
 * /metrics) and Prometheus, on the one HTTP port. The worker talks to the control plane over loopback, unaffected.
 */
export function nodeNetworkPolicy(fleet: Fleet): INetworkPolicy {
  const eppPeer: INetworkPolicyPeer = {
    podSelector: { matchLabels: { 'app.kubernetes.io/instance': fleet.name, ...EPP_COMPONENT } },
  };
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: `${fleet.name}-nodes`, namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: {
      podSelector: { matchLabels: nodeSelectorLabels(fleet) },
      policyTypes: ['Ingress'],
      ingress: [
        { from: [gatewayPeer(fleet), eppPeer, prometheusPeer(fleet)], ports: [{ protocol: 'TCP', port: 'http' }] },
      ],
    },
  };
}

/** Ingress to the endpoint pickers: the gateway on ext-proc, Prometheus on the EPP's metrics port. */
export function eppNetworkPolicy(fleet: Fleet): INetworkPolicy {
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: `${fleet.name}-epp`, namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: {
      podSelector: { matchLabels: { 'app.kubernetes.io/instance': fleet.name, ...EPP_COMPONENT } },
      policyTypes: ['Ingress'],
      ingress: [
        { from: [gatewayPeer(fleet)], ports: [{ protocol: 'TCP', port: EPP_PORTS.extProc }] },
        { from: [prometheusPeer(fleet)], ports: [{ protocol: 'TCP', port: EPP_PORTS.metrics }] },
      ],
    },
  };
}

/** Prometheus scrapes every node pod's /metrics on the HTTP port. */
export function podMonitor(fleet: Fleet): PodMonitor {
  return {
    apiVersion: 'monitoring.coreos.com/v1',
    kind: 'PodMonitor',
    metadata: { name: `${fleet.name}-nodes`, namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: {
      selector: { matchLabels: nodeSelectorLabels(fleet) },
      podMetricsEndpoints: [{ port: 'http', path: '/metrics', interval: '15s', scrapeTimeout: '10s' }],
    },
  };
}

/**
 * One rule per model: the gateway's body-based router copies the request's `model` into X-Gateway-Model-Name,
 * and the rule sends it to that model's InferencePool. Only the OpenAI API (/v1) is routed; /admin never is.
 */
export function httpRoute(fleet: Fleet): HTTPRoute {
  return {
    apiVersion: 'gateway.networking.k8s.io/v1',
    kind: 'HTTPRoute',
    metadata: { name: fleet.name, namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: {
      parentRefs: [
        {
          group: 'gateway.networking.k8s.io',
          kind: 'Gateway',
          name: fleet.gateway.name,
          namespace: fleet.gateway.namespace,
        },
      ],
      rules: fleetModels(fleet).map((model) => ({
        matches: [
          {
            path: { type: 'PathPrefix' as const, value: '/v1' },
            headers: [{ type: 'Exact' as const, name: 'X-Gateway-Model-Name', value: model }],
          },
        ],
        backendRefs: [
          { group: 'inference.networking.k8s.io', kind: 'InferencePool', name: names.inferencePool(fleet, model) },
        ],
        timeouts: { request: '600s' },
      })),
    },
  };
}

/** The tokens Secret's shape with placeholders only; create the real one with `kubectl create secret generic`. */
export function tokensSecretTemplate(fleet: Fleet): ISecret {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: names.tokens(fleet), namespace: fleet.namespace, labels: fleetLabels(fleet) },
    type: 'Opaque',
    stringData: Object.fromEntries(Object.values(TOKEN_KEYS).map((t) => [t.key, TOKEN_PLACEHOLDER])),
  };
}
