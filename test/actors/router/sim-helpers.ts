// Scenario builders for router simulation tests: small Llama-3-8B nodes on H100, built in code.
import { normalizeScenario, type Scenario } from '../../../actors/config.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';

/** A scenario of the 8B model with `replicas` replicas (per version) and the given overrides. */
export function smallScenario(over: {
  replicas?: number;
  gpus?: number;
  versions?: string[];
  classes?: object;
  traffic: object[];
  faults?: object[];
  routing?: object;
  policy?: string;
}): Scenario {
  return normalizeScenario({
    name: 'router-test',
    seed: 3,
    node: { gpu: 'H100-SXM', gpus: over.gpus ?? 8 },
    routing: { policy: over.policy ?? 'cost', ...(over.routing ?? {}) },
    models: [
      {
        name: 'llama',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: over.replicas ?? 1,
        versions: over.versions ?? ['v1'],
        classes: over.classes ?? { interactive: {} },
      },
    ],
    traffic: over.traffic,
    faults: over.faults ?? [],
    sim: { checkInvariants: true },
  });
}

/** Poisson traffic of `requests` requests at `rate` req/s with conversation-trace lengths. */
export function poisson(requests: number, rate: number, extra: object = {}): object {
  return {
    model: 'llama',
    priority: 'interactive',
    requests,
    lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
    arrival: { process: 'poisson', rate },
    ...extra,
  };
}

/** Runs `fn` once, just before the first request arrives (after the node has booted and placed its replicas). */
export function afterBoot(cp: ControlPlane, fn: () => void): void {
  const submit = cp.submit;
  let first = true;
  cp.submit = (spec, listener) => {
    if (first) {
      first = false;
      fn();
    }
    return submit(spec, listener);
  };
}

/** Requests that did not end with exactly one terminal record. */
export function withoutOneOutcome(cp: ControlPlane): number {
  const seen = new Map<string, number>();
  for (const r of cp.collector.records) seen.set(r.id, (seen.get(r.id) ?? 0) + 1);
  return cp.live() + [...seen.values()].filter((n) => n !== 1).length;
}
