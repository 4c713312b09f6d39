// A replica actor: the pure replica machine, provided with a continuous batcher and the runtime's messaging.
import { stateName } from '../machines/state-name.ts';
import { createActor, type ActorRefFrom } from 'xstate';
import { replicaMachine } from '../machines/replica.machine.ts';
import {
  createContinuousBatcher,
  type ContinuousBatcher,
  type ContinuousLimits,
  type StepPlan,
} from './batcher/continuous.ts';
import type { CostModel } from './gpu/cost-model.ts';
import type { Runtime } from '../runtime/system.ts';
import type { Sequence } from './batcher/sequence.ts';
import {
  batchShape,
  createStatelessBatcher,
  type ClosedBatch,
  type StatelessBatcher,
  type StatelessLimits,
} from './batcher/stateless.ts';
import { failure } from '../machines/outcomes.ts';

/** What a replica is, as the router and placement see it. */
export interface ReplicaHandle {
  readonly id: string;
  readonly model: string;
  readonly version: string;
  readonly gpus: readonly number[];
  readonly epoch: number;
  readonly cost: CostModel;
  readonly batcher: ContinuousBatcher;
  readonly actor: ActorRefFrom<typeof replicaMachine>;
  /** The machine's state as a dotted path (`ready.busy`). */
  state(): string;
  /** True when the replica takes new work (`ready`, tag `accepting` or `stepping` in ready). */
  accepting(): boolean;
  /** Hands a sequence to the batcher and wakes the iteration loop. */
  enqueue(seq: Sequence, atHead?: boolean): void;
  /** The dynamic batcher of a stateless model's replica (one closed batch per step), or null. */
  readonly stateless: StatelessBatcher | null;
  /** Makes this replica serve a stateless model with dynamic batching (idempotent); returns its batcher. */
  useStateless(limits: StatelessLimits): StatelessBatcher;
  /** Stats of completed steps. */
  readonly steps: { count: number; batchSizeSum: number; tokens: number; predictedMs: number; busyMs: number };
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
  /** Extra slowdown applied to step times on the node (co-location interference). */
  slowdown?: number;
  /** Called with every sequence the replica gives up (failure, drain deadline): resume elsewhere or fail. */
  onInterrupted(seqs: Sequence[], reason: string): void;
  /** Called after each applied step (invariant checks, metrics). */
  onStep?(replica: ReplicaHandle, plan: StepPlan): void;
}

/** How often a replica repeats GPU releases that have not been answered. */
const RELEASE_RETRY_MS = 2_000;

/** Creates and starts a replica actor registered as its system id. */
export function createReplica(runtime: Runtime, o: ReplicaOptions): ReplicaHandle {
  const batcher = createContinuousBatcher({
    ...o.limits,
    blocksTotal: o.limits.blocksTotal ?? o.cost.kvBlocks(o.limits.blockTokens),
  });
  const loadMs = o.cost.loadS() * 1000;
  const unloadMs = 1000;
  let inflight: StepPlan | null = null;
  // Which ranks reported the step in flight, so a hung rank can be told from a slow step.
  let inflightStep = -1;
  let inflightEpoch = -1;
  const reported: number[] = [];
  let saturated = false;
  // A stateless model's replica runs one closed batch per step instead of iteration-level batching.
  let stateless: StatelessBatcher | null = null;
  let inflightBatch: ClosedBatch | null = null;
  const planStateless = (now: number): StepPlan | null => {
    const b = stateless?.next() ?? null;
    inflightBatch = b;
    if (!b) return null;
    return {
      entries: [],
      shape: batchShape(b),
      tokens: b.tokens,
      prefillTokens: b.tokens,
      decodes: 0,
      blocksUsed: 0,
      predictedMs: 0,
      dispatchedAt: now,
    };
  };
  const steps = { count: 0, batchSizeSum: 0, tokens: 0, predictedMs: 0, busyMs: 0 };
  let handle: ReplicaHandle;

  const assignTo = (gpus: readonly number[], id: string, epoch: number): void => {
    for (const g of gpus) {
      runtime.send(`gpu.${g}`, {
        type: 'gpu.assign',
        gpu: g,
        replica: id,
        epoch,
        model: o.modelProfile,
        gpuType: o.gpuType,
        tp: o.gpus.length,
        loadMs,
        unloadMs,
        ...(o.slowdown && o.slowdown > 1 ? { slowdown: o.slowdown } : {}),
      });
    }
  };
  const machine = replicaMachine.provide({
    actions: {
      assignGpus: ({ context }) => {
        assignTo(context.gpus, context.id, context.gpuEpoch);
        // Assignments (or their answers) can be lost in a partition: repeat them while loading.
        const again = (): void => {
          const snap = actor.getSnapshot();
          if (snap.status !== 'active' || !snap.matches('loading')) return;
          const c = snap.context;
          assignTo(
            c.gpus.filter((g) => !c.loadedGpus.includes(g)),
            c.id,
            c.gpuEpoch,
          );
          runtime.clock.setTimeout(again, Math.max(RELEASE_RETRY_MS, loadMs));
        };
        runtime.clock.setTimeout(again, Math.max(RELEASE_RETRY_MS, loadMs));
      },
      dispatchStep: ({ context, self }) => {
        const plan = stateless ? planStateless(runtime.clock.now()) : batcher.plan(runtime.clock.now());
        inflight = plan;
        if (!plan) {
          saturated = false;
          self.send({ type: 'step.empty', epoch: context.epoch });
          return;
        }
        plan.dispatchedAt = runtime.clock.now();
        inflightStep = context.step;
        inflightEpoch = context.epoch;
        reported.length = 0;
        plan.predictedMs = o.cost.stepS(plan.shape) * 1000 * (o.slowdown ?? 1);
        const nowSaturated = batcher.saturated();
        if (nowSaturated !== saturated) {
          saturated = nowSaturated;
          self.send({ type: nowSaturated ? 'work.saturated' : 'work.unsaturated' });
        }
        runtime.send('node', {
          type: 'step.execute',
          replica: context.id,
          epoch: context.epoch,
          step: context.step,
          gpus: [...context.gpus],
          shape: {
            prefill: plan.shape.prefill.map((c) => [c.tokens, c.cached]),
            decodeBatch: plan.shape.decodeBatch,
            decodeContext: plan.shape.decodeContext,
          },
        });
      },
      completeStep: () => {
        const plan = inflight;
        inflight = null;
        const batch = inflightBatch;
        inflightBatch = null;
        if (plan) {
          batcher.complete(plan, runtime.clock.now());
          // The simulated model's result for each member: what it was given.
          if (batch)
            stateless?.complete(
              batch.id,
              batch.members.map((m) => ({ tokens: m.tokens })),
            );
          steps.count++;
          steps.batchSizeSum += batch ? batch.members.length : plan.entries.length;
          steps.tokens += plan.tokens;
          steps.predictedMs += plan.predictedMs;
          steps.busyMs += runtime.clock.now() - plan.dispatchedAt;
          o.onStep?.(handle, plan);
        }
      },
      abortStep: () => {
        inflight = null;
        inflightBatch = null;
      },
      interruptAll: () => {
        stateless?.abortAll(failure('replica_failed', `replica ${o.id} failed with the batch in flight`));
        const seqs = batcher.evictAll();
        if (seqs.length > 0) o.onInterrupted(seqs, 'replica_failed');
      },
      releaseGpus: ({ context }) => {
        for (const g of context.gpus) {
          if (context.failedGpus.includes(g)) continue;
          runtime.send(`gpu.${g}`, { type: 'gpu.release', gpu: g, replica: context.id, epoch: context.gpuEpoch });
        }
        // Releases (or their answers) can be lost in a partition: repeat them until every GPU is accounted for.
        const resend = (): void => {
          const snap = actor.getSnapshot();
          if (snap.status !== 'active' || !(snap.matches('unloading') || snap.matches('failed'))) return;
          const c = snap.context;
          for (const g of c.gpus) {
            if (c.failedGpus.includes(g) || c.releasedGpus.includes(g)) continue;
            runtime.send(`gpu.${g}`, { type: 'gpu.release', gpu: g, replica: c.id, epoch: c.gpuEpoch });
          }
          runtime.clock.setTimeout(resend, RELEASE_RETRY_MS);
        };
        runtime.clock.setTimeout(resend, RELEASE_RETRY_MS);
      },
    },
  });
  const actor = createActor(machine, {
    input: { id: o.id, model: o.model, version: o.version, gpus: o.gpus, epoch: o.epoch, loadMs, unloadMs },
    clock: runtime.clock,
    id: o.id,
  });
  handle = {
    id: o.id,
    model: o.model,
    version: o.version,
    gpus: o.gpus,
    get epoch() {
      return actor.getSnapshot().context.epoch;
    },
    cost: o.cost,
    batcher,
    actor,
    state: () => stateName(actor.getSnapshot().value),
    accepting: () => actor.getSnapshot().hasTag('accepting'),
    enqueue: (seq, atHead) => {
      batcher.enqueue(seq, atHead);
      actor.send({ type: 'work.available' });
    },
    get stateless() {
      return stateless;
    },
    useStateless: (limits) => {
      stateless ??= createStatelessBatcher({
        clock: runtime.clock,
        limits,
        name: o.id,
        onReady: () => actor.send({ type: 'work.available' }),
      });
      return stateless;
    },
    steps,
    inflight: () =>
      inflight
        ? { step: inflightStep, since: inflight.dispatchedAt, predictedMs: inflight.predictedMs, reported }
        : null,
  };
  runtime.register(o.id, (msg) => {
    if (msg.type === 'step.completed' && msg['step'] === inflightStep && msg['epoch'] === inflightEpoch)
      reported.push(msg['gpu'] as number);
    // A request leaving (cancelled, expired) is the batcher's business, not a change of the replica's state.
    if (msg.type === 'request.withdraw')
      batcher.withdraw(msg['id'] as string) || stateless?.cancel(msg['id'] as string);
    else actor.send(msg as never);
  });
  runtime.supervise(o.id, actor);
  actor.start();
  return handle;
}
