// A replica actor on the control plane: the pure replica machine (its lifecycle) provided with GPU commands, and the
// control plane's side of its engine core. The core (actors/engine-core/), in the process that drives the engine,
// runs the step loop; this side hands it requests (`seq.submit`, `seq.cancel`), applies its progress to the
// requests' sequences (scheduled, tokens, preempted, finished) and keeps the view routing predicts from: the core's
// last load plus what was submitted since (actors/replica-view.ts). No step crosses a process.
import { createActor, type ActorRefFrom } from 'xstate';
import { stateName } from '../machines/state-name.ts';
import {
  replicaMachine,
  type ReplicaContext,
  type ReplicaEvent,
  type ReplicaTag,
} from '../machines/replica.machine.ts';
import { failure, type Failure, type OutcomeCode } from '../machines/outcomes.ts';
import type { Msg, Runtime } from '../runtime/system.ts';
import { BrokenInvariant } from '../runtime/contain.ts';
import type { MessageOf, WireEngineSpec } from '../machines/messages.ts';
import type { CacheReport, SeqEvent, SubmitSeq } from '../machines/core-messages.ts';
import type { ContinuousLimits } from './batcher/continuous.ts';
import type { CostModel } from './gpu/cost-model.ts';
import type { ModelConfig } from './config.ts';
import { ownerKey, type Sequence } from './batcher/sequence.ts';
import { statelessAdmission, type StatelessItem, type StatelessLimits } from './batcher/stateless.ts';
import { createWorkView, type StepStats, type WorkView } from './replica-view.ts';

export type { StepStats } from './replica-view.ts';

/** What a replica is, as the router and placement see it. */
export interface ReplicaHandle {
  readonly id: string;
  readonly model: string;
  readonly version: string;
  readonly gpus: readonly number[];
  readonly epoch: number;
  readonly cost: CostModel;
  /** The real engine its core drives, or null under the cost model. */
  readonly engine: WireEngineSpec | null;
  /** What the control plane knows of its work: the core's last load plus what was submitted since. */
  readonly work: WorkView;
  readonly actor: ActorRefFrom<typeof replicaMachine>;
  /** Sends an event to the replica's machine. */
  send(event: ReplicaEvent): void;
  /** The machine's state as a dotted path (`ready.busy`), for display only: decisions use the tags. */
  state(): string;
  /** True when the replica's current state carries `tag`. */
  hasTag(tag: ReplicaTag): boolean;
  /** The one readiness predicate: the replica is `ready` (idle, busy or saturated). */
  ready(): boolean;
  /** True when the replica takes new work (ready and not saturated: tag `accepting`). */
  accepting(): boolean;
  /** Hands a generative sequence to the replica's core. */
  enqueue(seq: Sequence, atHead?: boolean): void;
  /** A stateless model's replica (dynamic batching in its core), or null for a generative one. */
  readonly stateless: StatelessLimits | null;
  /** Why a stateless request would be refused here (no batch holds it, queue full), or null. */
  checkItem(item: Pick<StatelessItem, 'id' | 'tokens'>): Failure | null;
  /** Hands a stateless request to the replica's core (after checkItem passed). */
  submitItem(item: StatelessItem): void;
  /** Totals over the core's steps. */
  readonly steps: StepStats;
  /** The work in flight the control plane has not heard progress of (when it started, the time predicted for it, the
   * ranks that reported it finished), or null when the replica holds no work: progress (hung-rank) detection. */
  inflight(): { step: number; since: number; predictedMs: number; reported: readonly number[] } | null;
}

/** What one progress report of a replica's core covered. */
export interface ProgressDelta {
  steps: number;
  /** Sequences (or stateless requests) summed over those steps. */
  members: number;
  predictedMs: number;
  busyMs: number;
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
  /** Called after each progress report of the core that ran steps (metrics, health, held requests). */
  onProgress?(replica: ReplicaHandle, delta: ProgressDelta): void;
  /** Its core's prefix cache kept or evicted blocks (the control plane's prefix index mirrors them). */
  onCache?(replica: ReplicaHandle, cache: CacheReport): void;
  /** A real engine runs the replica's steps (one host over all its GPUs); absent: the node's cost model. */
  engine?: WireEngineSpec;
  /** The core checks its batcher's invariants after every step (simulation). */
  checkCore?: boolean;
  /** A sequence the core refused (its message): the request fails alone. */
  onRefused?(seq: Sequence, message: string): void;
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

/** The replica's GPU commands: assignments and releases to the GPUs that have not answered yet. */
function gpuCommands(runtime: Runtime, o: ReplicaOptions, loadMs: number, unloadMs: number, limits: ContinuousLimits) {
  const core = {
    gpus: [...o.gpus],
    owner: ownerKey(o.model, o.version),
    limits,
    ...(o.stateless ? { stateless: o.stateless } : {}),
    ...(o.checkCore ? { check: true } : {}),
  };
  const extra = {
    ...(o.slowdown && o.slowdown > 1 ? { slowdown: o.slowdown } : {}),
    ...(o.engine ? { engine: o.engine } : {}),
    core,
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

/** The wire form of a sequence handed to a core. */
function submitOf(seq: Sequence, atHead: boolean): SubmitSeq {
  const t = seq.tokens;
  const base: SubmitSeq = {
    id: seq.id,
    priority: seq.priority,
    order: seq.order,
    promptTokens: seq.promptTokens,
    outputTokens: seq.outputTokens,
    maxTokens: seq.maxTokens,
    estOutputTokens: seq.estOutputTokens,
    generated: seq.generated,
  };
  if (atHead) base.atHead = true;
  if (seq.hashes) base.blocks = [...seq.hashes];
  if (t) {
    base.prompt = [...t.prompt];
    base.out = t.out.slice(0, seq.generated);
    const p = t.sampling;
    base.sampling = {
      ...(p.temperature !== undefined ? { temperature: p.temperature } : {}),
      ...(p.topP !== undefined ? { topP: p.topP } : {}),
      ...(p.seed !== undefined ? { seed: p.seed } : {}),
      ...(p.stop !== undefined && p.stop.length > 0 ? { stop: [...p.stop] } : {}),
      ...(p.logprobs !== undefined ? { logprobs: p.logprobs } : {}),
      ...(p.jsonSchema !== undefined ? { jsonSchema: p.jsonSchema } : {}),
    };
  }
  return base;
}

/** The control plane's sequences of one replica, moved by its core's progress events. */
function createProgressApplier(o: ReplicaOptions, held: Map<string, Sequence>, items: Map<string, StatelessItem>) {
  // The replica's decode set, as the last `g` event named it.
  let decodeSet: string[] = [];
  /** Scheduled at `t`, starting with `cached` prompt tokens its core found in its prefix cache. */
  const scheduled = (s: Sequence, t: number, cached: number): void => {
    s.running = true;
    s.computed = cached;
    s.prefillGoal = s.promptTokens + s.generated;
    s.lastTokenAt = -1;
    s.listener.scheduled(s, t);
  };
  const tokens = (s: Sequence, e: Extract<SeqEvent, { k: 't' }>, t: number): void => {
    if (e.ids && s.tokens) {
      for (const id of e.ids) s.tokens.out.push(id);
      s.tokens.lastText = e.text ?? '';
      s.tokens.lastLogprob = e.lp?.[e.lp.length - 1] ?? null;
    }
    for (let i = 0; i < e.n; i++) {
      s.generated++;
      s.listener.tokens(s, 1, t);
      s.lastTokenAt = t;
    }
  };
  /** One token for each of the decode set, none its first: one sameGap call per listener that has one. */
  const decodeStep = (t: number): void => {
    let l: Sequence['listener'] | null = null;
    let gap = -1;
    let n = 0;
    for (const id of decodeSet) {
      const s = held.get(id);
      if (!s || !s.running) continue;
      s.generated++;
      if (s.listener.sameGap && !s.awaitingToken && s.lastTokenAt >= 0 && (l === null || l === s.listener)) {
        if (l === null) {
          l = s.listener;
          gap = t - s.lastTokenAt;
        }
        if (t - s.lastTokenAt === gap) {
          n++;
          s.lastTokenAt = t;
          continue;
        }
      }
      s.listener.tokens(s, 1, t);
      s.lastTokenAt = t;
    }
    if (l && n > 0) l.sameGap!(n, gap);
  };
  /** Consecutive decode steps of the decode set at times `ts`: the first as decodeStep; when that left every sequence
   * of the set with one listener's sameGap and its last token at the first step's time, the rest as one sameGap call
   * per step and one pass over the set (else step by step). */
  const decodeRun = (ts: readonly number[]): void => {
    const t0 = ts[0]!;
    decodeStep(t0);
    const k = ts.length;
    if (k === 1) return;
    let l: Sequence['listener'] | null = null;
    let n = 0;
    for (const id of decodeSet) {
      const s = held.get(id);
      if (!s || !s.running) continue;
      if (l === null) l = s.listener;
      if (s.listener !== l || !l.sameGap || s.awaitingToken || s.lastTokenAt !== t0) {
        for (let j = 1; j < k; j++) decodeStep(ts[j]!);
        return;
      }
      n++;
    }
    if (l === null) return;
    for (let j = 1; j < k; j++) l.sameGap!(n, ts[j]! - ts[j - 1]!);
    const last = ts[k - 1]!;
    for (const id of decodeSet) {
      const s = held.get(id);
      if (!s || !s.running) continue;
      s.generated += k - 1;
      s.lastTokenAt = last;
    }
  };
  const finished = (e: Extract<SeqEvent, { k: 'f' }>, t: number): void => {
    const s = held.get(e.id);
    if (s) {
      held.delete(e.id);
      s.running = false;
      if (e.error !== undefined) {
        o.onRefused?.(s, e.error);
        return;
      }
      if (s.tokens && e.reason !== 'done') s.tokens.finish = e.reason;
      s.listener.finished(s, t);
      return;
    }
    const item = items.get(e.id);
    if (!item) return;
    items.delete(e.id);
    if (e.error !== undefined) {
      const [code, ...rest] = e.error.split(': ');
      const known = code === 'overloaded' || code === 'invalid_request' || code === 'replica_failed';
      item.reply({ ok: false, failure: failure(known ? code : 'internal', known ? rest.join(': ') : e.error) });
    } else
      item.reply({
        ok: true,
        result: { tokens: e.result ?? 0 },
        batch: e.batch ?? '',
        batchSize: e.size ?? 1,
        closedBy: 'size',
      });
  };
  return {
    /** `t`: when the report was heard, `at` when it was made (on the core's clock), `tStart` when its step started. */
    apply: (events: readonly SeqEvent[], t: number, tStart: number, at: number): void => {
      for (const e of events) {
        switch (e.k) {
          case 's': {
            const s = held.get(e.id);
            if (s) scheduled(s, tStart, e.c ?? 0);
            else items.get(e.id)?.started?.(tStart);
            break;
          }
          case 'p': {
            const s = held.get(e.id);
            if (!s) break;
            s.running = false;
            s.listener.preempted(s, t);
            break;
          }
          case 't': {
            const s = held.get(e.id);
            if (s) tokens(s, e, t);
            break;
          }
          case 'g': {
            if (e.ids) decodeSet = e.ids;
            const ends = e.at;
            if (ends === undefined) {
              decodeStep(t);
              break;
            }
            // Each step's end, on this clock: as long before the report was heard as it was before it was made.
            const ts = new Array<number>(ends.length);
            for (let j = 0; j < ends.length; j++) ts[j] = t - (at - ends[j]!);
            decodeRun(ts);
            break;
          }
          case 'f':
            finished(e, t);
            break;
        }
      }
    },
    reset: (): void => {
      decodeSet = [];
    },
  };
}

/** Takes back every request a replica holds (failure, drain deadline): the sequences go to `onInterrupted`, the
 * stateless requests fail. */
function giveUp(o: ReplicaOptions, held: Map<string, Sequence>, items: Map<string, StatelessItem>): void {
  const requests = [...held.keys(), ...items.keys()];
  try {
    const seqs = [...held.values()];
    held.clear();
    for (const s of seqs) s.running = false;
    const its = [...items.values()];
    items.clear();
    const f = failure('replica_failed', `replica ${o.id} failed with the batch in flight`);
    for (const it of its) it.reply({ ok: false, failure: f });
    if (seqs.length > 0) o.onInterrupted(seqs, 'replica_failed');
  } catch (e) {
    // Its requests could not all be handed back: which of them were resumed or ended is unknown.
    throw new BrokenInvariant(`replica ${o.id} could not give up the requests it held`, requests, e);
  }
}

/** The work of a replica its control plane has not heard progress of (see ReplicaHandle.inflight). */
function inflightOf(
  o: ReplicaOptions,
  work: WorkView,
  limits: ContinuousLimits,
  reported: readonly number[],
): ReturnType<ReplicaHandle['inflight']> {
  const l = work.last();
  if (l && l.inflightPredictedMs > 0)
    return { step: l.stepCount, since: work.heardAt() - l.inflightMs, predictedMs: l.inflightPredictedMs, reported };
  const pendingAt = work.oldestPending();
  if (pendingAt >= 0) {
    const prefill = Math.min(work.pendingPrefill(), limits.tokenBudget);
    const stepMs = o.cost.stepS({ prefill: [{ tokens: prefill, cached: 0 }], decodeBatch: 0, decodeContext: 0 }) * 1000;
    const predictedMs = stepMs * (o.slowdown ?? 1) + (o.stateless?.maxDelayMs ?? 0);
    return { step: l?.stepCount ?? 0, since: pendingAt, predictedMs, reported };
  }
  if (l && l.queued > 0 && o.stateless)
    return { step: l.stepCount, since: work.heardAt(), predictedMs: o.stateless.maxDelayMs, reported };
  return null;
}

/** Refuses a sequence a replica's core could not take: another model@version's, or longer than its context. */
function admitSeq(o: ReplicaOptions, limits: ContinuousLimits, seq: Sequence): void {
  const owner = ownerKey(o.model, o.version);
  // Only this replica's model@version: its core takes every sequence as its own.
  if (seq.owner !== '' && seq.owner !== owner)
    throw new Error(`sequence ${seq.id} of ${seq.owner} handed to ${o.id}, a replica of ${owner}`);
  if (seq.promptTokens + seq.maxTokens > limits.maxContext)
    throw new RangeError(
      `sequence ${seq.id}: prompt ${seq.promptTokens} + max tokens ${seq.maxTokens} exceed the context of ${limits.maxContext}`,
    );
}

/** What a submitted sequence adds to the view until its core reports it. */
const pendingOf = (seq: Sequence) => ({
  id: seq.id,
  rank: seq.priority,
  prefill: seq.promptTokens + seq.generated,
  decode: Math.max(0, seq.estOutputTokens - seq.generated),
  finalTokens: seq.promptTokens + seq.estOutputTokens,
});

/** Creates and starts a replica actor registered as its system id. */
export function createReplica(runtime: Runtime, o: ReplicaOptions): ReplicaHandle {
  const { clock } = runtime;
  const limits: ContinuousLimits = {
    ...o.limits,
    blocksTotal: o.limits.blocksTotal ?? o.cost.kvBlocks(o.limits.blockTokens),
  };
  const work = createWorkView(limits);
  const held = new Map<string, Sequence>();
  const items = new Map<string, StatelessItem>();
  const progress = createProgressApplier(o, held, items);
  const loadMs = o.cost.loadS() * 1000;
  const unloadMs = 1000;
  const gpu = gpuCommands(runtime, o, loadMs, unloadMs, limits);
  // Ranks that finished the step in flight while another has not (a partial report), for hung-rank detection.
  let reported: number[] = [];
  let crashed = false;

  const machine = replicaMachine.provide({
    actions: {
      assignGpus: ({ context }) => gpu.assign(context),
      releaseGpus: ({ context }) => gpu.release(context),
      crash: ({ event }) => {
        if (event.type !== 'step.crashed') return;
        // A broken invariant is not contained: the actor errors, its fault ends a serving process.
        if (event.error instanceof BrokenInvariant) throw event.error;
        const requests = [...held.keys(), ...items.keys()];
        runtime.fault({ actor: o.id, error: event.error, requests, contained: true });
      },
      interruptAll: () => {
        work.reset();
        progress.reset();
        reported = [];
        giveUp(o, held, items);
      },
    },
    delays: {
      assignRetry: ({ context }) => Math.max(GPU_RETRY_MS, context.loadMs),
      releaseRetry: GPU_RETRY_MS,
    },
  });
  const actor = createActor(machine, {
    input: { id: o.id, model: o.model, version: o.version, gpus: o.gpus, epoch: o.epoch, loadMs, unloadMs },
    clock,
    id: o.id,
  });
  const hasTag = (tag: ReplicaTag): boolean => actor.getSnapshot().hasTag(tag);
  const epochNow = (): number => actor.getSnapshot().context.epoch;
  /** New work for the core: an idle machine becomes busy (every other state ignores the event). */
  const workAvailable = (): void => {
    if (runtime.stepByStep() || actor.getSnapshot().matches({ ready: 'idle' })) actor.send({ type: 'work.available' });
  };
  const serving = (): boolean => hasTag('serving');

  let saturated = false;
  const onProgress = (msg: MessageOf<'seq.progress'>): void => {
    if (msg.epoch !== epochNow() || !serving()) return;
    const now = clock.now();
    if (msg.ranks) {
      reported = msg.ranks;
      return;
    }
    reported = [];
    if (msg.cache) o.onCache?.(handle, msg.cache);
    const before = work.last();
    progress.apply(msg.events, now, now - Math.max(0, msg.at - msg.start), msg.at);
    work.heard(msg.load, now);
    const l = msg.load;
    if (l.saturated !== saturated) {
      saturated = l.saturated;
      actor.send({ type: saturated ? 'work.saturated' : 'work.unsaturated' });
    }
    if (!work.hasWork()) actor.send({ type: 'work.idle' });
    const steps = l.stepCount - (before?.stepCount ?? 0);
    if (steps > 0)
      o.onProgress?.(handle, {
        steps,
        members: l.stepMembers - (before?.stepMembers ?? 0),
        predictedMs: l.stepPredictedMs - (before?.stepPredictedMs ?? 0),
        busyMs: l.stepBusyMs - (before?.stepBusyMs ?? 0),
      });
  };
  const submit = (msg: Omit<MessageOf<'seq.submit'>, 'type' | 'replica' | 'epoch'>): void =>
    runtime.send('node', { type: 'seq.submit', replica: o.id, epoch: epochNow(), ...msg });

  const handle: ReplicaHandle = {
    id: o.id,
    model: o.model,
    version: o.version,
    gpus: o.gpus,
    get epoch() {
      return epochNow();
    },
    cost: o.cost,
    engine: o.engine ?? null,
    work,
    actor,
    send: (e) => actor.send(e),
    state: () => stateName(actor.getSnapshot().value),
    hasTag,
    ready: () => hasTag('ready'),
    accepting: () => hasTag('accepting'),
    enqueue: (seq, atHead = false) => {
      admitSeq(o, limits, seq);
      held.set(seq.id, seq);
      seq.running = false;
      work.submitted(pendingOf(seq), clock.now());
      submit({ seqs: [submitOf(seq, atHead)] });
      workAvailable();
    },
    stateless: o.stateless ?? null,
    checkItem: (item) =>
      o.stateless ? statelessAdmission(item, o.stateless, items.has(item.id), work.queued()) : null,
    submitItem: (item) => {
      items.set(item.id, item);
      work.submitted({ id: item.id, rank: 0, prefill: 0, decode: 0, finalTokens: 0 }, clock.now());
      const { id, tokens, dtype, adapter, options } = item;
      submit({ items: [{ id, tokens, dtype, adapter, options: { ...options } }] });
      workAvailable();
    },
    get steps() {
      return work.steps();
    },
    inflight: () => inflightOf(o, work, limits, reported),
  };
  const onMessage = (msg: Msg): void => {
    switch (msg.type) {
      case 'seq.progress':
        return onProgress(msg);
      case 'gpu.loaded':
      case 'gpu.released':
      case 'gpu.failed':
        return actor.send(msg);
      // A request leaving (cancelled, expired): the core drops it at once.
      case 'request.withdraw': {
        const s = held.get(msg.id);
        const known = held.delete(msg.id) || items.delete(msg.id);
        if (!known) return;
        work.cancelled(msg.id, s ? { ...pendingOf(s), running: s.running } : undefined);
        runtime.send('node', { type: 'seq.cancel', replica: o.id, epoch: epochNow(), ids: [msg.id] });
        return;
      }
    }
  };
  runtime.register(o.id, (msg) => {
    // After a crash the replica's work is unknown: its core's reports are dropped; its GPUs' answers still count.
    if (crashed && msg.type === 'seq.progress') return;
    try {
      onMessage(msg);
    } catch (error) {
      // What the replica holds is unknown now: it fails as a unit.
      crashed = true;
      actor.send({ type: 'step.crashed', error });
    }
  });
  runtime.supervise(o.id, actor);
  actor.start();
  return handle;
}
