// Objects shared by a fleet's pools: network policies, the PodMonitor, the HTTPRoute and the tokens Secret template.
import type { ISecret } from 'kubernetes-models/v1';
import type {
  INetworkPolicy,
  INetworkPolicyEgressRule,
  INetworkPolicyPeer,
} from 'kubernetes-models/networking.k8s.io/v1';
import type { HTTPRoute, PodMonitor } from './crd-types.ts';
import { EPP_PORTS } from './epp.ts';
import { fleetModels, type Fleet } from './fleet.ts';
import { fleetLabels, names, nodeSelectorLabels } from './names.ts';
import { CLIENT_PATHS, HTTP_PORT, TOKEN_KEYS } from './switchyard-cli.ts';

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

/** Egress to the cluster DNS (UDP and TCP 53): the one destination every pod of the fleet may reach. */
function dnsEgress(fleet: Fleet): INetworkPolicyEgressRule {
  return {
    to: [
      {
        namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': fleet.dns.namespace } },
        podSelector: { matchLabels: fleet.dns.podLabels },
      },
    ],
    ports: [
      { protocol: 'UDP', port: 53 },
      { protocol: 'TCP', port: 53 },
    ],
  };
}

/**
 * Ingress to the node pods: the gateway (client traffic the EPP picked this pod for), the fleet's EPPs (scraping
 * /metrics) and Prometheus, on the one HTTP port. Egress: DNS only. The worker talks to the control plane over the
 * pod's loopback, which no policy filters and no other pod can reach (serve accepts /v1/node from loopback only).
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
      policyTypes: ['Ingress', 'Egress'],
      ingress: [
        { from: [gatewayPeer(fleet), eppPeer, prometheusPeer(fleet)], ports: [{ protocol: 'TCP', port: 'http' }] },
      ],
      egress: [dnsEgress(fleet)],
    },
  };
}

/**
 * Ingress to the endpoint pickers: the gateway on ext-proc, Prometheus on the EPP's metrics port. Egress: DNS, the
 * node pods' HTTP port (it scrapes /metrics) and the Kubernetes API (it watches pods and its InferencePool).
 */
export function eppNetworkPolicy(fleet: Fleet): INetworkPolicy {
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: `${fleet.name}-epp`, namespace: fleet.namespace, labels: fleetLabels(fleet) },
    spec: {
      podSelector: { matchLabels: { 'app.kubernetes.io/instance': fleet.name, ...EPP_COMPONENT } },
      policyTypes: ['Ingress', 'Egress'],
      ingress: [
        { from: [gatewayPeer(fleet)], ports: [{ protocol: 'TCP', port: EPP_PORTS.extProc }] },
        { from: [prometheusPeer(fleet)], ports: [{ protocol: 'TCP', port: EPP_PORTS.metrics }] },
      ],
      egress: [
        dnsEgress(fleet),
        {
          to: [{ podSelector: { matchLabels: nodeSelectorLabels(fleet) } }],
          ports: [{ protocol: 'TCP', port: HTTP_PORT }],
        },
        {
          to: fleet.apiServer.cidrs.map((cidr) => ({ ipBlock: { cidr } })),
          ports: fleet.apiServer.ports.map((port) => ({ protocol: 'TCP', port })),
        },
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
 * and the rule sends it to that model's InferencePool. Only the client paths are routed, each exactly: never the
 * worker link (/v1/node), the inspector (/v1/inspect), /admin or the probes. A request without a body (GET /v1/models,
 * the /v1/ws upgrade) names its model in that header itself.
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
      ...(fleet.gateway.hostnames.length > 0 ? { hostnames: fleet.gateway.hostnames } : {}),
      rules: fleetModels(fleet).map((model) => ({
        matches: CLIENT_PATHS.map((value) => ({
          path: { type: 'Exact' as const, value },
          headers: [{ type: 'Exact' as const, name: 'X-Gateway-Model-Name', value: model }],
        })),
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
