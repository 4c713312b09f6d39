// A replica actor: the pure replica machine, provided with its batcher (continuous or stateless, fixed when it is
// created), its GPU commands and the runtime's messaging.
import { createActor, type ActorRefFrom } from 'xstate';
import { stateName } from '../machines/state-name.ts';
import {
  replicaMachine,
  type ReplicaContext,
  type ReplicaEvent,
  type ReplicaTag,
} from '../machines/replica.machine.ts';
import { failure, type OutcomeCode } from '../machines/outcomes.ts';
import type { Msg, Runtime } from '../runtime/system.ts';
import { BrokenInvariant } from '../runtime/contain.ts';
import type { MessageOf, WireEngineSpec } from '../machines/messages.ts';
import { createEngineSteps, type EngineSteps } from './replica-engine.ts';
import {
  createContinuousBatcher,
  type ContinuousBatcher,
  type ContinuousLimits,
  type StepPlan,
} from './batcher/continuous.ts';
import type { CostModel } from './gpu/cost-model.ts';
import type { ModelConfig } from './config.ts';
import type { Sequence } from './batcher/sequence.ts';
import {
  batchShape,
  createStatelessBatcher,
  type ClosedBatch,
  type StatelessBatcher,
  type StatelessLimits,
} from './batcher/stateless.ts';

/** Totals over a replica's completed steps. */
export interface StepStats {
  count: number;
  batchSizeSum: number;
  tokens: number;
  predictedMs: number;
  busyMs: number;
}

/** What a replica is, as the router and placement see it. */
export interface ReplicaHandle {
  readonly id: string;
  readonly model: string;
  readonly version: string;
  readonly gpus: readonly number[];
  readonly epoch: number;
  readonly cost: CostModel;
  /** The real engine its steps run on, or null under the cost model. */
  readonly engine: WireEngineSpec | null;
  /** The KV block and slot ledger; for a stateless replica it stays empty beside the dynamic batcher. */
  readonly batcher: ContinuousBatcher;
  readonly actor: ActorRefFrom<typeof replicaMachine>;
  /** Sends an event to the replica's machine (use this, not `actor.send`: a step in progress holds events back). */
  send(event: ReplicaEvent): void;
  /** The machine's state as a dotted path (`ready.busy`), for display only: decisions use the tags. */
  state(): string;
  /** True when the replica's current state carries `tag`. */
  hasTag(tag: ReplicaTag): boolean;
  /** The one readiness predicate: the replica is `ready` (idle, busy or saturated). */
  ready(): boolean;
  /** True when the replica takes new work (ready and not saturated: tag `accepting`). */
  accepting(): boolean;
  /** Hands a sequence to the batcher and wakes the iteration loop. */
  enqueue(seq: Sequence, atHead?: boolean): void;
  /** The dynamic batcher of a stateless model's replica (one closed batch per step), or null for a generative one. */
  readonly stateless: StatelessBatcher | null;
  /** Stats of completed steps. */
  readonly steps: StepStats;
  /** The step in flight (when dispatched, its predicted time, the ranks that reported it), or null: progress detection. */
  inflight(): { step: number; since: number; predictedMs: number; reported: readonly number[] } | null;
}

/** Options of a replica. */
export interface ReplicaOptions {
  id: string;
  model: string;
  version: string;
  gpus: readonly number[];
  epoch: number;
  gpuType: string;
  modelProfile: string;
  cost: CostModel;
  limits: Omit<ContinuousLimits, 'blocksTotal'> & { blocksTotal?: number };
  /** A stateless model's replica: dynamic batching with these limits (one closed batch per step). Absent for a
   * generative model, whose replica runs iteration-level (continuous) batching. Fixed for the replica's life. */
  stateless?: StatelessLimits;
  /** Extra slowdown applied to step times on the node (co-location interference). */
  slowdown?: number;
  /** Called with every sequence the replica gives up (failure, drain deadline): resume elsewhere or fail. */
  onInterrupted(seqs: Sequence[], reason: OutcomeCode): void;
  /** Called after each applied step (invariant checks, metrics). */
  onStep?(replica: ReplicaHandle, plan: StepPlan): void;
  /** A real engine runs the replica's steps (one host over all its GPUs); absent: the node's cost model. */
  engine?: WireEngineSpec;
  /** The engine's report disagrees with the ledger (a token missing, a cache smaller than the limits). */
  onEngineMismatch?(replica: ReplicaHandle, problem: string): void;
}

/** How often a replica repeats GPU releases that have not been answered (assignments: at least the load time). */
export const GPU_RETRY_MS = 2_000;

/** A stateless model's dynamic-batching limits, from its batching settings, its classes' queues and its profile. */
export function statelessLimits(m: ModelConfig, cost: CostModel): StatelessLimits {
  const b = m.batching.stateless;
  const mp = cost.model;
  // Activations per padded token, as the cost model reserves them (bf16, per GPU of the tensor-parallel gang).
  const bytesPerToken = (3 * (mp.ffn / cost.tp) + 4 * mp.hidden) * 2;
  return {
    maxSize: b.maxBatch,
    maxTokens: b.maxBatchTokens,
    maxMemoryBytes: Math.max(mp.maxContext, b.buckets[b.buckets.length - 1]!) * bytesPerToken,
    maxDelayMs: b.maxDelayMs,
    buckets: b.buckets,
    bytesPerToken,
    maxQueued: m.classes.reduce((n, c) => n + c.maxQueued, 0),
  };
}

/** The step in flight and the totals of applied ones: what the replica's step actions share. */
interface StepLedger {
  plan: StepPlan | null;
  batch: ClosedBatch | null;
  /** The step number on the wire: the machine's step plus the steps run outside it (`extra`). */
  step: number;
  epoch: number;
  /** Steps dispatched by the direct step (outside the machine) since the replica started. */
  extra: number;
  /** The step in flight is counted here, not by the machine (no inspector watched when it was dispatched). */
  direct: boolean;
  /** Ranks of the step in flight that have not reported (direct steps). */
  pending: number;
  /** Which ranks reported the step in flight, so a hung rank can be told from a slow step. */
  reported: number[];
  saturated: boolean;
  /** The step loop threw: the replica is failing as a unit and runs no step again. */
  crashed: boolean;
  stats: StepStats;
}

/** The next stateless step: one closed batch, as a plan with its padded shape. */
function planStateless(stateless: StatelessBatcher, ledger: StepLedger, now: number): StepPlan | null {
  const b = stateless.next();
  ledger.batch = b;
  if (!b) return null;
  const shape = batchShape(b);
  return {
    entries: [],
    shape,
    tokens: b.tokens,
    prefillTokens: b.tokens,
    decodes: 0,
    blocksUsed: 0,
    predictedMs: 0,
    dispatchedAt: now,
  };
}

/** The replica's GPU commands: assignments and releases to the GPUs that have not answered yet. */
function gpuCommands(runtime: Runtime, o: ReplicaOptions, loadMs: number, unloadMs: number) {
  const extra = {
    ...(o.slowdown && o.slowdown > 1 ? { slowdown: o.slowdown } : {}),
    ...(o.engine ? { engine: o.engine } : {}),
  };
  return {
    assign: (c: ReplicaContext): void => {
      for (const g of c.gpus) {
        if (c.loadedGpus.includes(g)) continue;
        const tp = o.gpus.length;
        runtime.send(`gpu.${g}`, {
          type: 'gpu.assign',
          gpu: g,
          replica: c.id,
          epoch: c.gpuEpoch,
          model: o.modelProfile,
          gpuType: o.gpuType,
          tp,
          loadMs,
          unloadMs,
          ...extra,
        });
      }
    },
    release: (c: ReplicaContext): void => {
      for (const g of c.gpus) {
        if (c.failedGpus.includes(g) || c.releasedGpus.includes(g)) continue;
        runtime.send(`gpu.${g}`, { type: 'gpu.release', gpu: g, replica: c.id, epoch: c.gpuEpoch });
      }
    },
  };
}

/** One report for several ranks (an engine's, or a cost-model gang's: NodeAgentOptions.gangs) as the one report
 * per rank it stands for, in order. */
function rankReports(msg: MessageOf<'step.completed'>, gang: readonly number[]): MessageOf<'step.completed'>[] {
  const { replica, epoch, step, busyMs } = msg;
  return gang.map((gpu) => ({
    type: 'step.completed',
    gpu,
    replica,
    epoch,
    step,
    ...(busyMs === undefined ? {} : { busyMs }),
  }));
}

/** An engine's one report for all ranks: its sampled tokens go on the sequences; answers each rank's report. */
function engineCompleted(
  msg: MessageOf<'step.completed'>,
  ledger: StepLedger,
  engine: EngineSteps | null,
  mismatch: (problem: string) => void,
): MessageOf<'step.completed'>[] {
  if (msg.step !== ledger.step || msg.epoch !== ledger.epoch || !ledger.plan || !engine) return [];
  const problem = engine.apply(ledger.plan, msg);
  if (problem) mismatch(problem);
  return rankReports(msg, msg.ranks ?? []);
}

/** What the step loop needs from its replica. */
interface StepLoopDeps {
  runtime: Runtime;
  o: ReplicaOptions;
  batcher: ContinuousBatcher;
  stateless: StatelessBatcher | null;
  engine: EngineSteps | null;
  ledger: StepLedger;
  /** Sends an event to the replica's actor (held back while a direct step runs, as the machine's mailbox would). */
  toActor(e: ReplicaEvent): void;
  handle(): ReplicaHandle;
}

/** The replica's step loop: plans and sends a step, and applies one every rank reported. The machine calls both as
 * its actions; the direct step calls them itself (the same code, so the same results). */
function createStepLoop(d: StepLoopDeps) {
  const { runtime, o, batcher, stateless, engine, ledger } = d;
  const { clock } = runtime;
  const { stats } = ledger;
  /** Plans step `step` and records it as the one in flight; null (after telling the machine) when there is no work.
   * `again`: the step just completed, planned again in its place when the next is the same pure decode; `ahead`:
   * through a decode run (the lane's steps, which nothing outside the replica sees until it returns). */
  const prepare = (c: ReplicaContext, step: number, again: StepPlan | null = null, ahead = false): StepPlan | null => {
    const now = clock.now();
    const plan = stateless
      ? planStateless(stateless, ledger, now)
      : again !== null && batcher.replan(again, ahead)
        ? again
        : batcher.plan(now);
    ledger.plan = plan;
    if (!plan) {
      ledger.saturated = false;
      d.toActor({ type: 'step.empty', epoch: c.epoch });
      return null;
    }
    plan.dispatchedAt = now;
    ledger.step = step;
    ledger.epoch = c.epoch;
    // Emptied by pops (setting an array's length calls into the runtime; a step has a handful of ranks).
    const { reported } = ledger;
    while (reported.length > 0) reported.pop();
    ledger.pending = c.gpus.length;
    // A step is counted outside the machine unless an inspector watches (it must see every rank's report).
    ledger.direct = !runtime.stepByStep();
    plan.predictedMs = o.cost.stepS(plan.shape) * 1000 * (o.slowdown ?? 1);
    const saturated = batcher.saturated();
    if (saturated !== ledger.saturated) {
      ledger.saturated = saturated;
      d.toActor({ type: saturated ? 'work.saturated' : 'work.unsaturated' });
    }
    return plan;
  };
  /** Sends the planned step to the node. */
  const send = (c: ReplicaContext, step: number, plan: StepPlan): void => {
    const prefill = plan.shape.prefill.map((ch) => [ch.tokens, ch.cached]);
    const shape = { prefill, decodeBatch: plan.shape.decodeBatch, decodeContext: plan.shape.decodeContext };
    const { id, epoch, gpus } = c;
    const wire = engine?.wire(plan, batcher.runningList());
    if (wire?.free.length) runtime.send('node', { type: 'seq.free', replica: id, epoch, seqs: wire.free });
    // One literal per case, not a spread of `{}`: a spread copies through the runtime on every step.
    runtime.send(
      'node',
      wire
        ? { type: 'step.execute', replica: id, epoch, step, gpus: [...gpus], shape, open: wire.open, items: wire.items }
        : { type: 'step.execute', replica: id, epoch, step, gpus: [...gpus], shape },
    );
  };
  const dispatch = (c: ReplicaContext, step: number): void => {
    const plan = prepare(c, step);
    if (plan) send(c, step, plan);
  };
  const complete = (): void => {
    const { plan, batch } = ledger;
    ledger.plan = null;
    ledger.batch = null;
    if (!plan) return;
    const now = clock.now();
    batcher.complete(plan, now);
    // The simulated model's result for each member: what it was given.
    if (batch)
      stateless?.complete(
        batch.id,
        batch.members.map((m) => ({ tokens: m.tokens })),
      );
    stats.count++;
    stats.batchSizeSum += batch ? batch.members.length : plan.entries.length;
    stats.tokens += plan.tokens;
    stats.predictedMs += plan.predictedMs;
    stats.busyMs += now - plan.dispatchedAt;
    o.onStep?.(d.handle(), plan);
  };
  return { dispatch, prepare, send, complete };
}

/** The requests a replica's batcher holds, for a fault's report (none known when even reading them throws). */
function heldRequests(batcher: ContinuousBatcher): string[] {
  try {
    return [...batcher.runningList(), ...batcher.waitingList()].map((s) => s.id);
  } catch {
    return [];
  }
}

/** Runs one of the machine's step actions (an inspector watches): a throw fails the replica as a direct step's does
 * (`step.crashed`, taken after the current event), and no step runs after it. */
function guarded(ledger: StepLedger, self: { send(e: ReplicaEvent): void }, action: () => void): void {
  if (ledger.crashed) return;
  try {
    action();
  } catch (error) {
    ledger.crashed = true;
    self.send({ type: 'step.crashed', error });
  }
}

/**
 * A replica's handler of messages about its work: one whose handling throws (an engine's report, a withdrawal) leaves
 * its ledger unknown, so the replica fails as a unit, as when its step loop throws (after the step running now, if
 * any: `toActor` holds events back while one runs).
 */
function failingOnThrow(
  ledger: StepLedger,
  toActor: (e: ReplicaEvent) => void,
  handle: (msg: Msg) => void,
): (msg: Msg) => void {
  return (msg) => {
    try {
      handle(msg);
    } catch (error) {
      ledger.crashed = true;
      toActor({ type: 'step.crashed', error });
    }
  };
}

/** The replica machine with its actions: GPU commands, the step loop, and giving up what it holds on failure. */
function provideReplica(
  runtime: Runtime,
  o: ReplicaOptions,
  gpu: ReturnType<typeof gpuCommands>,
  loop: ReturnType<typeof createStepLoop>,
  parts: {
    ledger: StepLedger;
    engine: EngineSteps | null;
    stateless: StatelessBatcher | null;
    batcher: ContinuousBatcher;
  },
) {
  const { ledger, engine, stateless, batcher } = parts;
  return replicaMachine.provide({
    actions: {
      assignGpus: ({ context }) => gpu.assign(context),
      releaseGpus: ({ context }) => gpu.release(context),
      dispatchStep: ({ context, self }) =>
        guarded(ledger, self, () => loop.dispatch(context, context.step + ledger.extra)),
      completeStep: ({ self }) => guarded(ledger, self, loop.complete),
      crash: ({ event }) => {
        if (event.type !== 'step.crashed') return;
        // A broken invariant is not contained: the actor errors, its fault ends a serving process.
        if (event.error instanceof BrokenInvariant) throw event.error;
        runtime.fault({ actor: o.id, error: event.error, requests: heldRequests(batcher), contained: true });
      },
      abortStep: () => {
        ledger.plan = null;
        ledger.batch = null;
      },
      interruptAll: () => {
        const requests = heldRequests(batcher);
        try {
          engine?.reset();
          stateless?.abortAll(failure('replica_failed', `replica ${o.id} failed with the batch in flight`));
          const seqs = batcher.evictAll();
          if (seqs.length > 0) o.onInterrupted(seqs, 'replica_failed');
        } catch (e) {
          // Its requests could not all be handed back: which of them were resumed or ended is unknown.
          throw new BrokenInvariant(`replica ${o.id} could not give up the requests it held`, requests, e);
        }
      },
    },
    delays: {
      assignRetry: ({ context }) => Math.max(GPU_RETRY_MS, context.loadMs),
      releaseRetry: GPU_RETRY_MS,
    },
  });
}

/** Creates and starts a replica actor registered as its system id. */
export function createReplica(runtime: Runtime, o: ReplicaOptions): ReplicaHandle {
  const { clock } = runtime;
  const batcher = createContinuousBatcher({
    ...o.limits,
    blocksTotal: o.limits.blocksTotal ?? o.cost.kvBlocks(o.limits.blockTokens),
  });
  const stateless = o.stateless
    ? createStatelessBatcher({
        clock,
        limits: o.stateless,
        name: o.id,
        onReady: () => workAvailable(),
      })
    : null;
  const loadMs = o.cost.loadS() * 1000;
  const unloadMs = 1000;
  const gpu = gpuCommands(runtime, o, loadMs, unloadMs);
  const engine: EngineSteps | null = o.engine ? createEngineSteps(o.id, o.limits) : null;
  const stats: StepStats = { count: 0, batchSizeSum: 0, tokens: 0, predictedMs: 0, busyMs: 0 };
  const ledger: StepLedger = {
    ...{ plan: null, batch: null, step: -1, epoch: -1, extra: 0, direct: false, pending: 0 },
    ...{ reported: [], saturated: false, crashed: false, stats },
  };
  // Events for the actor while a direct step runs: delivered after it, as the mailbox delivers them after a macrostep.
  let held: ReplicaEvent[] | null = null;
  const toActor = (e: ReplicaEvent): void => {
    if (held) held.push(e);
    else actor.send(e);
  };
  /** New work for the iteration loop. Only an idle replica's machine acts on it: every other state ignores the event
   * (no transition, no action, and eventless transitions that read the context alone, which it leaves as it is), so
   * it is sent only to an idle machine, or while events are held back (the machine may be idle by the time they are
   * delivered), or while an inspector watches (it sees every event). */
  const workAvailable = (): void => {
    if (held || runtime.stepByStep() || actor.getSnapshot().matches({ ready: 'idle' }))
      toActor({ type: 'work.available' });
  };
  const loop = createStepLoop({ runtime, o, batcher, stateless, engine, ledger, toActor, handle: () => handle });

  const machine = provideReplica(runtime, o, gpu, loop, { ledger, engine, stateless, batcher });
  const actor = createActor(machine, {
    input: { id: o.id, model: o.model, version: o.version, gpus: o.gpus, epoch: o.epoch, loadMs, unloadMs },
    clock,
    id: o.id,
  });
  /** The last rank of a direct step reported: what the machine's `stepReported` transition does (apply the step,
   * count it, dispatch the next), without a snapshot per step. A broken invariant fails the actor as it would have.
   * When the report came through the simulator's lane, the next steps go through it too for as long as the link's
   * shortcut would have answered each (runtime.lane()), and nothing is held for the machine: each is applied as its
   * report would have been, with no message, flush or event of its own. */
  const directStep = (): void => {
    const queued: ReplicaEvent[] = [];
    held = queued;
    try {
      // The completed step's plan is planned again in place of a new one when the next step is the same pure decode
      // (no one keeps a plan past its step; a real engine's steps are always planned afresh).
      let last = engine ? null : ledger.plan;
      loop.complete();
      ledger.extra++;
      const c = actor.getSnapshot().context;
      const run = engine || queued.length > 0 ? null : (runtime.lane()?.open(o.id, c.epoch, c.gpus) ?? null);
      for (;;) {
        const step = c.step + ledger.extra;
        const plan = loop.prepare(c, step, last, run !== null);
        if (!plan) break;
        const busyMs = run && queued.length === 0 ? run.roundTrip(plan.shape) : null;
        if (busyMs === null) {
          loop.send(c, step, plan);
          break;
        }
        for (const g of c.gpus) ledger.reported.push(g);
        ledger.pending = 0;
        loop.complete();
        ledger.extra++;
        last = plan;
      }
      // A decode run's sequences are brought up to date before anything else can read them.
      batcher.settle();
    } catch (error) {
      held = null;
      ledger.crashed = true;
      actor.send({ type: 'step.crashed', error });
      return;
    }
    held = null;
    for (const e of queued) actor.send(e);
  };
  const hasTag = (tag: ReplicaTag): boolean => actor.getSnapshot().hasTag(tag);
  const handle: ReplicaHandle = {
    id: o.id,
    model: o.model,
    version: o.version,
    gpus: o.gpus,
    get epoch() {
      return actor.getSnapshot().context.epoch;
    },
    cost: o.cost,
    engine: o.engine ?? null,
    batcher,
    actor,
    send: toActor,
    state: () => stateName(actor.getSnapshot().value),
    hasTag,
    ready: () => hasTag('ready'),
    accepting: () => hasTag('accepting'),
    enqueue: (seq, atHead) => {
      batcher.enqueue(seq, atHead);
      workAvailable();
    },
    stateless,
    steps: stats,
    inflight: () => {
      const p = ledger.plan;
      return p
        ? { step: ledger.step, since: p.dispatchedAt, predictedMs: p.predictedMs, reported: ledger.reported }
        : null;
    },
  };
  /** A rank's report of the step in flight goes to the machine with the machine's own step number; any other to
   * the machine with one it never accepts (-1), as a stale report was. */
  const toMachine = (msg: MessageOf<'step.completed'>, current: boolean): void =>
    toActor({
      type: 'step.completed',
      gpu: msg.gpu,
      epoch: msg.epoch,
      step: current ? actor.getSnapshot().context.step : -1,
    });
  const onMessage = (msg: Msg): void => {
    const { epoch } = actor.getSnapshot().context;
    switch (msg.type) {
      case 'step.completed': {
        const current = msg.step === ledger.step && msg.epoch === ledger.epoch;
        // An engine reports once for all ranks: its tokens are applied, then each rank counts as a cost model's does.
        // A gang's one report stands for one report per rank, in order (NodeAgentOptions.gangs).
        const ranks = msg.ranks
          ? engineCompleted(msg, ledger, engine, (p) => o.onEngineMismatch?.(handle, p))
          : msg.gang
            ? rankReports(msg, msg.gang)
            : [msg];
        for (const r of ranks) {
          if (current) ledger.reported.push(r.gpu);
          // The machine's `rankOfStep` guard, on the ledger's count: a rank of the step in flight in a stepping state.
          if (current && ledger.direct && r.epoch === epoch && ledger.pending > 0 && !held && hasTag('stepping')) {
            if (--ledger.pending === 0) directStep();
          } else toMachine(r, current);
        }
        return;
      }
      case 'gpu.loaded':
      case 'gpu.released':
      case 'gpu.failed':
        return toActor(msg);
      // A request leaving (cancelled, expired) is the batcher's business, not a change of the replica's state.
      case 'request.withdraw':
        if (!batcher.withdraw(msg.id)) stateless?.cancel(msg.id);
        // The engine frees the cancelled sequence's cells at once (after the step it may be running in).
        if (engine?.withdrawn(msg.id)) runtime.send('node', { type: 'seq.free', replica: o.id, epoch, seqs: [msg.id] });
        return;
    }
  };
  runtime.register(o.id, failingOnThrow(ledger, toActor, onMessage));
  runtime.supervise(o.id, actor);
  actor.start();
  return handle;
}
