// A node agent: the worker process that owns GPUs, runs their actors, and hosts each cost-model replica's engine
// core (actors/worker/cores.ts); engine replicas run their core in their engine host (engines.ts).
import { createActor, type ActorRefFrom } from 'xstate';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import { createInspectRelay } from './inspect-relay.ts';
import type { CostModel } from '../gpu/cost-model.ts';
import { costModelFor } from '../gpu/profile-cost-model.ts';
import type { Msg, Runtime } from '../../runtime/system.ts';
import type { InjectedFault, MessageOf, NodeInventoryDevice } from '../../machines/messages.ts';
import type { TimerId } from '../../runtime/clock.ts';
import { createEngineManager, progressMessage, type EngineManager, type EngineManagerOptions } from './engines.ts';
import { loadBoundOfFile } from '../engine/host-client.ts';
import { createNodeCores, type CoreDevice, type InflightStep, type NodeCores, type StepTiming } from './cores.ts';

/** Per-GPU state the node keeps beside the GPU actor: its faults, and what the actor holds (mirrored on each change,
 * for the cores: see CoreDevice). */
interface GpuSlot extends CoreDevice {
  actor: ActorRefFrom<typeof gpuMachine>;
  cost: CostModel | null;
  replica: string | null;
  epoch: number;
  serving: boolean;
  slowdown: number;
  hung: boolean;
  /** Crashed: answers neither health checks nor steps (found by missed heartbeats). */
  silent: boolean;
}

/** A running node agent. */
export interface NodeAgent {
  readonly id: string;
  readonly gpus: readonly number[];
  gpuState(gpu: number): string;
  /** Milliseconds the device spent on the steps of its replica's core. */
  busyMs(gpu: number): number;
  /** The step the device is running for its replica's core, and since when: kept by a hung rank, null when idle. */
  inflight(gpu: number): InflightStep | null;
  /** Loads this agent started (a GPU entering `loading` for a new replica or epoch), in all and per device. */
  loads(gpu?: number): number;
  /** What the node holds, as `node.inventory` reports it to a (re)started control plane. */
  inventory(): MessageOf<'node.inventory'>;
  /** Sends the inventory to placement (after each registration). */
  announce(): void;
  /** The control plane that asked for the work in flight is gone: every core drops its sequences (its step in flight
   * abandoned) and every engine host cancels its own. Loaded replicas stay loaded, their cores running, empty.
   * Answers how many sequences were dropped. */
  orphan(): number;
  stop(): void;
}

/** Options of a node agent. */
export interface NodeAgentOptions {
  id?: string;
  gpus: readonly number[];
  /** How the cores time cost-model steps (default: the roofline). */
  steps?: StepTiming;
  repairMs?: number;
  probeMs?: number;
  /** Multiplies load and unload times (serving tests run a model's 13.5 s load in a fraction of that). */
  timeScale?: number;
  /** Sends `node.heartbeat` (with the devices that answered) to placement every heartbeatMs; off when absent or 0. */
  heartbeatMs?: number;
  /** Co-location lanes per GPU: lane l of GPU g is device g + l * (max GPU + 1), sharing g's fate (default 1). */
  lanes?: number;
  /** How engine hosts (replicas assigned with a real engine) are started and bounded. */
  engines?: Omit<EngineManagerOptions, 'ready' | 'failed' | 'progress'>;
}

/** A GPU of an engine replica stays `loading` until the host is ready; this only backs up the host's own bound
 * (which grows with the model file), a minute past it. */
const engineLoadBoundMs = (file: string): number => loadBoundOfFile(file) + 60_000;

/** Hands an assignment to the GPU actor: a cost-model replica loads for its modelled time, an engine replica's GPU
 * stays loading until its host is ready. A device's straggle is its own replica's: a new assignment clears it. */
function assignGpu(slot: GpuSlot, m: MessageOf<'gpu.assign'>, costs: Map<string, CostModel>, scale: number): void {
  let loadMs = m.engine ? engineLoadBoundMs(m.engine.file) : 0;
  slot.cost = null;
  slot.slowdown = 1;
  if (!m.engine) {
    const key = `${m.model}|${m.gpuType}|${m.tp}`;
    let cost = costs.get(key);
    if (!cost) {
      cost = costModelFor(m.model, m.gpuType, m.tp);
      costs.set(key, cost);
    }
    slot.cost = cost;
    loadMs = m.loadMs * scale;
  }
  slot.actor.send({ type: 'gpu.assign', replica: m.replica, epoch: m.epoch, loadMs, unloadMs: m.unloadMs * scale });
}

/** An agent's engine hosts wired to its GPU actors (host ready = GPUs loaded, host failed = GPUs fenced) and to the
 * control plane (its core's reports = `seq.progress`). */
function wireEngines(
  slots: ReadonlyMap<number, GpuSlot>,
  send: Runtime['send'],
  fence: (g: number, code: string) => void,
  options: NodeAgentOptions['engines'],
): EngineManager {
  return createEngineManager({
    ...options,
    ready: (replica, epoch, gpus) => {
      for (const g of gpus) {
        const snap = slots.get(g)?.actor.getSnapshot();
        if (snap?.context.replica === replica && snap.context.epoch === epoch)
          slots.get(g)!.actor.send({ type: 'gpu.engineLoaded' });
      }
    },
    // The host died or stopped progressing: its GPUs leave service (reported as failed, then reset and probed).
    failed: (_replica, _epoch, gpus) => {
      for (const g of gpus) fence(g, 'engine_failed');
    },
    progress: (replica, epoch, report) => send(replica, progressMessage(replica, epoch, report)),
  });
}

/** Fences applied, by id: a fence is resent until confirmed, and a repeat must not reset a GPU given anew since. */
function createFenceLog(): { apply(id: number | undefined): boolean; max(): number } {
  const applied = new Set<number>();
  let max = 0;
  return {
    apply: (id) => {
      if (id === undefined) return true;
      if (applied.has(id)) return false;
      applied.add(id);
      max = Math.max(max, id);
      // Ids only grow (a restarted control plane continues from the inventory's `fence`): old ones can be forgotten.
      if (applied.size > 1024) for (const f of applied) if (f < max - 1024) applied.delete(f);
      return true;
    },
    max: () => max,
  };
}

type GpuSnapshot = ReturnType<ActorRefFrom<typeof gpuMachine>['getSnapshot']>;

/** Loads the agent started, in all and per device: a device entering `loading` for a replica or epoch it did not
 * hold (a repeated assignment, answered at once, is no load). */
function createLoadCounter() {
  const per = new Map<number, number>();
  let total = 0;
  return {
    observe: (g: number, m: MessageOf<'gpu.assign'>, before: GpuSnapshot, after: GpuSnapshot): void => {
      const held =
        before.hasTag('holdsGpu') && before.context.replica === m.replica && before.context.epoch === m.epoch;
      if (!after.matches({ allocated: 'loading' }) || held) return;
      total++;
      per.set(g, (per.get(g) ?? 0) + 1);
    },
    total: () => total,
    of: (g: number): number => per.get(g) ?? 0,
  };
}

/** An injected fault on one device (tests, the admin API): a reported fault, a hang, silence, slowness, a repair. */
function injectInto(slot: GpuSlot, fault: InjectedFault, factor: number | undefined, killEngine: () => void): void {
  if (fault === 'fault') {
    killEngine();
    slot.actor.send({ type: 'gpu.fault', code: 'xid_79' });
  } else if (fault === 'hang') slot.hung = true;
  else if (fault === 'silent') {
    slot.hung = true;
    slot.silent = true;
  } else if (fault === 'straggle') slot.slowdown = factor ?? 2;
  else if (fault === 'repair') {
    slot.hung = false;
    slot.silent = false;
    slot.slowdown = 1;
    slot.actor.send({ type: 'gpu.repair' });
  }
}

/** A device's inventory entry from its GPU actor's snapshot. */
function deviceOf(g: number, snap: GpuSnapshot): NodeInventoryDevice {
  const v = snap.value;
  const state: NodeInventoryDevice['state'] =
    typeof v === 'string' ? (v as NodeInventoryDevice['state']) : (v.allocated as NodeInventoryDevice['state']);
  const held = snap.hasTag('holdsGpu') && snap.context.replica !== null;
  return { gpu: g, state, ...(held ? { replica: snap.context.replica!, epoch: snap.context.epoch } : {}) };
}

/** The health check: a crashed device answers nothing; a hung one cannot run the probe, so only a serving one
 * (whose health is its steps, judged by the control plane's progress check) is listed while hung. */
function answersHealthCheck(slot: GpuSlot | undefined): boolean {
  if (!slot || slot.silent) return false;
  return !slot.hung || slot.actor.getSnapshot().hasTag('serving');
}

/** Mirrors what a GPU actor holds into its slot, for the cores. */
function mirror(slot: GpuSlot, snap: GpuSnapshot): void {
  const holds = snap.hasTag('holdsGpu');
  slot.replica = holds ? snap.context.replica : null;
  slot.epoch = snap.context.epoch;
  slot.serving = snap.hasTag('serving');
}

/** Hands a submit or cancel to the engine host or the core that runs its replica's epoch. One that finds neither
 * (a replica failed, released, or never loaded here; items for a generative engine) is dropped and counted in the
 * runtime's `dropped`: the control plane's failure handling covers the requests it carried. */
function handOn(
  runtime: Runtime,
  engines: EngineManager,
  cores: NodeCores,
  m: MessageOf<'seq.submit'> | MessageOf<'seq.cancel'>,
): void {
  let taken = false;
  if (!engines.owns(m.replica, m.epoch)) {
    taken = m.type === 'seq.submit' ? cores.submit(m) : cores.cancel(m);
  } else if (m.type === 'seq.cancel') {
    engines.cancel(m.replica, m.epoch, m.ids);
    taken = true;
  } else if (!m.items || m.items.length === 0) {
    engines.submit(m.replica, m.epoch, m.seqs ?? []);
    taken = true;
  }
  if (!taken) runtime.dropped.set(m.type, (runtime.dropped.get(m.type) ?? 0) + 1);
}

/** Starts a node agent on `runtime`: one GPU actor per device, registered as `gpu.<n>`, and the `node` inbox. */
export function startNodeAgent(runtime: Runtime, opts: NodeAgentOptions): NodeAgent {
  const id = opts.id ?? 'node';
  const slots = new Map<number, GpuSlot>();
  const costs = new Map<string, CostModel>();
  const busy = new Map<number, number>();
  const { clock, send } = runtime;
  const scale = opts.timeScale ?? 1;
  const stride = Math.max(-1, ...opts.gpus) + 1;
  const lanesOf = (g: number): number[] => Array.from({ length: opts.lanes ?? 1 }, (_, l) => (g % stride) + l * stride);
  const devices = opts.gpus.flatMap(lanesOf);
  let heartbeat: TimerId | null = null;
  const relay = createInspectRelay(runtime);
  const fences = createFenceLog();
  const loads = createLoadCounter();
  const cores: NodeCores = createNodeCores({
    clock,
    device: (g) => slots.get(g),
    ...(opts.steps ? { timing: opts.steps } : {}),
    credit: (g, ms) => void busy.set(g, (busy.get(g) ?? 0) + ms),
    report: (replica, epoch, r) => send(replica, { type: 'seq.progress', replica, epoch, ...r }),
    // The loop broke an invariant: the replica's devices fail as a unit (reset, as for an engine that failed).
    crashed: (replica, epoch, gpus, error) => {
      runtime.fault({ actor: `core ${replica}@${epoch}`, error, contained: true });
      for (const g of gpus) failDevice(g, 'engine_core_failed');
    },
  });

  /** Starts device g's GPU actor (again, after a reset: a fresh actor, nothing loaded, probed before use). */
  const spawnGpu = (g: number): ActorRefFrom<typeof gpuMachine> => {
    const machine = gpuMachine.provide({
      actions: {
        probe: ({ self }) => {
          clock.setTimeout(() => self.send({ type: 'gpu.probed' }), opts.probeMs ?? 0);
        },
      },
    });
    const actor = createActor(machine, { input: { index: g, repairMs: opts.repairMs }, clock, id: `gpu.${g}` });
    runtime.supervise(`gpu.${g}`, actor);
    // Every change of what the device holds reaches its replica's core (a rank that left serving stops it).
    actor.subscribe((snap) => {
      const slot = slots.get(g);
      if (slot?.actor !== actor) return;
      mirror(slot, snap);
      cores.deviceChanged(g);
    });
    return actor;
  };
  const engines = wireEngines(slots, send, (g, code) => fence(g, code), opts.engines);
  for (const g of devices) {
    const fresh = { cost: null, replica: null, epoch: 0, serving: false, slowdown: 1, hung: false, silent: false };
    slots.set(g, { actor: spawnGpu(g), ...fresh });
    runtime.register(`gpu.${g}`, (msg) => onGpuMessage(g, msg));
  }

  const onGpuMessage = (g: number, m: Msg): void => {
    const slot = slots.get(g);
    if (!slot) return;
    // The control plane hears the steps its cores ran before the device changes first.
    for (const d of lanesOf(g)) cores.flush(d);
    if (m.type === 'gpu.assign') {
      const before = slot.actor.getSnapshot();
      assignGpu(slot, m, costs, scale);
      loads.observe(g, m, before, slot.actor.getSnapshot());
      if (m.engine) engines.assign({ ...m, engine: m.engine });
      else if (slot.cost) cores.assign(m, slot.cost);
    } else if (m.type === 'gpu.release') {
      engines.release(m.replica, m.epoch);
      slot.actor.send({ type: 'gpu.release', replica: m.replica, epoch: m.epoch });
    } else if (m.type === 'gpu.inject') {
      inject(g, m.fault, m.factor);
    } else if (m.type === 'gpu.fence') {
      fenceOnce(g, m.code, m.fence);
    }
  };
  /** Applies a fence unless its id was applied already. */
  const fenceOnce = (g: number, code: string, id: number | undefined): void => {
    if (fences.apply(id)) fence(g, code);
  };
  const inject = (g: number, fault: InjectedFault, factor?: number): void => {
    for (const d of lanesOf(g)) {
      const slot = slots.get(d);
      if (!slot) continue;
      cores.flush(d);
      injectInto(slot, fault, factor, () => engines.gpuFault(d));
      cores.deviceChanged(d);
    }
  };
  // The control plane declared the GPU failed: every lane of it leaves service (and reports gpu.failed).
  const fence = (g: number, code: string): void => {
    for (const d of lanesOf(g)) failDevice(d, code);
  };
  /** Takes one device out of service: its engine host killed, its GPU actor failed (which stops its core). */
  const failDevice = (d: number, code: string): void => {
    const slot = slots.get(d);
    if (!slot) return;
    cores.flush(d);
    engines.gpuFault(d);
    slot.actor.send({ type: 'gpu.fault', code });
    // A device that is not itself broken (fenced because its node stalled or was cut off, on a suspicion, or for a
    // core that failed) is reset: a fresh GPU actor, probed and free again, without the repair time.
    if (!slot.hung && !slot.silent) {
      slot.actor.stop();
      slot.actor = spawnGpu(d);
      slot.cost = null;
      slot.actor.start();
      slot.actor.send({ type: 'gpu.register' });
    }
  };
  const answers = (g: number): boolean => answersHealthCheck(slots.get(g));
  const beat = (): void => {
    const alive = opts.gpus.filter(answers);
    const t = clock.now();
    send('placement', { type: 'node.heartbeat', node: id, epoch: 0, t, gpus: alive, loads: loads.total() });
    heartbeat = clock.setTimeout(beat, opts.heartbeatMs!);
  };

  runtime.register(id, (m) => {
    if (m.type === 'seq.submit' || m.type === 'seq.cancel') {
      handOn(runtime, engines, cores, m);
    } else if (m.type === 'gpu.inject') {
      inject(m.gpu, m.fault, m.factor);
    } else if (m.type === 'gpu.fence') {
      fenceOnce(m.gpu, m.code, m.fence);
    } else if (m.type === 'inspect.watch') {
      relay.watch(m);
    }
  });
  const inventory = (): MessageOf<'node.inventory'> => ({
    type: 'node.inventory',
    node: id,
    fence: fences.max(),
    loads: loads.total(),
    devices: [...slots].map(([g, slot]) => deviceOf(g, slot.actor.getSnapshot())),
  });

  for (const { actor } of slots.values()) actor.start();
  for (const { actor } of slots.values()) actor.send({ type: 'gpu.register' });
  if (opts.heartbeatMs && opts.heartbeatMs > 0) heartbeat = clock.setTimeout(beat, opts.heartbeatMs);

  return {
    id,
    gpus: opts.gpus,
    gpuState: (g) => JSON.stringify(slots.get(g)?.actor.getSnapshot().value ?? 'unknown'),
    busyMs: (g) => busy.get(g) ?? 0,
    inflight: (g) => cores.inflight(g),
    loads: (g) => (g === undefined ? loads.total() : loads.of(g)),
    inventory,
    announce: () => send('placement', inventory()),
    orphan: () => cores.orphan() + engines.cancelAll(),
    stop: () => {
      relay.stop();
      engines.stopAll();
      cores.stopAll();
      if (heartbeat !== null) clock.clearTimeout(heartbeat);
      heartbeat = null;
      for (const [g, { actor }] of slots) {
        actor.stop();
        runtime.unregister(`gpu.${g}`);
      }
      runtime.unregister(id);
    },
  };
}
