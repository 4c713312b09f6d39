// A node agent: the worker process that owns GPUs, runs their actors, and executes steps with an executor.
import { createActor, type ActorRefFrom } from 'xstate';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import type { CostModel, StepShape } from '../gpu/cost-model.ts';
import { costModelFor } from '../gpu/profile-cost-model.ts';
import type { Executor, StepWork } from '../gpu/executor.ts';
import type { Msg, Runtime } from '../../runtime/system.ts';
import type { InjectedFault, MessageOf, NodeInventoryDevice } from '../../machines/messages.ts';
import type { TimerId } from '../../runtime/clock.ts';
import { createEngineManager, type EngineManager, type EngineManagerOptions } from './engines.ts';
import { loadBoundOfFile } from '../engine/host-client.ts';
import type { LaneNode, LaneOpener, LinkShortcut } from '../../transport/sim-link.ts';

/** Per-GPU execution state the node keeps beside the GPU actor. */
interface GpuSlot {
  actor: ActorRefFrom<typeof gpuMachine>;
  cost: CostModel | null;
  slowdown: number;
  hung: boolean;
  /** Crashed: answers neither health checks nor steps (found by missed heartbeats). */
  silent: boolean;
  /** The step this rank is executing, for progress (hung-rank) detection. */
  inflight: { replica: string; epoch: number; step: number; since: number } | null;
}

/** A running node agent. */
export interface NodeAgent {
  readonly id: string;
  readonly gpus: readonly number[];
  gpuState(gpu: number): string;
  busyMs(gpu: number): number;
  /** The simulator's link shortcut: a cost-model step whose every rank would start at once and take the same time
   * is answered without its timers (see transport/sim-link.ts); anything else takes the wire. */
  readonly shortcut: LinkShortcut;
  /** The node's side of the simulator's step lane (answers as the shortcut would, for a run of steps). */
  readonly lane: LaneOpener;
  /** Loads this agent started (a GPU entering `loading` for a new replica or epoch), in all and per device. */
  loads(gpu?: number): number;
  /** What the node holds, as `node.inventory` reports it to a (re)started control plane. */
  inventory(): MessageOf<'node.inventory'>;
  /** Sends the inventory to placement (after each registration). */
  announce(): void;
  /** The control plane that asked for the work in flight is gone: frees every engine sequence and abandons the
   * steps in flight. Loaded replicas stay loaded. Answers how many sequences were freed. */
  orphan(): number;
  stop(): void;
}

/** Options of a node agent. */
export interface NodeAgentOptions {
  id?: string;
  gpus: readonly number[];
  executor: Executor;
  repairMs?: number;
  probeMs?: number;
  /** Multiplies load and unload times (serving tests run a model's 13.5 s load in a fraction of that). */
  timeScale?: number;
  /** Sends `node.heartbeat` (with the devices that answered) to placement every heartbeatMs; off when absent or 0. */
  heartbeatMs?: number;
  /** Co-location lanes per GPU: lane l of GPU g is device g + l * (max GPU + 1), sharing g's fate (default 1). */
  lanes?: number;
  /** How engine hosts (replicas assigned with a real engine) are started and bounded. */
  engines?: Omit<EngineManagerOptions, 'ready' | 'failed'>;
  /**
   * The ranks of a tensor-parallel step that all start it and take the same time run it on one timer and report it
   * in one message (`gang`), which the replica takes as one report per rank, in order: the same events, times and
   * results as one timer and one message per rank (the simulator's reference run keeps those). Default off.
   */
  gangs?: boolean;
}

/** A GPU of an engine replica stays `loading` until the host is ready; this only backs up the host's own bound
 * (which grows with the model file), a minute past it. */
const engineLoadBoundMs = (file: string): number => loadBoundOfFile(file) + 60_000;

const shapeOf = (m: MessageOf<'step.execute'>): StepShape => ({
  prefill: m.shape.prefill.map(([tokens, cached]) => ({ tokens: tokens ?? 0, cached: cached ?? 0 })),
  decodeBatch: m.shape.decodeBatch,
  decodeContext: m.shape.decodeContext,
});

/** Hands an assignment to the GPU actor: a cost-model replica loads for its modelled time, an engine replica's GPU
 * stays loading until its host is ready. */
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
    slot.slowdown = m.slowdown ?? 1;
    loadMs = m.loadMs * scale;
  }
  slot.actor.send({ type: 'gpu.assign', replica: m.replica, epoch: m.epoch, loadMs, unloadMs: m.unloadMs * scale });
}

/** An agent's engine hosts wired to its GPU actors: host ready = GPUs loaded, host failed = GPUs fenced. */
function wireEngines(
  slots: ReadonlyMap<number, GpuSlot>,
  send: Runtime['send'],
  fence: (g: number, code: string) => void,
  options: NodeAgentOptions['engines'],
): { engines: EngineManager; engineStep(m: MessageOf<'step.execute'>): void } {
  const engines: EngineManager = createEngineManager({
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
  });
  /** Runs an engine replica's step on its host when every rank serves it; one report covers all ranks. */
  const engineStep = (m: MessageOf<'step.execute'>): void => {
    for (const g of m.gpus) {
      const slot = slots.get(g);
      const snap = slot?.actor.getSnapshot();
      if (!slot || slot.hung || !snap?.hasTag('serving') || snap.context.replica !== m.replica) return;
      if (snap.context.epoch !== m.epoch) return;
    }
    const { replica, epoch, step, gpus } = m;
    engines.step(m, (r) =>
      send(replica, { type: 'step.completed', gpu: gpus[0]!, ranks: [...gpus], replica, epoch, step, ...r }),
    );
  };

  return { engines, engineStep };
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

/** The ranks of a step when every one would start it now and take the same time: each rank's work, its slot and
 * the one duration; null when a rank is missing, hung, busy, not serving that replica's epoch, or deviates. With
 * `idle`, a rank still marked in flight (its last step abandoned, not yet answered) also disqualifies the step. */
function uniformRanks(
  slots: ReadonlyMap<number, GpuSlot>,
  timed: NonNullable<Executor['timed']>,
  m: MessageOf<'step.execute'>,
  shape: StepShape,
  idle: boolean,
): { works: StepWork[]; gang: GpuSlot[]; ms: number } | null {
  const { replica, epoch, step } = m;
  const works: StepWork[] = [];
  const gang: GpuSlot[] = [];
  let ms = -1;
  for (const g of m.gpus) {
    const slot = slots.get(g);
    if (!slot || !slot.cost || slot.hung || (idle && slot.inflight) || timed.running(g)) return null;
    const snap = slot.actor.getSnapshot();
    if (!snap.hasTag('serving') || snap.context.replica !== replica || snap.context.epoch !== epoch) return null;
    const work = { gpu: g, replica, epoch, step, shape, cost: slot.cost, slowdown: slot.slowdown };
    const d = timed.durationMs(work);
    if (ms >= 0 && d !== ms) return null;
    ms = d;
    works.push(work);
    gang.push(slot);
  }
  return ms < 0 ? null : { works, gang, ms };
}

/** How a node answers a `step.execute` by itself: what startStep and the executor's timers would do, when every
 * rank would run it now and finish at the same time (a rank that deviates, is hung, or busy takes the wire). */
function stepShortcut(
  node: string,
  slots: ReadonlyMap<number, GpuSlot>,
  executor: Executor,
  engines: EngineManager,
): LinkShortcut {
  const timed = executor.timed;
  return (to, msg, arrival) => {
    if (!timed || to !== node || msg.type !== 'step.execute' || engines.owns(msg.replica, msg.epoch)) return null;
    const { replica, epoch, step, gpus } = msg;
    const ranks = uniformRanks(slots, timed, msg, shapeOf(msg), true);
    if (!ranks) return null;
    const busyMs = ranks.ms;
    return {
      // As the executor's timer: clock.setTimeout(fn, ms) from the arrival.
      sentAt: arrival + (busyMs > 0 ? busyMs : 0),
      events: gpus.length,
      replies: gpus.map((g) => ({
        to: replica,
        msg: { type: 'step.completed', gpu: g, replica, epoch, step, busyMs },
      })),
      commit: () => {
        for (const g of gpus) timed.credit(g, busyMs);
      },
    };
  };
}

/** The lane's node side (transport/sim-link.ts): a run of `replica`'s steps the node would answer by itself, as the
 * shortcut does each one: every rank serving that epoch, idle, not hung, on the same cost model and slowdown (so
 * every step takes the same time on each). Nothing here changes during a run but through the link's events. */
function laneOpener(node: string, slots: ReadonlyMap<number, GpuSlot>, executor: Executor, engines: EngineManager) {
  const timed = executor.timed;
  return (to: string, replica: string, epoch: number, gpus: readonly number[]): LaneNode | null => {
    if (!timed || to !== node || gpus.length === 0 || engines.owns(replica, epoch)) return null;
    let first: GpuSlot | null = null;
    for (const g of gpus) {
      const slot = slots.get(g);
      if (!slot || !slot.cost || slot.hung || slot.inflight || timed.running(g)) return null;
      const snap = slot.actor.getSnapshot();
      if (!snap.hasTag('serving') || snap.context.replica !== replica || snap.context.epoch !== epoch) return null;
      if (first && (slot.cost !== first.cost || slot.slowdown !== first.slowdown)) return null;
      first ??= slot;
    }
    const work: StepWork = {
      gpu: gpus[0]!,
      replica,
      epoch,
      step: 0,
      shape: { prefill: [], decodeBatch: 0, decodeContext: 0 },
      cost: first!.cost!,
      slowdown: first!.slowdown,
    };
    return {
      durationMs: (shape) => {
        work.shape = shape as StepShape;
        return timed.durationMs(work);
      },
      credit: (ms) => {
        for (const g of gpus) timed.credit(g, ms);
      },
    };
  };
}

/** Starts a step on all its ranks as one gang when every rank would start it now and take the same time (see
 * NodeAgentOptions.gangs); false (nothing started) otherwise, and each rank starts on its own. */
function startGang(
  slots: ReadonlyMap<number, GpuSlot>,
  executor: Executor,
  now: number,
  send: (to: string, msg: Msg) => void,
  m: MessageOf<'step.execute'>,
  shape: StepShape,
): boolean {
  const timed = executor.timed;
  if (!timed || m.gpus.length < 2) return false;
  const ranks = uniformRanks(slots, timed, m, shape, false);
  if (!ranks) return false;
  const { replica, epoch, step } = m;
  for (const slot of ranks.gang) slot.inflight = { replica, epoch, step, since: now };
  timed.startGang(ranks.works, (busyMs, done) => {
    for (const g of done) slots.get(g)!.inflight = null;
    const one = { type: 'step.completed' as const, gpu: done[0]!, replica, epoch, step, busyMs };
    send(replica, done.length > 1 ? { ...one, gang: done } : one);
  });
  return true;
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

/** The node lost its control plane: steps in flight are abandoned and every engine sequence freed. */
function orphanSteps(slots: ReadonlyMap<number, GpuSlot>, executor: Executor, engines: EngineManager): number {
  for (const [g, slot] of slots) {
    if (slot.inflight) executor.abort(g);
    slot.inflight = null;
  }
  return engines.freeAll();
}

/** Starts a node agent on `runtime`: one GPU actor per device, registered as `gpu.<n>`, and the `node` inbox. */
export function startNodeAgent(runtime: Runtime, opts: NodeAgentOptions): NodeAgent {
  const id = opts.id ?? 'node';
  const slots = new Map<number, GpuSlot>();
  const costs = new Map<string, CostModel>();
  const { clock, send } = runtime;
  const scale = opts.timeScale ?? 1;
  const stride = Math.max(-1, ...opts.gpus) + 1;
  const lanesOf = (g: number): number[] => Array.from({ length: opts.lanes ?? 1 }, (_, l) => (g % stride) + l * stride);
  const devices = opts.gpus.flatMap(lanesOf);
  let heartbeat: TimerId | null = null;
  const fences = createFenceLog();
  const loads = createLoadCounter();

  /** Starts device g's GPU actor (again, after a reset: a fresh actor, nothing loaded, probed before use). */
  const spawnGpu = (g: number): ActorRefFrom<typeof gpuMachine> => {
    const machine = gpuMachine.provide({
      actions: {
        abortStep: () => opts.executor.abort(g),
        probe: ({ self }) => {
          clock.setTimeout(() => self.send({ type: 'gpu.probed' }), opts.probeMs ?? 0);
        },
      },
    });
    const actor = createActor(machine, { input: { index: g, repairMs: opts.repairMs }, clock, id: `gpu.${g}` });
    runtime.supervise(`gpu.${g}`, actor);
    return actor;
  };
  const { engines, engineStep } = wireEngines(slots, send, (g, code) => fence(g, code), opts.engines);
  for (const g of devices) {
    slots.set(g, { actor: spawnGpu(g), cost: null, slowdown: 1, hung: false, silent: false, inflight: null });
    runtime.register(`gpu.${g}`, (msg) => onGpuMessage(g, msg));
  }

  const onGpuMessage = (g: number, msg: Msg): void => {
    const slot = slots.get(g);
    if (!slot) return;
    const m = msg;
    if (m.type === 'gpu.assign') {
      const before = slot.actor.getSnapshot();
      assignGpu(slot, m, costs, scale);
      loads.observe(g, m, before, slot.actor.getSnapshot());
      if (m.engine) engines.assign({ ...m, engine: m.engine });
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

  /** Runs one rank's share of a step if the GPU is serving that replica's epoch; reports `step.completed`. */
  const startStep = (g: number, replica: string, epoch: number, step: number, shape: StepShape): void => {
    const slot = slots.get(g);
    if (!slot || !slot.cost || slot.hung) return;
    const snap = slot.actor.getSnapshot();
    if (!snap.hasTag('serving') || snap.context.replica !== replica || snap.context.epoch !== epoch) return;
    slot.inflight = { replica, epoch, step, since: clock.now() };
    opts.executor.start({ gpu: g, replica, epoch, step, shape, cost: slot.cost, slowdown: slot.slowdown }, (busyMs) => {
      slot.inflight = null;
      send(replica, { type: 'step.completed', gpu: g, replica, epoch, step, busyMs });
    });
  };

  const inject = (g: number, fault: InjectedFault, factor?: number): void => {
    for (const d of lanesOf(g)) injectDevice(d, fault, factor);
  };
  const injectDevice = (g: number, fault: InjectedFault, factor?: number): void => {
    const slot = slots.get(g);
    if (slot) injectInto(slot, fault, factor, () => engines.gpuFault(g));
  };
  // The control plane declared the GPU failed: every lane of it leaves service (and reports gpu.failed).
  const fence = (g: number, code: string): void => {
    for (const d of lanesOf(g)) {
      const slot = slots.get(d);
      if (!slot) continue;
      engines.gpuFault(d);
      slot.inflight = null;
      slot.actor.send({ type: 'gpu.fault', code });
      // A device that is not itself broken (fenced because its node stalled or was cut off, or on a suspicion) is
      // reset: a fresh GPU actor, probed and free again, without the repair time a broken device needs.
      if (!slot.hung && !slot.silent) {
        slot.actor.stop();
        slot.actor = spawnGpu(d);
        slot.cost = null;
        slot.actor.start();
        slot.actor.send({ type: 'gpu.register' });
      }
    }
  };
  const answers = (g: number): boolean => answersHealthCheck(slots.get(g));
  const beat = (): void => {
    const alive = opts.gpus.filter(answers);
    const t = clock.now();
    send('placement', { type: 'node.heartbeat', node: id, epoch: 0, t, gpus: alive, loads: loads.total() });
    heartbeat = clock.setTimeout(beat, opts.heartbeatMs!);
  };

  runtime.register(id, (msg) => {
    const m = msg;
    if (m.type === 'step.execute' && engines.owns(m.replica, m.epoch)) {
      engineStep(m);
    } else if (m.type === 'seq.free') {
      engines.free(m.replica, m.epoch, m.seqs);
    } else if (m.type === 'step.execute') {
      const shape = shapeOf(m);
      const gang = opts.gangs === true && startGang(slots, opts.executor, clock.now(), send, m, shape);
      if (!gang) for (const g of m.gpus) startStep(g, m.replica, m.epoch, m.step, shape);
    } else if (m.type === 'gpu.inject') {
      inject(m.gpu, m.fault, m.factor);
    } else if (m.type === 'gpu.fence') {
      fenceOnce(m.gpu, m.code, m.fence);
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

  const shortcut = stepShortcut(id, slots, opts.executor, engines);
  return {
    id,
    gpus: opts.gpus,
    shortcut,
    lane: laneOpener(id, slots, opts.executor, engines),
    gpuState: (g) => JSON.stringify(slots.get(g)?.actor.getSnapshot().value ?? 'unknown'),
    busyMs: (g) => opts.executor.busyMs(g),
    loads: (g) => (g === undefined ? loads.total() : loads.of(g)),
    inventory,
    announce: () => send('placement', inventory()),
    orphan: () => orphanSteps(slots, opts.executor, engines),
    stop: () => {
      engines.stopAll();
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
