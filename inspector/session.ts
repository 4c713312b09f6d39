// One control plane's inspection: the tap on its runtime (on only while someone reads), node summaries, placement
// events, and the current view of every live actor so that a reader who joins late starts from the present.
import type { InspectionEvent } from 'xstate';
import type { ControlPlane } from '../actors/control-plane.ts';
import { gpuProfile } from '../actors/gpu/profiles.ts';
import type { ReplicaHandle } from '../actors/replica.ts';
import type { MessageOf } from '../machines/messages.ts';
import type { TimerId } from '../runtime/clock.ts';
import type { Msg } from '../runtime/system.ts';
import {
  cleanFields,
  INSPECT_VERSION,
  type ActorFrame,
  type Frame,
  type GpuView,
  type HelloFrame,
  type NodeFrame,
  type ReplicaView,
  type StateFrame,
  type TraceFrame,
} from './protocol.ts';
import { inspectedMachines, type MachineDef } from './statechart.ts';
import { createTap, type Tap } from './tap.ts';

/** Options of an inspection session. */
export interface SessionOptions {
  /** Summaries on a timer of the runtime's clock (serving); otherwise paced by activity (simulation). */
  timer: boolean;
  /** Interval between node summaries (ms of the runtime's clock). */
  summaryMs?: number;
  /** Most live actors whose current view is kept for late readers. */
  maxViews?: number;
  /** Ask the node to forward its GPU actors' snapshots while inspection is on (default: with `timer`, i.e. when
   * serving; a recorded simulation leaves its link's traffic as it was). */
  nodeWatch?: boolean;
}

/** How long a node forwards its GPU actors after one watch message; renewed at a third of it while on. */
export const NODE_WATCH_LEASE_MS = 5000;

/** A node's forwarded GPU snapshot as the tap's inspection event: the same filter and frames as a local actor. */
function remoteSnapshot(m: Msg): InspectionEvent | null {
  if (m.type !== 'inspect.snapshot') return null;
  const s = m as unknown as MessageOf<'inspect.snapshot'>;
  const [top, sub] = s.state.split('.');
  return {
    type: '@xstate.snapshot',
    rootId: s.id,
    actorRef: { id: s.id, logic: { id: 'gpu' } },
    event: { type: s.event },
    snapshot: {
      value: sub === undefined ? top : { [top!]: sub },
      status: s.status,
      context: { replica: s.replica, epoch: s.epoch, faultCode: s.faultCode },
    },
  } as unknown as InspectionEvent;
}

/** A reader of the stream. */
export type Sink = (frame: Frame) => void;

/** The inspection of one control plane. */
export interface InspectionSession {
  /** The first frame a reader gets. */
  hello(mode: 'live' | 'replay'): HelloFrame;
  /** Adds a reader; it first hears the current view (actors, traces, recent placement events, a summary). */
  subscribe(sink: Sink): () => void;
  /** Adds a raw XState inspection observer (e.g. @statelyai/inspect's sender). */
  observeRaw(observer: (ev: InspectionEvent) => void): () => void;
  /** A node summary as of now. */
  summary(): NodeFrame;
  /** True while inspection is on. */
  active(): boolean;
  readonly tap: Tap;
  /** Stops everything and turns inspection off. */
  close(): void;
}

/** The state a GPU is shown in, from placement's record and the replica holding it. */
function gpuState(
  healthy: boolean,
  up: boolean,
  replica: ReplicaHandle | undefined,
  reserved: boolean,
): { state: string; machineState: string } {
  if (!healthy) return { state: 'failed', machineState: 'failed' };
  if (!up) return { state: 'probing', machineState: 'probing' };
  if (!replica) return reserved ? { state: 'reserved', machineState: 'free' } : { state: 'free', machineState: 'free' };
  if (replica.ready()) return { state: 'serving', machineState: 'allocated.serving' };
  // Placed or loading (live but not ready), or draining (still serving, no longer ready).
  if (replica.hasTag('live')) return { state: 'loading', machineState: 'allocated.loading' };
  if (replica.hasTag('serving')) return { state: 'draining', machineState: 'allocated.serving' };
  return { state: 'unloading', machineState: 'allocated.unloading' };
}

/** The node's GPU actors in the inspection: watch leases sent while on, their forwarded snapshots handed to `see`. */
function nodeWatcher(runtime: ControlPlane['runtime'], enabled: boolean, see: (ev: InspectionEvent) => void) {
  let watchedAt = -Infinity;
  const watch = (leaseMs: number): void => {
    if (!enabled) return;
    watchedAt = runtime.clock.now();
    runtime.send('node', { type: 'inspect.watch', leaseMs });
  };
  if (enabled)
    runtime.register('inspector', (m) => {
      const ev = remoteSnapshot(m);
      if (ev) see(ev);
    });
  return {
    start: () => watch(NODE_WATCH_LEASE_MS),
    renew: () => {
      if (runtime.clock.now() - watchedAt >= NODE_WATCH_LEASE_MS / 3) watch(NODE_WATCH_LEASE_MS);
    },
    end: () => watch(0),
    close: () => {
      if (enabled) runtime.unregister('inspector');
    },
  };
}

/** Starts (idle) inspection of a control plane; inspection turns on with the first reader and off with the last. */
export function createInspectionSession(cp: ControlPlane, opts: SessionOptions): InspectionSession {
  const { runtime } = cp;
  const { clock } = runtime;
  const summaryMs = opts.summaryMs ?? 250;
  const maxViews = opts.maxViews ?? 20_000;
  const memoryBytes = gpuProfile(cp.scenario.node.gpu).memoryBytes;
  let machines: Record<string, MachineDef> | null = null;
  const sinks = new Set<Sink>();
  const raws = new Set<(ev: InspectionEvent) => void>();
  const views = new Map<string, { actor: ActorFrame; state: StateFrame | null; trace: TraceFrame | null }>();
  let placementView: PlacementView = { state: 'steady', ctx: {} };
  let placementSeen = 0;
  let lastSummary = -Infinity;
  let timer: TimerId | null = null;
  let on = false;
  const node = nodeWatcher(runtime, opts.nodeWatch ?? opts.timer, (ev) => on && tap.observe(ev));
  const broadcast = (f: Frame): void => {
    for (const s of sinks) s(f);
  };

  const remember = (f: Frame): void => {
    if (f.k === 'actor') {
      if (views.size < maxViews) views.set(f.id, { actor: f, state: null, trace: null });
    } else if (f.k === 'state') {
      if (f.m === 'placement') placementView = { state: f.s, ctx: f.ctx };
      const v = views.get(f.id);
      if (f.done) views.delete(f.id);
      else if (v) v.state = f;
    } else if (f.k === 'trace') {
      const v = views.get(f.id);
      if (v) v.trace = f;
    }
  };

  const placementFrames = (): void => {
    const evs = cp.placement.events;
    if (evs.length < placementSeen) placementSeen = 0;
    for (; placementSeen < evs.length; placementSeen++) {
      const e = evs[placementSeen]!;
      broadcast({ k: 'place', t: e.t, ev: cleanFields(e as unknown as Record<string, unknown>, null) });
    }
  };

  const summary = (): NodeFrame => nodeSummary(cp, placementView, memoryBytes);

  const emitSummary = (): void => {
    lastSummary = clock.now();
    if (on) node.renew();
    placementFrames();
    broadcast(summary());
  };

  const tap = createTap({
    now: () => clock.now(),
    explain: (id) => cp.explain(id),
    emit: (f) => {
      placementFrames();
      remember(f);
      broadcast(f);
    },
    tick: opts.timer
      ? undefined
      : () => {
          if (clock.now() - lastSummary >= summaryMs) emitSummary();
        },
  });

  const observer = (ev: InspectionEvent): void => {
    tap.observe(ev);
    for (const r of raws) r(ev);
  };

  const beat = (): void => {
    emitSummary();
    timer = clock.setTimeout(beat, summaryMs);
  };

  const update = (): void => {
    const want = sinks.size + raws.size > 0;
    if (want === on) return;
    on = want;
    if (on) {
      views.clear();
      placementSeen = Math.max(0, cp.placement.events.length - 50);
      runtime.setInspector(observer);
      node.start();
      if (opts.timer) timer = clock.setTimeout(beat, summaryMs);
    } else {
      runtime.setInspector(null);
      node.end();
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
    }
  };

  return {
    hello: (mode) => {
      machines ??= inspectedMachines();
      return {
        k: 'hello',
        v: INSPECT_VERSION,
        t: clock.now(),
        mode,
        scenario: cp.scenario.name,
        gpus: cp.placement.gpus.size,
        machines,
      };
    },
    subscribe: (sink) => {
      if (on) {
        // Catch the late reader up from the current view; the first reader gets it from the runtime's replay.
        const evs = cp.placement.events;
        for (const e of evs.slice(Math.max(0, placementSeen - 50), placementSeen))
          sink({ k: 'place', t: e.t, ev: cleanFields(e as unknown as Record<string, unknown>, null) });
        for (const v of views.values()) {
          sink(v.actor);
          if (v.state) sink(v.state);
          if (v.trace) sink(v.trace);
        }
        sinks.add(sink);
      } else {
        sinks.add(sink);
        update();
        placementFrames();
      }
      sink(summary());
      return () => {
        sinks.delete(sink);
        update();
      };
    },
    observeRaw: (r) => {
      raws.add(r);
      update();
      return () => {
        raws.delete(r);
        update();
      };
    },
    summary,
    active: () => on,
    tap,
    close: () => {
      sinks.clear();
      raws.clear();
      update();
      node.close();
    },
  };
}

/** Placement's latest state as seen through the inspection stream. */
interface PlacementView {
  state: string;
  ctx: Record<string, unknown>;
}

/** A node summary as of now: every GPU's state and memory, every replica's queue, placement's mode. */
function nodeSummary(cp: ControlPlane, placementView: PlacementView, memoryBytes: number): NodeFrame {
  const reservation = placementView.ctx['reservation'] === true;
  const gpus: GpuView[] = [];
  for (const g of cp.placement.gpus.values()) {
    const r = g.owner ? cp.placement.replicas.get(g.owner) : undefined;
    // Under `share` a second replica may sit on the GPU's other lane: its memory counts too.
    const guestId = (g as { guest?: string | null }).guest ?? null;
    const guest = guestId ? cp.placement.replicas.get(guestId) : undefined;
    const st = gpuState(g.healthy, g.up, r, reservation);
    let weightsBytes = 0;
    let kvBytes = 0;
    if (st.state !== 'failed') {
      for (const x of [r, guest]) {
        if (!x) continue;
        weightsBytes += x.cost.weightsBytesPerGpu;
        kvBytes += (x.work.stats().blocksUsed * x.work.limits.blockTokens * x.cost.kvBytesPerToken) / x.cost.tp;
      }
    }
    gpus.push({
      index: g.index,
      ...st,
      replica: g.owner,
      guest: guestId,
      model: r?.model ?? null,
      healthy: g.healthy,
      memoryBytes,
      weightsBytes,
      kvBytes,
    });
  }
  const replicas: ReplicaView[] = [];
  for (const r of cp.placement.replicas.values()) {
    const s = r.work.stats();
    replicas.push({
      id: r.id,
      model: r.model,
      version: r.version,
      state: r.state(),
      epoch: r.epoch,
      gpus: [...r.gpus],
      step: r.steps.count,
      waiting: s.waiting,
      running: s.running,
      blocksUsed: s.blocksUsed,
      blocksTotal: s.blocksTotal,
      steps: r.steps.count,
    });
  }
  const held: [string, string][] = [];
  for (const m of cp.scenario.models) {
    // A model held for a repair refuses nothing, but it is not served either: the page says why, and that it waits.
    const refused = cp.placement.unavailable(m.name);
    const unplaced = refused ?? cp.placement.unplaced(m.name);
    if (unplaced) held.push([m.name, refused ? refused : `held until repaired: ${unplaced}`]);
  }
  // Made from entries: a model named `__proto__` is then a key like any other.
  const unavailable: Record<string, string> = Object.fromEntries(held);
  const ctx = placementView.ctx;
  return {
    k: 'node',
    t: cp.runtime.clock.now(),
    placement: {
      policy: cp.scenario.placement.policy,
      state: placementView.state,
      mode: typeof ctx['mode'] === 'string' ? ctx['mode'] : 'mixed',
      target: typeof ctx['target'] === 'string' ? ctx['target'] : 'mixed',
      reservation,
      unavailable,
    },
    gpus,
    replicas,
    live: cp.live(),
  };
}
