// The state of the tensor-parallel composition, and its keys up to a permutation of the GPUs.
import type { AnyMachineSnapshot } from 'xstate';

/** A message between the entities of the composition. */
export type Msg = { type: string; [k: string]: unknown };

/** One GPU of the gang: its machine, its rank's share of the core's step, its links, and what placement and the
 * checker know of it. */
export interface Gpu {
  snap: AnyMachineSnapshot;
  /** This rank's share of the step the engine core runs: running, finished (the step waits for other ranks), or none. */
  exec: 'running' | 'finished' | null;
  /** Commands from the replica not yet delivered (FIFO mode). */
  down: Msg[];
  /** Reports from this GPU to the control plane, in order: `[to, msg]`. */
  up: [string, Msg][];
  /** Placement's ownership table: this GPU belongs to the replica. */
  owner: boolean;
  /** It faulted while it still held (or was being handed to) the replica. */
  ownedFault: boolean;
  /** It faulted after it had released the replica. */
  freeFault: boolean;
  /** Its answer to a release reached the replica. Until one does (an answer can be lost), the replica still counts
   * the GPU as its own, so a fault in the meantime is a fault of the replica's GPU. */
  releaseHeard: boolean;
}

/** One state of the composition. */
export interface World {
  replica: AnyMachineSnapshot;
  /** The replica is still reachable by its system id (placement unregisters it once stopped). */
  registered: boolean;
  gpus: Gpu[];
  /** The engine core beside the gang's engine: running (until any rank aborts), the units it holds (a step runs
   * whenever it holds any; each step finishes one), and the submits it received. */
  coreLive: boolean;
  coreHeld: number;
  coreReceived: number;
  /** Submits on their way to the core (FIFO mode). */
  submits: number;
  /** The core's progress reports on their way to the control plane, in order. */
  progress: Msg[];
  /** The control plane's side of the replica: units it holds (handed to the core, neither finished nor handed
   * back), submits it sent, the saturation it last heard, and whether its handling of progress threw. */
  held: number;
  sent: number;
  saturated: boolean;
  crashed: boolean;
  arrived: number;
  completed: number;
  interrupted: number;
  faults: number;
  /** Times the control plane's handling of progress threw. */
  crashes: number;
  drained: boolean;
  /** Epochs of the `replica.failed` messages placement heard. */
  failedEpochs: number[];
  /** A fault or a crash reached the replica while it was loading, ready or draining (so it must fail). */
  failureWhileServing: boolean;
  /** Messages the environment lost so far. */
  lost: number;
  /** Replica retries fired while other things could still happen. */
  retried: number;
}

const ctx = (s: AnyMachineSnapshot): Record<string, unknown> => s.context as Record<string, unknown>;

/** Keys of worlds that are equal up to a permutation of the GPUs (one set of interned names per exploration). */
export function worldKeys(): { signatures(w: World): number[]; worldKey(w: World, sigs: number[]): string } {
  // Symmetry: GPUs are interchangeable, so a world is identified by the sorted multiset of per-GPU signatures.
  // Signatures and replica states are interned to small numbers to keep keys short.
  const names = new Map<string, number>();
  const name = (s: string): number => {
    let id = names.get(s);
    if (id === undefined) names.set(s, (id = names.size));
    return id;
  };
  const gpuSnapIds = new WeakMap<object, number>();
  const gpuSnapId = (s: AnyMachineSnapshot): number => {
    let id = gpuSnapIds.get(s);
    if (id === undefined) {
      const { index: _index, id: _id, ...gc } = ctx(s);
      gpuSnapIds.set(s, (id = name(JSON.stringify(['gpu', s.value, gc]))));
    }
    return id;
  };
  // Messages are compared without their GPU index; each message object is named once.
  const msgIds = new WeakMap<object, number>();
  const msgId = (m: Msg): number => {
    let id = msgIds.get(m);
    if (id === undefined) msgIds.set(m, (id = name(JSON.stringify({ ...m, gpu: undefined }))));
    return id;
  };
  const gpuSigs = new WeakMap<Gpu, number>();
  const gpuSig = (g: Gpu): number => {
    let sig = gpuSigs.get(g);
    if (sig === undefined) {
      const exec = g.exec ?? '-';
      const down = g.down.map(msgId).join(' ');
      const up = g.up.map(([to, m]) => `${to}>${msgId(m)}`).join(' ');
      sig = name(
        `${gpuSnapId(g.snap)}|${exec}|${down}|${up}|${+g.owner}${+g.ownedFault}${+g.freeFault}${+g.releaseHeard}`,
      );
      gpuSigs.set(g, sig);
    }
    return sig;
  };
  // Fields of the replica's context that list GPUs (failedGpus, ...): each GPU's membership goes into its signature.
  const listFields = new WeakMap<object, string[]>();
  const replicaLists = (s: AnyMachineSnapshot): number[][] => {
    const c = ctx(s);
    let keys = listFields.get(s);
    if (!keys) listFields.set(s, (keys = Object.keys(c).filter((k) => k !== 'gpus' && Array.isArray(c[k]))));
    return keys.map((k) => c[k] as number[]);
  };
  const signatures = (w: World): number[] => {
    const lists = replicaLists(w.replica);
    return w.gpus.map((g, i) => lists.reduce((sig, l, k) => (l.includes(i) ? sig + 2 ** (24 + k) : sig), gpuSig(g)));
  };
  const replicaCanon = new WeakMap<object, number>();
  const worldKey = (w: World, sigs: number[]): string => {
    let rk = replicaCanon.get(w.replica);
    if (rk === undefined) {
      const rc = { ...ctx(w.replica) };
      for (const k of Object.keys(rc)) if (k !== 'gpus' && Array.isArray(rc[k])) rc[k] = (rc[k] as unknown[]).length;
      replicaCanon.set(w.replica, (rk = name(JSON.stringify(['replica', w.replica.value, w.replica.status, rc]))));
    }
    const flags = `${+w.registered}${+w.coreLive}${+w.saturated}${+w.crashed}${+w.drained}${+w.failureWhileServing}`;
    const counts =
      `${w.coreHeld},${w.coreReceived},${w.submits},${w.held},${w.sent},${w.arrived},${w.completed},${w.interrupted},` +
      `${w.faults},${w.crashes},${w.lost},${w.retried},${w.failedEpochs.join('/')}`;
    const progress = w.progress.map(msgId).join(' ');
    return `${rk}:${flags}:${counts}:${progress}:${[...sigs].sort((a, b) => a - b).join(',')}`;
  };

  return { signatures, worldKey };
}
