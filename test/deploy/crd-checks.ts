// Structural checks, written here, for the custom resources kubernetes-models does not cover: InferencePool (GIE v1),
// HTTPRoute (Gateway API v1) and PodMonitor (Prometheus Operator v1). Only the fields the renderer uses are checked.

type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DURATION = /^([0-9]{1,5}(h|m|s|ms)){1,4}$/;

function at(o: unknown, path: string): unknown {
  return path.split('.').reduce<unknown>((v, k) => (isObj(v) ? v[k] : Array.isArray(v) ? v[Number(k)] : undefined), o);
}

function port(v: unknown): boolean {
  return typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= 65535;
}

function metadata(o: Obj, errors: string[]): void {
  const name = at(o, 'metadata.name');
  if (typeof name !== 'string' || name.length > 253 || !DNS_SUBDOMAIN.test(name)) errors.push('metadata.name');
  if (typeof at(o, 'metadata.namespace') !== 'string') errors.push('metadata.namespace');
}

function matchLabels(v: unknown, path: string, errors: string[]): void {
  if (!isObj(v) || Object.keys(v).length === 0 || Object.keys(v).length > 64) {
    errors.push(`${path} must be a map of 1 to 64 labels`);
    return;
  }
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string' || val.length > 63 || !LABEL_VALUE.test(val)) errors.push(`${path}.${k}`);
  }
}

/** Errors of an inference.networking.k8s.io/v1 InferencePool, after the CRD of GIE v1.5.0; [] when well formed. */
export function checkInferencePool(o: Obj): string[] {
  const errors: string[] = [];
  if (o['apiVersion'] !== 'inference.networking.k8s.io/v1') errors.push('apiVersion');
  metadata(o, errors);
  matchLabels(at(o, 'spec.selector.matchLabels'), 'spec.selector.matchLabels', errors);
  const ports = at(o, 'spec.targetPorts');
  if (!Array.isArray(ports) || ports.length < 1 || ports.length > 8) errors.push('spec.targetPorts must hold 1 to 8');
  else {
    const numbers = ports.map((p: unknown) => at(p, 'number'));
    if (!numbers.every(port)) errors.push('spec.targetPorts[].number');
    if (new Set(numbers).size !== numbers.length) errors.push('spec.targetPorts numbers must be unique');
  }
  const proto = at(o, 'spec.appProtocol');
  if (proto !== undefined && proto !== 'http' && proto !== 'kubernetes.io/h2c') errors.push('spec.appProtocol');
  const ref = at(o, 'spec.endpointPickerRef');
  if (!isObj(ref)) return [...errors, 'spec.endpointPickerRef is required'];
  if (typeof ref['name'] !== 'string' || ref['name'].length === 0) errors.push('spec.endpointPickerRef.name');
  const kind = ref['kind'] ?? 'Service';
  if (kind === 'Service' && !port(at(ref, 'port.number'))) errors.push('spec.endpointPickerRef.port is required');
  if (!['FailOpen', 'FailClose', undefined].includes(ref['failureMode'] as string)) errors.push('failureMode');
  return errors;
}

/** Errors of a gateway.networking.k8s.io/v1 HTTPRoute (parents, host names, path and header matches, backends,
 * timeouts). */
export function checkHTTPRoute(o: Obj): string[] {
  const errors: string[] = [];
  if (o['apiVersion'] !== 'gateway.networking.k8s.io/v1') errors.push('apiVersion');
  metadata(o, errors);
  const parents = at(o, 'spec.parentRefs');
  if (!Array.isArray(parents) || parents.length === 0) errors.push('spec.parentRefs');
  else if (!parents.every((p: unknown) => typeof at(p, 'name') === 'string')) errors.push('spec.parentRefs[].name');
  const hostnames = at(o, 'spec.hostnames');
  const okHost = (h: unknown): boolean => typeof h === 'string' && h.length <= 253 && /^(\*\.)?[a-z0-9.-]+$/.test(h);
  if (hostnames !== undefined && !(Array.isArray(hostnames) && hostnames.length <= 16 && hostnames.every(okHost)))
    errors.push('spec.hostnames');
  const rules = at(o, 'spec.rules');
  if (!Array.isArray(rules) || rules.length === 0 || rules.length > 16) return [...errors, 'spec.rules 1 to 16'];
  rules.forEach((r: unknown, i) => {
    const matches = at(r, 'matches');
    if (!Array.isArray(matches) || matches.length > 64) errors.push(`spec.rules[${i}].matches`);
    for (const m of Array.isArray(matches) ? matches : []) {
      const type = at(m, 'path.type');
      const value = at(m, 'path.value');
      if (!['Exact', 'PathPrefix'].includes(type as string) || typeof value !== 'string' || !value.startsWith('/')) {
        errors.push(`spec.rules[${i}].matches[].path`);
      }
      const headers = at(m, 'headers');
      const okHeader = (h: unknown): boolean => at(h, 'type') === 'Exact' && typeof at(h, 'name') === 'string';
      if (headers !== undefined && !(Array.isArray(headers) && headers.every(okHeader))) {
        errors.push(`spec.rules[${i}].matches[].headers`);
      }
    }
    const backends = at(r, 'backendRefs');
    if (!Array.isArray(backends) || backends.length === 0) errors.push(`spec.rules[${i}].backendRefs`);
    const timeout = at(r, 'timeouts.request');
    if (timeout !== undefined && !(typeof timeout === 'string' && DURATION.test(timeout))) {
      errors.push(`spec.rules[${i}].timeouts.request`);
    }
  });
  return errors;
}

/** Errors of a monitoring.coreos.com/v1 PodMonitor (selector and endpoints by named port). */
export function checkPodMonitor(o: Obj): string[] {
  const errors: string[] = [];
  if (o['apiVersion'] !== 'monitoring.coreos.com/v1') errors.push('apiVersion');
  metadata(o, errors);
  matchLabels(at(o, 'spec.selector.matchLabels'), 'spec.selector.matchLabels', errors);
  const endpoints = at(o, 'spec.podMetricsEndpoints');
  if (!Array.isArray(endpoints) || endpoints.length === 0) return [...errors, 'spec.podMetricsEndpoints'];
  for (const e of endpoints) {
    if (typeof at(e, 'port') !== 'string') errors.push('podMetricsEndpoints[].port');
    if (typeof at(e, 'path') !== 'string' || !(at(e, 'path') as string).startsWith('/')) errors.push('path');
    for (const k of ['interval', 'scrapeTimeout']) {
      const d = at(e, k);
      if (d !== undefined && !(typeof d === 'string' && DURATION.test(d))) errors.push(`podMetricsEndpoints[].${k}`);
    }
  }
  return errors;
}
