// Rollouts users start (the scenario's `rollout:`, `POST /admin/rollout`, `switchyard rollout`): each request is
// checked (the model and both versions exist, the versions differ, the model is not already rolling) and refused
// with a typed failure, or started on the control plane's placement and model table.
import { failure, type Failure } from '../../machines/outcomes.ts';
import type { ControlPlane } from '../control-plane.ts';
import { startRollout, type Rollout } from '../router/rollout.ts';
import type { PersistedRollout } from './state-file.ts';

/** What a user asks to roll out. */
export interface RolloutRequest {
  model: string;
  from: string;
  to: string;
  /** Steps to take (default: one per replica). */
  steps?: number;
  /** Replicas of `to` at the end (default: as many as `from` has); set when a persisted rollout resumes. */
  replicas?: number;
}

/** The rollouts of one control plane. */
export interface Rollouts {
  /** Starts a rollout, or says why not. */
  start(req: RolloutRequest): { ok: true; rollout: Rollout } | { ok: false; failure: Failure };
  /** Rollouts still running (for the state file: restored and resumed at start). */
  running(): PersistedRollout[];
  /** Every rollout started, with its progress. */
  list(): { model: string; from: string; to: string; done: boolean; events: readonly { t: number; what: string }[] }[];
}

/** Checks a rollout request against the control plane's models; null when it may start. */
export function checkRollout(cp: ControlPlane, req: RolloutRequest, running: readonly Rollout[]): Failure | null {
  const m = cp.scenario.models.find((x) => x.name === req.model);
  if (!m)
    return failure(
      'model_not_found',
      `no model ${req.model}; models: ${cp.scenario.models.map((x) => x.name).join(', ')}`,
    );
  for (const v of [req.from, req.to])
    if (!m.versions.includes(v))
      return failure('model_not_found', `${req.model} has no version ${v}; versions: ${m.versions.join(', ')}`);
  if (req.from === req.to) return failure('invalid_request', `from and to are both ${req.from}`);
  if (req.steps !== undefined && !(Number.isInteger(req.steps) && req.steps >= 1 && req.steps <= 1024))
    return failure('invalid_request', `steps must be an integer from 1 to 1024, got ${req.steps}`);
  if (running.some((r) => r.spec.model === req.model && !r.done))
    return failure('invalid_request', `${req.model} is already rolling out; wait for it to finish`);
  return null;
}

/** Creates the rollouts of `cp`; `changed` is called when one starts or finishes (to persist them). */
export function createRollouts(cp: ControlPlane, changed: () => void = () => {}): Rollouts {
  const all: Rollout[] = [];
  const watchDone = (r: Rollout): void => {
    if (r.done) return changed();
    cp.runtime.clock.setTimeout(() => watchDone(r), 1_000);
  };
  return {
    start: (req) => {
      const refused = checkRollout(cp, req, all);
      if (refused) return { ok: false, failure: refused };
      const rollout = startRollout(
        { clock: cp.runtime.clock, placement: cp.placement, registry: cp.router.registry },
        {
          model: req.model,
          from: req.from,
          to: req.to,
          ...(req.steps !== undefined ? { steps: req.steps } : {}),
          ...(req.replicas !== undefined ? { replicas: req.replicas } : {}),
        },
      );
      all.push(rollout);
      changed();
      watchDone(rollout);
      return { ok: true, rollout };
    },
    running: () =>
      all
        .filter((r) => !r.done)
        .map((r) => ({
          model: r.spec.model,
          from: r.spec.from,
          to: r.spec.to,
          ...(r.spec.steps !== undefined ? { steps: r.spec.steps } : {}),
          ...(r.spec.replicas !== undefined ? { replicas: r.spec.replicas } : {}),
        })),
    list: () =>
      all.map((r) => ({ model: r.spec.model, from: r.spec.from, to: r.spec.to, done: r.done, events: r.events })),
  };
}
