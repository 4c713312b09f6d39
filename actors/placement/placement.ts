// Placement: which replicas exist on which GPUs. Owns GPU ownership (a GPU never belongs to two replicas; under
// `share` a co-location lane may hold one guest), creates and drains replicas to match the mode's layout, moves the
// node between modes without starving either model (gang reservation, bounded drain), detects failed GPUs, and
// says why a model cannot be served.
import { createActor } from 'xstate';
import { placementMachine, type PlacementMode } from '../../machines/placement.machine.ts';
import { createReplica, statelessLimits, type ReplicaHandle, type ReplicaOptions } from '../replica.ts';
import type { Msg, Runtime } from '../../runtime/system.ts';
import type { Scenario } from '../config.ts';
import type { Sequence } from '../batcher/sequence.ts';
import type { StepPlan } from '../batcher/continuous.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';
import { costOf, layoutFor, loadMsOf, rolesOf, UNLOAD_MS, type LayoutEntry, type LayoutMode } from './layout.ts';
import { decideSwitch } from './policy.ts';
import { createDetector, type Detected, type DetectionPath, type InflightStep } from './detection.ts';

/** One GPU as placement sees it. */
export interface GpuRecord {
  index: number;
  healthy: boolean;
  /** Probed and reported ready by its node agent. */
  up: boolean;
  /** The replica holding the GPU (lane 0). */
  owner: string | null;
  /** A co-located replica on the GPU's second lane (`share` only). */
  guest: string | null;
}

/** A timeline event of placement (for reports and the inspector). */
export interface PlacementEvent {
  t: number;
  kind:
    | 'replica.created'
    | 'replica.ready'
    | 'replica.failed'
    | 'replica.stopped'
    | 'gpu.failed'
    | 'gpu.ready'
    | 'unavailable'
    | 'available'
    | 'reservation.raised'
    | 'reservation.released'
    | 'drain.started'
    | 'loading.started'
    | 'mode.switched'
    | 'mode.forced';
  replica?: string;
  model?: string;
  gpu?: number;
  gpus?: number[];
  mode?: string;
  path?: DetectionPath;
  detail?: string;
}

/** A GPU failure as detected: when, how, and which replica held it. */
export interface FailureRecord {
  t: number;
  gpu: number;
  code: string;
  path: DetectionPath;
  replicas: string[];
  /** Bound of the path that found it (ms). */
  boundMs: number;
}

/** Requests a replica gave up at once (failure or drain deadline), with the tokens each had streamed. */
export interface InterruptionRecord {
  t: number;
  replica: string;
  reason: string;
  requests: { id: string; tokens: number }[];
}

/** The placement actor of a control plane. */
export interface Placement {
  readonly gpus: ReadonlyMap<number, GpuRecord>;
  readonly replicas: ReadonlyMap<string, ReplicaHandle>;
  /** Why `model` cannot be served now, or null. */
  unavailable(model: string): string | null;
  /** Predicted ms until a replica of model@version is ready, or null if none can come. */
  etaMs(model: string, version: string): number | null;
  readonly events: PlacementEvent[];
  readonly failures: FailureRecord[];
  readonly interruptions: InterruptionRecord[];
  /** Drains a replica (admin API); false if unknown. */
  drain(replica: string, deadlineMs?: number): boolean;
  /** True when the node is in a mode (no switch under way) and every replica of it is ready. */
  settled(): boolean;
  /** The control plane's demand signal: work of `model` was held, released or (rejected) refused for want of a
   * replica; a refused client was told to retry after `retryAfterMs`, so its demand lasts until then. */
  demand(model: string, rejected?: boolean, retryAfterMs?: number): void;
  /** Calls `fn` after placement handles anything (simulation stop checks, tests). */
  watch(fn: () => void): void;
  /** The placement machine's state, mode, target and switch count. */
  mode(): { state: string; mode: PlacementMode; target: PlacementMode; switches: number };
  /** Ownership and gang invariants that do not hold now (empty when all hold). */
  checkInvariants(): string[];
  /** Changes the policy while running (admin API); a Failure when it cannot. */
  setPolicy(policy: string): Failure | null;
  /** Milliseconds each detection path may take at most (for a step predicted at stepMs). */
  detectionBounds(stepMs: number): Record<DetectionPath, number>;
  /** Sets how many replicas of model@version the layout wants (rollouts): missing ones are placed as GPUs free up,
   * extra ones drain and finish what they hold. False if the model or version is unknown. */
  setReplicas(model: string, version: string, count: number): boolean;
}

/** Hooks placement calls into the rest of the control plane. */
export interface PlacementHooks {
  onInterrupted(seqs: Sequence[], reason: string): void;
  onReplicaReady(r: ReplicaHandle): void;
  onStep?(r: ReplicaHandle, plan: StepPlan): void;
  /** Requests of `model` held because no replica of it is ready. */
  held?(model: string): number;
}

const MAX_RECORDS = 10_000;

/** Starts the placement actor for a scenario's models and placement policy. */
export function startPlacement(runtime: Runtime, scenario: Scenario, hooks: PlacementHooks): Placement {
  const n = scenario.node.gpus;
  const pc = scenario.placement;
  const now = (): number => runtime.clock.now();
  let policy = pc.policy;
  const gpus = new Map<number, GpuRecord>();
  for (let g = 0; g < n; g++) gpus.set(g, { index: g, healthy: true, up: false, owner: null, guest: null });
  const devUp = new Set<number>();
  const replicas = new Map<string, ReplicaHandle>();
  const createdAt = new Map<string, number>();
  const epochs = new Map<string, number>();
  const events: PlacementEvent[] = [];
  const failures: FailureRecord[] = [];
  const interruptions: InterruptionRecord[] = [];
  const reasons = new Map<string, string | null>();
  const lastReject = new Map<string, number>();
  const demandSince = new Map<string, number>();
  const readyQueue: ReplicaHandle[] = [];
  const watchers: (() => void)[] = [];
  const roles = rolesOf(scenario.models);
  const modelByName = new Map(scenario.models.map((m) => [m.name, m]));
  const rejectWindowMs = Math.max(1000, pc.hysteresisMs);

  const initialMode = (): PlacementMode =>
    policy === 'exclusive' ? 'mixed' : policy === 'share' ? 'share' : roles.large ? pc.initialMode : 'small';
  const actor = createActor(
    placementMachine.provide({
      actions: {
        raiseReservation: ({ context }) =>
          log({
            kind: 'reservation.raised',
            mode: context.target,
            detail: `deadline in ${Math.round(context.deadlineAt - now())} ms`,
          }),
        releaseReservation: ({ context }) => log({ kind: 'reservation.released', mode: context.mode }),
        drainForTarget: ({ context }) => {
          const keep = new Set(layout(context.target as LayoutMode).map((e) => e.id));
          const deadline = Math.max(0, context.deadlineAt - now());
          for (const r of replicas.values()) if (!keep.has(r.id)) drainReplica(r, deadline);
        },
        loadTarget: ({ context }) => {
          log({ kind: 'loading.started', mode: context.target });
          schedule();
        },
        completeSwitch: ({ context }) =>
          log({ kind: 'mode.switched', mode: context.mode, detail: `switch ${context.switches}` }),
        handleGpuFailure: () => schedule(),
        handleGpuRepair: () => schedule(),
      },
    }),
    { input: { mode: initialMode(), t: now() }, clock: runtime.clock, id: 'placement' },
  );
  const snap = () => actor.getSnapshot();
  const stateOf = (): string => String(snap().value);

  const log = (e: Omit<PlacementEvent, 't'>): void => {
    events.push({ t: now(), ...e });
  };
  const healthySet = (): Set<number> => {
    const s = new Set<number>();
    for (const g of gpus.values()) if (g.healthy) s.add(g.index);
    return s;
  };
  // Replica counts a rollout set per model@version; the config's `replicas` otherwise.
  const replicaCounts = new Map<string, number>();
  const countOf = (m: { name: string; replicas: number }, version: string): number =>
    replicaCounts.get(`${m.name}@${version}`) ?? m.replicas;
  const layout = (mode: LayoutMode): LayoutEntry[] => layoutFor(scenario, mode, healthySet(), countOf);
  const places = (mode: PlacementMode, model: string): boolean =>
    layout(mode as LayoutMode).some((e) => e.model.name === model);
  /** The layout the node is heading for now: the target while switching, else the current mode. */
  const desired = (): LayoutEntry[] => {
    const c = snap().context;
    return layout((stateOf() === 'switching' ? c.target : c.mode) as LayoutMode);
  };
  const laneOf = (d: number): 0 | 1 => (d >= n ? 1 : 0);
  const holderOf = (d: number): string | null => {
    const rec = gpus.get(d % n);
    return rec ? (laneOf(d) === 0 ? rec.owner : rec.guest) : null;
  };
  const setHolder = (d: number, id: string | null): void => {
    const rec = gpus.get(d % n)!;
    if (laneOf(d) === 0) rec.owner = id;
    else rec.guest = id;
  };

  let pending = false;
  const schedule = (): void => {
    if (pending) return;
    pending = true;
    runtime.clock.setTimeout(tick, 0);
  };

  const drainReplica = (r: ReplicaHandle, deadlineMs: number): void => {
    const st = r.state();
    if (st !== 'placing' && st !== 'loading' && !st.startsWith('ready')) return;
    log({
      kind: 'drain.started',
      replica: r.id,
      model: r.model,
      gpus: [...r.gpus],
      detail: `deadline ${Math.round(deadlineMs)} ms`,
    });
    if (st === 'placing') r.actor.send({ type: 'replica.stop' });
    else r.actor.send({ type: 'replica.drain', deadlineMs });
  };

  const create = (e: LayoutEntry): void => {
    const m = e.model;
    const epoch = (epochs.get(e.id) ?? 0) + 1;
    epochs.set(e.id, epoch);
    const cost = costOf(scenario, m);
    const b = m.batching;
    const blocks = e.blocksTotal ?? b.kvBlocks ?? cost.kvBlocks(b.blockTokens);
    const opts: ReplicaOptions = {
      id: e.id,
      model: m.name,
      version: e.version,
      gpus: e.devices,
      epoch,
      gpuType: scenario.node.gpu,
      modelProfile: m.profile,
      cost,
      limits: {
        policy: b.policy,
        maxRunning: b.maxRunning,
        tokenBudget: b.tokenBudget,
        blockTokens: b.blockTokens,
        maxContext: b.maxContext,
        watermarkBlocks: Math.floor(blocks * b.watermark),
        blocksTotal: blocks,
      },
      ...(e.slowdown > 1 ? { slowdown: e.slowdown } : {}),
      ...(m.kind === 'stateless' ? { stateless: statelessLimits(m, cost) } : {}),
      onInterrupted: (seqs, reason) => {
        if (interruptions.length < MAX_RECORDS) {
          interruptions.push({
            t: now(),
            replica: e.id,
            reason,
            requests: seqs.map((s) => ({ id: s.id, tokens: s.generated })),
          });
        }
        hooks.onInterrupted(seqs, reason);
      },
      onStep: (r, plan) => {
        hooks.onStep?.(r, plan);
        // The naive policy waits for the node to go idle, which only a step can reveal.
        if (policy === 'switch' && !pc.largeWaitReservation && demandSince.size > 0 && !r.batcher.hasWork()) schedule();
      },
    };
    for (const d of e.devices) setHolder(d, e.id);
    const r = createReplica(runtime, opts);
    replicas.set(e.id, r);
    createdAt.set(e.id, now());
    log({ kind: 'replica.created', replica: e.id, model: m.name, gpus: [...e.devices] });
    r.actor.send({ type: 'replica.start' });
  };

  const free = (e: LayoutEntry): boolean =>
    !replicas.has(e.id) && e.devices.every((d) => gpus.get(d % n)!.healthy && devUp.has(d) && holderOf(d) === null);

  const reconcile = (): void => {
    const st = stateOf();
    if (st !== 'steady' && st !== 'switching') return;
    const want = desired();
    const ids = new Set(want.map((e) => e.id));
    for (const r of replicas.values()) if (!ids.has(r.id)) drainReplica(r, pc.drainDeadlineMs);
    for (const e of want) if (free(e)) create(e);
  };

  const hasAccepting = (model: string): boolean => {
    for (const r of replicas.values()) if (r.model === model && r.accepting()) return true;
    return false;
  };
  const idle = (): boolean => {
    const c = snap().context;
    for (const r of replicas.values()) {
      if (!places(c.mode, r.model)) continue;
      if (r.batcher.hasWork() || !r.state().startsWith('ready')) return false;
      if ((hooks.held?.(r.model) ?? 0) > 0) return false;
    }
    return true;
  };
  const largeImpossible = (): boolean => roles.large !== null && healthySet().size < roles.large.tp;

  const evaluate = (): void => {
    const t = now();
    for (const m of scenario.models) {
      const waiting = (hooks.held?.(m.name) ?? 0) > 0 || t - (lastReject.get(m.name) ?? -Infinity) < rejectWindowMs;
      // Work counts as waiting for placement only while the model can be placed: an outage is not a switch's fault.
      if (waiting && !hasAccepting(m.name) && !reasonFor(m.name)) {
        if (!demandSince.has(m.name)) demandSince.set(m.name, t);
      } else demandSince.delete(m.name);
    }
    if (policy !== 'switch' || !roles.large) return;
    const ev = decideSwitch({
      now: t,
      state: stateOf(),
      context: snap().context,
      config: pc,
      demandSince,
      places,
      largeImpossible: largeImpossible(),
      idle,
    });
    if (ev?.type === 'mode.forced')
      log({ kind: 'mode.forced', mode: ev.mode, detail: `${roles.large.name} cannot be placed` });
    if (ev) actor.send(ev);
  };

  const checkTransitions = (): void => {
    const st = stateOf();
    const c = snap().context;
    if (st === 'draining') {
      const keep = new Set(layout(c.target as LayoutMode).map((e) => e.id));
      if ([...replicas.keys()].every((id) => keep.has(id))) actor.send({ type: 'replicas.drained' });
    } else if (st === 'switching') {
      const want = layout(c.target as LayoutMode);
      if (want.every((e) => replicas.get(e.id)?.state().startsWith('ready')))
        actor.send({ type: 'replicas.loaded', t: now() });
    }
  };

  const reasonFor = (name: string): string | null => {
    const m = modelByName.get(name);
    if (!m) return null;
    const healthy = healthySet().size;
    if (healthy < m.tp) return `${m.name} needs ${m.tp} healthy GPU${m.tp > 1 ? 's' : ''}, ${healthy} available`;
    const modes: LayoutMode[] = policy === 'switch' ? ['large', 'small'] : [policy === 'share' ? 'share' : 'mixed'];
    if (!modes.some((mode) => places(mode, name))) {
      return `${m.name} needs ${m.tp} free GPU${m.tp > 1 ? 's' : ''}; the ${policy} placement gives them to other replicas`;
    }
    return null;
  };
  const updateReasons = (): void => {
    for (const m of scenario.models) {
      const why = reasonFor(m.name);
      if ((reasons.get(m.name) ?? null) === why) continue;
      reasons.set(m.name, why);
      log({ kind: why ? 'unavailable' : 'available', model: m.name, detail: why ?? `${m.name} can be placed` });
    }
  };

  function tick(): void {
    pending = false;
    for (let i = 0; i < 8; i++) {
      const before = snap();
      evaluate();
      checkTransitions();
      reconcile();
      if (snap() === before) break;
    }
    updateReasons();
    while (readyQueue.length > 0) {
      const r = readyQueue.shift()!;
      if (replicas.get(r.id) === r && r.accepting()) hooks.onReplicaReady(r);
    }
    notify();
  }
  const notify = (): void => {
    for (const w of watchers) w();
  };

  const fencing = new Map<number, string>();
  const failGpu = (found: Detected): void => {
    const rec = gpus.get(found.gpu);
    if (!rec || !rec.healthy) return;
    rec.healthy = false;
    rec.up = false;
    const lanes = [found.gpu, found.gpu + n];
    const holders = lanes.map(holderOf).filter((x): x is string => x !== null);
    const boundMs = detector.bounds(found.stepMs ?? 0)[found.path];
    if (failures.length < MAX_RECORDS)
      failures.push({ t: now(), gpu: found.gpu, code: found.code, path: found.path, replicas: holders, boundMs });
    log({ kind: 'gpu.failed', gpu: found.gpu, path: found.path, detail: found.code });
    for (const d of lanes) {
      devUp.delete(d);
      const h = holderOf(d);
      if (h && replicas.has(h)) runtime.send(h, { type: 'gpu.failed', gpu: d, code: found.code });
    }
    // A GPU the control plane declared failed (rather than one that reported it) is taken out of service at the node;
    // the fence is repeated on later heartbeats until the node confirms it (it may be lost in a partition).
    if (found.path !== 'reported') {
      fencing.set(found.gpu, found.code);
      runtime.send('node', { type: 'gpu.fence', gpu: found.gpu, code: found.code });
    }
    actor.send({ type: 'gpu.failed', gpu: found.gpu });
  };

  const detector = createDetector({
    clock: runtime.clock,
    config: scenario.detection,
    physical: (d) => d % n,
    live: () => [...gpus.values()].filter((g) => g.healthy && g.up).map((g) => g.index),
    inflight: function* (): Generator<InflightStep> {
      for (const r of replicas.values()) {
        const f = r.inflight();
        const st = r.state();
        if (f && (st.startsWith('ready') || st.startsWith('draining'))) yield { replica: r.id, devices: r.gpus, ...f };
      }
    },
    onDetected: (found) => {
      for (const f of found) failGpu(f);
      schedule();
    },
  });

  runtime.register('placement', (msg: Msg) => {
    switch (msg.type) {
      case 'gpu.ready': {
        const d = msg['gpu'] as number;
        const rec = gpus.get(d % n);
        if (!rec) return;
        devUp.add(d);
        if (laneOf(d) === 0) {
          const back = !rec.healthy;
          rec.up = true;
          rec.healthy = true;
          detector.up(rec.index);
          log({ kind: 'gpu.ready', gpu: rec.index, ...(back ? { detail: 'repaired' } : {}) });
          if (back) actor.send({ type: 'gpu.repaired', gpu: rec.index });
        }
        schedule();
        break;
      }
      case 'gpu.failed':
        fencing.delete((msg['gpu'] as number) % n);
        failGpu({ gpu: (msg['gpu'] as number) % n, code: String(msg['code']), path: 'reported' });
        schedule();
        break;
      case 'node.heartbeat':
        for (const [g, code] of fencing) runtime.send('node', { type: 'gpu.fence', gpu: g, code });
        detector.heartbeat(msg['gpus'] as number[] | undefined);
        break;
      case 'replica.ready': {
        const r = replicas.get(msg['replica'] as string);
        if (!r) return;
        log({ kind: 'replica.ready', replica: r.id, model: r.model, gpus: [...r.gpus] });
        readyQueue.push(r);
        schedule();
        break;
      }
      case 'replica.failed': {
        const failed = (msg['failedGpus'] as number[] | undefined) ?? [];
        log({
          kind: 'replica.failed',
          replica: msg['replica'] as string,
          detail: `gpu ${failed.map((d) => d % n).join(',')} failed`,
        });
        break;
      }
      case 'replica.stopped': {
        const id = msg['replica'] as string;
        const r = replicas.get(id);
        if (r) {
          for (const d of r.gpus) if (holderOf(d) === id) setHolder(d, null);
          replicas.delete(id);
          runtime.unregister(id);
        }
        log({ kind: 'replica.stopped', replica: id });
        schedule();
        break;
      }
    }
    notify();
  });
  runtime.supervise('placement', actor);
  actor.start();

  const etaMs = (model: string, version: string): number | null => {
    const m = modelByName.get(model);
    if (!m) return null;
    let best: number | null = null;
    for (const r of replicas.values()) {
      if (r.model !== model || r.version !== version) continue;
      const st = r.state();
      if (st.startsWith('ready')) return 0;
      if (st === 'placing' || st === 'loading') {
        const left = Math.max(0, (createdAt.get(r.id) ?? now()) + r.cost.loadS() * 1000 - now());
        if (best === null || left < best) best = left;
      }
    }
    if (best !== null) return best;
    if (!m.versions.includes(version) || countOf(m, version) === 0) return null;
    if (reasonFor(model)) return pc.waitForRepairMs > 0 && healthySet().size < m.tp ? pc.waitForRepairMs : null;
    const load = UNLOAD_MS + loadMsOf(scenario, m);
    if (policy !== 'switch') return load;
    const st = stateOf();
    const c = snap().context;
    const left = Math.max(0, c.deadlineAt - now());
    if (st !== 'steady' && places(c.target, model)) return left + load;
    if (st !== 'steady') {
      const other = roles.large && c.target === 'large' ? loadMsOf(scenario, roles.large) : load;
      return left + UNLOAD_MS + other + pc.drainDeadlineMs + load;
    }
    return places(c.mode, model) ? load : pc.drainDeadlineMs + load;
  };

  const checkInvariants = (): string[] => {
    const out: string[] = [];
    const seen = new Map<number, string>();
    for (const r of replicas.values()) {
      const st = r.state();
      if (st === 'stopped') continue;
      const m = modelByName.get(r.model);
      if (m && r.gpus.length !== m.tp)
        out.push(`${r.id} holds ${r.gpus.length} GPUs, its model needs a gang of ${m.tp}`);
      if (new Set(r.gpus).size !== r.gpus.length) out.push(`${r.id} lists a GPU twice`);
      for (const d of r.gpus) {
        const other = seen.get(d);
        if (other) out.push(`device ${d} belongs to ${other} and ${r.id}`);
        seen.set(d, r.id);
        if (holderOf(d) !== r.id && !r.state().startsWith('failed'))
          out.push(`device ${d} is held by ${r.id} but placement records ${holderOf(d)}`);
      }
    }
    return out;
  };

  return {
    gpus,
    replicas,
    events,
    failures,
    interruptions,
    unavailable: (model) => {
      const why = reasonFor(model);
      return why && pc.waitForRepairMs > 0 && why.includes('healthy') ? null : why;
    },
    etaMs,
    drain: (replica, deadlineMs = pc.drainDeadlineMs) => {
      const r = replicas.get(replica);
      if (!r) return false;
      r.actor.send({ type: 'replica.drain', deadlineMs });
      return true;
    },
    settled: () => {
      if (stateOf() !== 'steady') return false;
      const want = desired();
      const ids = new Set(want.map((e) => e.id));
      for (const r of replicas.values()) if (!ids.has(r.id)) return false;
      return want.every((e) => replicas.get(e.id)?.state().startsWith('ready') === true);
    },
    demand: (model, rejected = false, retryAfterMs = 0) => {
      if (rejected) {
        const until = now() + Math.min(retryAfterMs, pc.drainDeadlineMs);
        if (until > (lastReject.get(model) ?? -Infinity)) lastReject.set(model, until);
        runtime.clock.setTimeout(schedule, until - now() + rejectWindowMs + 1);
      }
      schedule();
    },
    watch: (fn) => {
      watchers.push(fn);
    },
    mode: () => {
      const c = snap().context;
      return { state: stateOf(), mode: c.mode, target: c.target, switches: c.switches };
    },
    checkInvariants,
    setPolicy: (p) => {
      if (p !== 'exclusive' && p !== 'switch' && p !== 'share')
        return failure('invalid_request', `unknown placement policy "${p}"`);
      if ((p === 'share') !== (pc.policy === 'share')) {
        return failure(
          'invalid_request',
          'share needs co-location lanes on the node: set it in the config before start',
        );
      }
      policy = p;
      const holdsLarge = [...replicas.values()].some((r) => r.model === roles.large?.name);
      const mode: PlacementMode =
        p === 'exclusive' ? 'mixed' : p === 'share' ? 'share' : holdsLarge ? 'large' : 'small';
      actor.send({ type: 'mode.forced', mode, t: now() });
      schedule();
      return null;
    },
    detectionBounds: (stepMs) => detector.bounds(stepMs),
    setReplicas: (model, version, count) => {
      const m = modelByName.get(model);
      if (!m || !m.versions.includes(version) || !(count >= 0)) return false;
      replicaCounts.set(`${model}@${version}`, Math.floor(count));
      schedule();
      return true;
    },
  };
}
