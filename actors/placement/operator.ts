// The operator layer of a serving control plane: rollouts, and the operator state file kept in step with every admin
// change (placement and routing policy, GPUs marked failed, rollouts and the replica counts they set). At start the
// file's state is restored: policies at once, replica counts before the node reports (so replicas a rollout placed are
// adopted, not reclaimed), GPUs marked failed once the node registers, unfinished rollouts once replicas exist.
import type { ControlPlane } from '../control-plane.ts';
import type { NodeLink } from '../node-link.ts';
import { createRollouts, type Rollouts } from './rollouts.ts';
import { saveState, type OperatorState } from './state-file.ts';

/** What the admin API gets from the operator layer. */
export interface Operator {
  rollouts: Rollouts;
  changed(change: { gpu?: number; failed?: boolean }): void;
}

/** Options of the operator layer. */
export interface OperatorOptions {
  /** The state file; absent keeps nothing across restarts. */
  statePath?: string;
  /** The state read at start (from loadState), if any. */
  restored?: OperatorState | null;
  log?(line: string): void;
}

/** Creates the operator layer of `cp` and restores the persisted state. */
export function createOperator(cp: ControlPlane, node: NodeLink, opts: OperatorOptions): Operator {
  const log = opts.log ?? (() => {});
  const failed = new Set<number>(opts.restored?.failedGpus ?? []);
  let placementPolicy = cp.placement.policy();
  const persist = (): void => {
    if (!opts.statePath) return;
    const state: OperatorState = {
      placement: { policy: placementPolicy },
      routing: { policy: cp.router.policy },
      failedGpus: [...failed].sort((a, b) => a - b),
      rollouts: rollouts.running(),
      counts: cp.placement.replicaCounts(),
    };
    try {
      saveState(opts.statePath, cp.scenario.name, state);
    } catch (e) {
      log(`cannot write the state file ${opts.statePath}: ${(e as Error).message}`);
    }
  };
  const rollouts = createRollouts(cp, persist);
  const r = opts.restored;
  if (r) {
    if (r.placement.policy !== placementPolicy) {
      const refused = cp.placement.setPolicy(r.placement.policy);
      if (refused) log(`state file: placement policy ${r.placement.policy} not restored: ${refused.message}`);
      placementPolicy = cp.placement.policy();
    }
    cp.router.setPolicy(r.routing.policy);
    for (const [key, n] of Object.entries(r.counts)) {
      const at = key.lastIndexOf('@');
      cp.placement.setReplicas(key.slice(0, at), key.slice(at + 1), n);
    }
    log(`restored operator state from ${opts.statePath ?? '?'}`);
    // GPUs an operator marked failed stay failed even if the worker restarted meanwhile; rollouts resume once the
    // node has reported (a rollout reads the replicas that exist).
    const pending = { gpus: failed.size > 0, rollouts: [...r.rollouts] };
    const resume = (): void => {
      if (node.connected() && pending.gpus) {
        pending.gpus = false;
        for (const gpu of failed) cp.runtime.send('node', { type: 'gpu.inject', gpu, fault: 'fault' });
      }
      if (node.connected() && cp.placement.replicas.size > 0 && pending.rollouts.length > 0) {
        for (const ro of pending.rollouts.splice(0)) {
          const started = rollouts.start(ro);
          log(started.ok ? `resumed the rollout of ${ro.model}` : `rollout of ${ro.model}: ${started.failure.message}`);
        }
      }
      if (pending.gpus || pending.rollouts.length > 0) cp.runtime.clock.setTimeout(resume, 200);
    };
    resume();
  }
  return {
    rollouts,
    changed: (c) => {
      if (c.gpu !== undefined) {
        if (c.failed) failed.add(c.gpu);
        else failed.delete(c.gpu);
      }
      placementPolicy = cp.placement.policy();
      persist();
    },
  };
}
