// Types of the custom resources the renderer writes (only the fields it uses): GIE, Gateway API, Prometheus Operator.

/** inference.networking.k8s.io/v1 InferencePool (GIE's GA API, v1.0.0 onward). */
export interface InferencePool {
  apiVersion: 'inference.networking.k8s.io/v1';
  kind: 'InferencePool';
  metadata: { name: string; namespace: string; labels: Record<string, string> };
  spec: {
    selector: { matchLabels: Record<string, string> };
    targetPorts: { number: number }[];
    appProtocol?: 'http' | 'kubernetes.io/h2c';
    endpointPickerRef: {
      group?: string;
      kind?: string;
      name: string;
      port: { number: number };
      failureMode: 'FailOpen' | 'FailClose';
    };
  };
}

/** gateway.networking.k8s.io/v1 HTTPRoute, with InferencePool backends. */
export interface HTTPRoute {
  apiVersion: 'gateway.networking.k8s.io/v1';
  kind: 'HTTPRoute';
  metadata: { name: string; namespace: string; labels: Record<string, string> };
  spec: {
    parentRefs: { group: string; kind: string; name: string; namespace: string }[];
    hostnames?: string[];
    rules: {
      matches: {
        path: { type: 'PathPrefix' | 'Exact'; value: string };
        headers?: { type: 'Exact'; name: string; value: string }[];
      }[];
      backendRefs: { group: string; kind: string; name: string }[];
      timeouts?: { request: string };
    }[];
  };
}

/** monitoring.coreos.com/v1 PodMonitor (Prometheus Operator). */
export interface PodMonitor {
  apiVersion: 'monitoring.coreos.com/v1';
  kind: 'PodMonitor';
  metadata: { name: string; namespace: string; labels: Record<string, string> };
  spec: {
    selector: { matchLabels: Record<string, string> };
    podMetricsEndpoints: { port: string; path: string; interval: string; scrapeTimeout?: string }[];
  };
}
