// The DST's promises about control-plane restarts (P12–P14), checked RESTART_BOUND_MS after each new control plane
// starts, against what the worker served intact when the old one crashed:
// P12 no replica whose worker state was intact (every GPU of it serving or loading it, at one epoch) is reloaded: the
//     new control plane runs it at the same epoch and the worker's load counters for its GPUs have not moved (a load
//     under way continues, it does not start again);
// P13 admission resumes within the bound: each such replica that was serving is ready and accepting again;
// P14 no GPU is in two replicas: the control plane's owner of every GPU the worker reports loading or serving is
//     that GPU's replica on the worker (or nobody).
// A replica is judged only when no GPU fault, hang, straggler, silent GPU, partition or worker crash was active on
// its GPUs between the crash and the check; and only if the new control plane wants it (a replica of its id exists).
import type { ControlPlane } from '../control-plane.ts';
import type { DstFault } from './dst.ts';
import type { DstSystem } from './dst-system.ts';

/** Virtual ms from a new control plane's start by which P12–P14 must hold. */
export const RESTART_BOUND_MS = 2_000;

/** The restart watcher of one seed. */
export interface RestartCheck {
  /** The control plane is about to crash: what the worker serves intact now is remembered. */
  crashed(): void;
  /** A new control plane started: the checks run RESTART_BOUND_MS later. */
  started(cp: ControlPlane): void;
}

interface Intact {
  id: string;
  serving: boolean;
  model: string;
  epoch: number;
  devices: number[];
  loads: number[];
}

/** Replicas the worker serves or loads on every GPU the crashing control plane gave them, at one epoch. */
function intactReplicas(sys: DstSystem): Intact[] {
  const agent = sys.agent();
  const cp = sys.cp;
  if (!agent || !cp) return [];
  const inv = agent.inventory();
  const out: Intact[] = [];
  for (const r of cp.placement.replicas.values()) {
    const devs = r.gpus.map((g) => inv.devices.find((d) => d.gpu === g));
    const epoch = devs[0]?.epoch;
    if (epoch === undefined) continue;
    const state = devs[0]?.state;
    if (state !== 'serving' && state !== 'loading') continue;
    if (!devs.every((d) => d?.state === state && d.replica === r.id && d.epoch === epoch)) continue;
    out.push({
      id: r.id,
      serving: state === 'serving',
      model: r.model,
      epoch,
      devices: [...r.gpus],
      loads: r.gpus.map((g) => agent.loads(g)),
    });
  }
  return out;
}

/** Watches a seed's restarts; violations go to `violate`. */
export function watchRestart(
  sys: DstSystem,
  faults: readonly DstFault[],
  origin: number,
  violate: (p: string, what: string) => void,
): RestartCheck {
  let intact: Intact[] = [];
  let crashAt = 0;
  // Whether a fault other than a restart, a client disconnect or extra latency was active on `gpu` in [from, to].
  const touched = (gpu: number, from: number, to: number): boolean =>
    faults.some((f) => {
      if (f.kind === 'client-disconnect' || f.kind === 'delay' || f.kind === 'control-restart') return false;
      if ('gpu' in f && f.gpu !== gpu) return false;
      const a = origin + f.at * 1000;
      const endS = 'repairAt' in f ? f.repairAt : 'until' in f ? f.until : 'restartAt' in f ? f.restartAt : undefined;
      const b = endS === undefined ? Infinity : origin + endS * 1000;
      return a <= to && from <= b;
    });

  const check = (cp: ControlPlane, remembered: Intact[], from: number): void => {
    if (sys.cp !== cp) return;
    const agent = sys.agent();
    const now = sys.clock.now();
    for (const i of remembered) {
      if (i.devices.some((g) => touched(g, from, now))) continue;
      const r = cp.placement.replicas.get(i.id);
      if (!r) continue;
      const loaded = i.devices.filter((g, k) => (agent?.loads(g) ?? 0) !== i.loads[k]);
      if (r.epoch !== i.epoch || loaded.length > 0)
        violate(
          'P12',
          `${i.id}: ${i.serving ? 'serving' : 'loading'} intact at epoch ${i.epoch} when the control plane crashed, runs at epoch ${r.epoch} after the restart${loaded.length > 0 ? `, GPUs ${loaded.join(',')} loaded again` : ''}`,
        );
      else if (i.serving && (!r.ready() || !r.accepting()))
        violate('P13', `${i.id}: not ready ${RESTART_BOUND_MS} ms after the restart (${r.state()})`);
    }
    if (!agent) return;
    for (const d of agent.inventory().devices) {
      if (d.state !== 'serving' && d.state !== 'loading') continue;
      const owner = cp.placement.gpus.get(d.gpu)?.owner ?? null;
      if (owner !== null && owner !== d.replica)
        violate('P14', `gpu ${d.gpu}: ${d.replica ?? '?'} on the worker, ${owner} on the control plane`);
    }
  };

  return {
    crashed: () => {
      intact = intactReplicas(sys);
      crashAt = sys.clock.now();
    },
    started: (cp) => {
      const remembered = intact;
      const from = crashAt;
      intact = [];
      sys.clock.setTimeout(() => check(cp, remembered, from), RESTART_BOUND_MS);
    },
  };
}
