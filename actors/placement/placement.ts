// Placement: which replicas exist on which GPUs. Owns GPU ownership (a GPU never belongs to two replicas), creates
// and stops replicas, routes GPU faults to the replica holding the GPU, and says why a model cannot be served.
import { createActor } from 'xstate';
import { placementMachine } from '../../machines/placement.machine.ts';
import { createCostModel } from '../gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../gpu/profiles.ts';
import { createReplica, type ReplicaHandle, type ReplicaOptions } from '../replica.ts';
import type { Msg, Runtime } from '../runtime/system.ts';
import type { ModelConfig, Scenario } from '../config.ts';
import type { Sequence } from '../batcher/sequence.ts';
import type { StepPlan } from '../batcher/continuous.ts';

/** One GPU as placement sees it. */
export interface GpuRecord {
  index: number;
  healthy: boolean;
  /** Probed and reported ready by its node agent. */
  up: boolean;
  owner: string | null;
}

/** A timeline event of placement (for reports and the inspector). */
export interface PlacementEvent {
  t: number;
  kind: 'replica.created' | 'replica.ready' | 'replica.failed' | 'replica.stopped' | 'gpu.failed' | 'gpu.ready' | 'unavailable' | 'available';
  replica?: string;
  gpu?: number;
  gpus?: number[];
  detail?: string;
}

/** The placement actor of a control plane. */
export interface Placement {
  readonly gpus: ReadonlyMap<number, GpuRecord>;
  readonly replicas: ReadonlyMap<string, ReplicaHandle>;
  /** Why `model` cannot be served now, or null. */
  unavailable(model: string): string | null;
  /** Predicted ms until a replica of model@version is ready, or null if none is coming. */
  etaMs(model: string, version: string): number | null;
  readonly events: PlacementEvent[];
  /** Drains a replica (admin API); false if unknown. */
  drain(replica: string, deadlineMs?: number): boolean;
  /** True when no replica is placing, loading, draining or unloading. */
  settled(): boolean;
}

/** Hooks placement calls into the rest of the control plane. */
export interface PlacementHooks {
  onInterrupted(seqs: Sequence[], reason: string): void;
  onReplicaReady(r: ReplicaHandle): void;
  onStep?(r: ReplicaHandle, plan: StepPlan): void;
}

interface Slot {
  model: ModelConfig;
  version: string;
  k: number;
  epoch: number;
  replica: ReplicaHandle | null;
  createdAt: number;
}

/** Starts the placement actor for a scenario's models (policy `exclusive`: a fixed split, large model all-or-none). */
export function startPlacement(runtime: Runtime, scenario: Scenario, hooks: PlacementHooks): Placement {
  const gpus = new Map<number, GpuRecord>();
  for (let g = 0; g < scenario.node.gpus; g++) gpus.set(g, { index: g, healthy: true, up: false, owner: null });
  const replicas = new Map<string, ReplicaHandle>();
  const events: PlacementEvent[] = [];
  const slots: Slot[] = [];
  const reasons = new Map<string, string | null>();
  const now = (): number => runtime.clock.now();
  const gpuType = scenario.node.gpu;

  for (const m of scenario.models) {
    for (const version of m.versions) {
      const count = m.replicas;
      for (let k = 0; k < count; k++) slots.push({ model: m, version, k, epoch: 0, replica: null, createdAt: 0 });
    }
  }

  const actor = createActor(placementMachine, { input: { mode: 'mixed' }, clock: runtime.clock, id: 'placement' });

  const freeGpus = (): number[] => [...gpus.values()].filter((g) => g.healthy && g.up && g.owner === null).map((g) => g.index);
  const healthyCount = (): number => [...gpus.values()].filter((g) => g.healthy).length;

  const place = (slot: Slot): boolean => {
    const free = freeGpus();
    if (free.length < slot.model.tp) return false;
    const chosen = free.slice(0, slot.model.tp);
    slot.epoch++;
    const id = `replica.${slot.model.name}@${slot.version}#${slot.k}`;
    const cost = createCostModel(modelProfile(slot.model.profile), gpuProfile(gpuType), slot.model.tp);
    const b = slot.model.batching;
    const opts: ReplicaOptions = {
      id,
      model: slot.model.name,
      version: slot.version,
      gpus: chosen,
      epoch: slot.epoch,
      gpuType,
      modelProfile: slot.model.profile,
      cost,
      limits: {
        policy: b.policy,
        maxRunning: b.maxRunning,
        tokenBudget: b.tokenBudget,
        blockTokens: b.blockTokens,
        maxContext: b.maxContext,
        watermarkBlocks: 0,
        ...(b.kvBlocks ? { blocksTotal: b.kvBlocks } : {}),
      },
      onInterrupted: hooks.onInterrupted,
      ...(hooks.onStep ? { onStep: hooks.onStep } : {}),
    };
    const blocks = b.kvBlocks ?? cost.kvBlocks(b.blockTokens);
    opts.limits.watermarkBlocks = Math.floor(blocks * b.watermark);
    for (const g of chosen) gpus.get(g)!.owner = id;
    const r = createReplica(runtime, opts);
    slot.replica = r;
    slot.createdAt = now();
    replicas.set(id, r);
    events.push({ t: now(), kind: 'replica.created', replica: id, gpus: chosen });
    r.actor.send({ type: 'replica.start' });
    return true;
  };

  const reconcile = (): void => {
    for (const slot of slots) {
      if (slot.replica) continue;
      place(slot);
    }
    for (const m of scenario.models) {
      const live = slots.some((s) => s.model === m && s.replica);
      let why: string | null = null;
      if (!live) {
        const healthy = healthyCount();
        why =
          healthy < m.tp
            ? `${m.name} needs ${m.tp} healthy GPU${m.tp > 1 ? 's' : ''}, ${healthy} available`
            : `${m.name} needs ${m.tp} free GPU${m.tp > 1 ? 's' : ''}; the others are held by other replicas`;
      }
      if ((reasons.get(m.name) ?? null) !== why) {
        events.push({ t: now(), kind: why ? 'unavailable' : 'available', detail: why ?? `${m.name} placed` });
        reasons.set(m.name, why);
      }
    }
  };

  const slotOf = (replica: string): Slot | undefined => slots.find((s) => s.replica?.id === replica);

  runtime.register('placement', (msg: Msg) => {
    const t = now();
    switch (msg.type) {
      case 'gpu.ready': {
        const g = gpus.get(msg['gpu'] as number);
        if (!g) return;
        g.up = true;
        g.healthy = true;
        events.push({ t, kind: 'gpu.ready', gpu: g.index });
        reconcile();
        return;
      }
      case 'gpu.failed': {
        const g = gpus.get(msg['gpu'] as number);
        if (!g) return;
        g.healthy = false;
        g.up = false;
        events.push({ t, kind: 'gpu.failed', gpu: g.index, detail: String(msg['code']) });
        actor.send({ type: 'gpu.failed', gpu: g.index });
        if (g.owner) runtime.send(g.owner, { type: 'gpu.failed', gpu: g.index, code: String(msg['code']) });
        reconcile();
        return;
      }
      case 'replica.ready': {
        const r = replicas.get(msg['replica'] as string);
        if (!r) return;
        events.push({ t, kind: 'replica.ready', replica: r.id, gpus: [...r.gpus] });
        hooks.onReplicaReady(r);
        return;
      }
      case 'replica.failed':
        events.push({ t, kind: 'replica.failed', replica: msg['replica'] as string });
        return;
      case 'replica.stopped': {
        const id = msg['replica'] as string;
        const slot = slotOf(id);
        const r = replicas.get(id);
        if (r) {
          for (const g of r.gpus) {
            const rec = gpus.get(g)!;
            if (rec.owner === id) rec.owner = null;
          }
          replicas.delete(id);
          runtime.unregister(id);
        }
        if (slot) slot.replica = null;
        events.push({ t, kind: 'replica.stopped', replica: id });
        reconcile();
        return;
      }
    }
  });
  runtime.supervise('placement', actor);
  actor.start();

  return {
    gpus,
    replicas,
    events,
    unavailable: (model) => reasons.get(model) ?? null,
    etaMs: (model, version) => {
      let best: number | null = null;
      for (const s of slots) {
        if (s.model.name !== model || s.version !== version || !s.replica) continue;
        const st = s.replica.state();
        if (st.startsWith('ready')) return 0;
        if (st === 'placing' || st === 'loading') {
          const left = Math.max(0, s.createdAt + s.replica.cost.loadS() * 1000 - now());
          if (best === null || left < best) best = left;
        }
      }
      return best;
    },
    drain: (replica, deadlineMs = scenario.placement.drainDeadlineMs) => {
      const r = replicas.get(replica);
      if (!r) return false;
      r.actor.send({ type: 'replica.drain', deadlineMs });
      return true;
    },
    settled: () => [...replicas.values()].every((r) => r.state().startsWith('ready')),
  };
}
