// Names and labels every manifest agrees on: which pods a Deployment, an InferencePool and a policy select.
import type { Fleet, Pool } from './fleet.ts';

/** The label set on every object of a fleet. */
export function fleetLabels(fleet: Fleet): Record<string, string> {
  return {
    'app.kubernetes.io/name': 'switchyard',
    'app.kubernetes.io/instance': fleet.name,
    'app.kubernetes.io/part-of': 'switchyard',
    'app.kubernetes.io/managed-by': 'switchyard-render',
  };
}

/** Labels that select every switchyard node pod of the fleet (PodMonitor, NetworkPolicy). */
export function nodeSelectorLabels(fleet: Fleet): Record<string, string> {
  return {
    'app.kubernetes.io/name': 'switchyard',
    'app.kubernetes.io/instance': fleet.name,
    'app.kubernetes.io/component': 'node',
  };
}

/** Labels that select one pool's pods (the Deployment's selector and its PodDisruptionBudget). */
export function poolSelectorLabels(fleet: Fleet, pool: Pool): Record<string, string> {
  return { ...nodeSelectorLabels(fleet), 'switchyard.dev/pool': pool.name };
}

/** The label that says a pod serves a model; an InferencePool selects on it. */
export function modelLabelKey(model: string): string {
  return `model.switchyard.dev/${model}`;
}

/** The pod label the endpoint picker reads to choose the metric names it scrapes (GIE engineLabelKey default). */
export const ENGINE_LABEL = 'inference.networking.k8s.io/engine-type';

/** The engine name under which the endpoint picker's config lists switchyard's metric names. */
export const ENGINE_NAME = 'switchyard';

/** Every label a pool's pods carry: selector labels, mode, the models they serve, the engine type. */
export function poolPodLabels(fleet: Fleet, pool: Pool): Record<string, string> {
  const labels: Record<string, string> = {
    ...fleetLabels(fleet),
    ...poolSelectorLabels(fleet, pool),
    'switchyard.dev/mode': pool.mode,
    [ENGINE_LABEL]: ENGINE_NAME,
  };
  for (const m of pool.models) labels[modelLabelKey(m.name)] = 'true';
  return labels;
}

/** Labels that select every pod (in any pool) that serves a model: the InferencePool's selector. */
export function modelSelectorLabels(fleet: Fleet, model: string): Record<string, string> {
  return { ...nodeSelectorLabels(fleet), [modelLabelKey(model)]: 'true' };
}

/** A model name as a DNS label fragment (dots are not allowed in most object names' labels). */
export function dnsName(model: string): string {
  return model.replace(/\./g, '-');
}

/** Object names, one place. */
export const names = {
  pool: (fleet: Fleet, pool: Pool): string => `${fleet.name}-${pool.name}`,
  poolConfig: (fleet: Fleet, pool: Pool): string => `${fleet.name}-${pool.name}-config`,
  tokens: (fleet: Fleet): string => `${fleet.name}-tokens`,
  inferencePool: (fleet: Fleet, model: string): string => `${fleet.name}-${dnsName(model)}`,
  epp: (fleet: Fleet, model: string): string => `${fleet.name}-${dnsName(model)}-epp`,
};

/** Labels that select one model's endpoint picker pods. */
export function eppSelectorLabels(fleet: Fleet, model: string): Record<string, string> {
  return {
    'app.kubernetes.io/name': 'switchyard-epp',
    'app.kubernetes.io/instance': fleet.name,
    'app.kubernetes.io/component': 'endpoint-picker',
    'switchyard.dev/model': dnsName(model),
  };
}
