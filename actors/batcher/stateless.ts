// Dynamic batching for stateless models (embeddings, classifiers): requests are grouped by a compatibility key and
// each group forms batch actors (machines/batch.machine.ts) that close by size, work, memory or the oldest member's
// wait; a replica runs one closed batch per step and the results are split back to each member exactly once.
// A closed batch still waiting for its replica takes compatible members that fit (as Triton's dynamic batcher
// gathers what queued while the model instance was busy): a busy replica then runs fuller batches, never later ones.
import { createActor, type ActorRefFrom } from 'xstate';
import { batchMachine, fitsBatch, type BatchContext } from '../../machines/batch.machine.ts';
import type { StepShape } from '../gpu/cost-model.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';
import type { CoreStatelessLimits } from '../../machines/core-messages.ts';
import type { Clock } from '../../runtime/clock.ts';

/** Execution options that change the computation (pooling, normalisation, truncation); part of the key. */
export type ExecOptions = Readonly<Record<string, string | number | boolean>>;

/** What a stateless request gets back: its own slice of the batch's results, or a typed failure. */
export type StatelessOutcome =
  | { ok: true; result: unknown; batch: string; batchSize: number; closedBy: BatchContext['closedBy'] }
  | { ok: false; failure: Failure };

/** A stateless request as the batcher sees it. */
export interface StatelessItem {
  id: string;
  model: string;
  version: string;
  /** Input length in tokens, before padding to its shape bucket. */
  tokens: number;
  dtype: string;
  adapter: string | null;
  options: ExecOptions;
  receivedAt: number;
  /** Called when the batch holding it starts to run. */
  started?(t: number): void;
  /** Called exactly once with the request's outcome (unless it is cancelled first). */
  reply(outcome: StatelessOutcome): void;
}

/** Bounds of the batches one replica's batcher forms (defined with the core's messages). */
export type StatelessLimits = CoreStatelessLimits;

/** A closed batch as a replica runs it. */
export interface ClosedBatch {
  readonly id: string;
  readonly key: string;
  readonly members: readonly StatelessItem[];
  /** Padded length of every member (the key's shape bucket). */
  readonly bucket: number;
  readonly tokens: number;
  readonly memoryBytes: number;
  readonly closedBy: BatchContext['closedBy'];
  readonly openedAt: number;
  readonly closedAt: number;
}

/** The stateless batcher of one replica. */
export interface StatelessBatcher {
  readonly limits: StatelessLimits;
  /** Why `item` would be refused (too large for any batch, queue full), or null: submit() takes what check() passes. */
  check(item: Pick<StatelessItem, 'id' | 'tokens'>): Failure | null;
  /** Adds a request to the forming batch of its key; a failure (too large, queue full) means it was not taken. */
  submit(item: StatelessItem): Failure | null;
  /** Takes the oldest closed batch to run (it is now running), or null. */
  next(): ClosedBatch | null;
  /** Delivers a running batch's results, one per member in order. */
  complete(batchId: string, results: readonly unknown[]): void;
  /** Fails a running or closed batch: every member still waiting gets `f`. */
  fail(batchId: string, f: Failure): void;
  /** Forgets a request (cancelled or expired): it gets no reply; false if it is not waiting here. */
  cancel(id: string): boolean;
  /** Closes every forming batch now (drain). */
  flush(): void;
  /** Aborts every batch (replica failed): every member still waiting gets `f`. */
  abortAll(f: Failure): void;
  hasWork(): boolean;
  stats(): StatelessStats;
  /** Throws if a batch holds incompatible members, breaks a limit, or a forming batch outlived its delay. */
  checkInvariants(): void;
}

/** Counts the router and the report read. */
export interface StatelessStats {
  forming: number;
  ready: number;
  running: number;
  queued: number;
  batches: number;
  closedBy: Record<string, number>;
}

/** The padded length of a `tokens`-long input, or -1 when it is longer than the last bucket. */
export function shapeBucket(tokens: number, buckets: readonly number[]): number {
  for (const b of buckets) if (tokens <= b) return b;
  return -1;
}

/** The compatibility key: requests share a batch only if every part of it is equal. */
export function compatibilityKey(
  item: Pick<StatelessItem, 'model' | 'version' | 'dtype' | 'adapter' | 'options'>,
  bucket: number,
): string {
  const opts = Object.keys(item.options)
    .sort()
    .map((k) => [k, item.options[k]]);
  return JSON.stringify([item.model, item.version, bucket, item.dtype, item.adapter, opts]);
}

/** The step a replica runs for a closed batch: one padded prefill per member, no decodes. */
export function batchShape(b: ClosedBatch): StepShape {
  return { prefill: b.members.map(() => ({ tokens: b.bucket, cached: 0 })), decodeBatch: 0, decodeContext: 0 };
}

/** Options of a stateless batcher. */
export interface StatelessDeps {
  clock: Clock;
  limits: StatelessLimits;
  /** A prefix for batch ids (the replica's id). */
  name?: string;
  /** Called when a batch closes and can run (wakes the replica). */
  onReady?(): void;
}

interface Batch {
  id: string;
  key: string;
  bucket: number;
  members: StatelessItem[];
  // Mirrors of the machine's counters: a batch's own actions may run while its snapshot is not yet updated.
  size: number;
  tokens: number;
  memoryBytes: number;
  closedBy: BatchContext['closedBy'];
  openedAt: number;
  closedAt: number;
  actor: ActorRefFrom<typeof batchMachine>;
  results: readonly unknown[] | null;
  failure: Failure | null;
  closed: ClosedBatch | null;
}

/** Creates the stateless batcher of one replica. */
export function createStatelessBatcher(deps: StatelessDeps): StatelessBatcher {
  const { clock, limits } = deps;
  const name = deps.name ?? 'stateless';
  const forming = new Map<string, Batch>();
  const batches = new Map<string, Batch>();
  const ready: Batch[] = [];
  const running = new Set<Batch>();
  // Requests not yet answered, by id: the one place that guarantees a single reply.
  const waiting = new Map<string, { item: StatelessItem; batch: Batch }>();
  const closedBy: Record<string, number> = {};
  const faults: string[] = [];
  let seq = 0;

  const answer = (item: StatelessItem, outcome: StatelessOutcome): void => {
    if (waiting.get(item.id)?.item !== item) return;
    waiting.delete(item.id);
    item.reply(outcome);
  };
  const settle = (b: Batch): void => {
    batches.delete(b.id);
    running.delete(b);
    const i = ready.indexOf(b);
    if (i >= 0) ready.splice(i, 1);
    if (forming.get(b.key) === b) forming.delete(b.key);
  };

  // Provided once; the actions find their batch by the actor's id.
  const machine = batchMachine.provide({
    actions: batchActions({
      clock,
      batches,
      forming,
      ready,
      closedBy,
      settle,
      answer,
      onReady: () => deps.onReady?.(),
    }),
  });

  const open = (key: string, bucket: number): Batch => {
    const id = `batch.${name}.${++seq}`;
    const actor = createActor(machine, {
      input: {
        id,
        key,
        maxSize: limits.maxSize,
        maxTokens: limits.maxTokens,
        maxMemoryBytes: limits.maxMemoryBytes,
        maxDelayMs: limits.maxDelayMs,
      },
      clock,
      id,
    });
    const b = emptyBatch(id, key, bucket, actor, clock.now());
    batches.set(id, b);
    forming.set(key, b);
    actor.subscribe({ error: (e) => faults.push(`${id}: ${String(e)}`) });
    actor.start();
    return b;
  };

  const check = (item: Pick<StatelessItem, 'id' | 'tokens'>): Failure | null =>
    statelessAdmission(item, limits, waiting.has(item.id), waiting.size);

  const submit = (item: StatelessItem): Failure | null => {
    const refused = check(item);
    if (refused) return refused;
    const bucket = shapeBucket(item.tokens, limits.buckets);
    const memory = bucket * limits.bytesPerToken;
    const key = compatibilityKey(item, bucket);
    // The oldest closed batch of this key that has not started and has room.
    const room = (x: Batch): boolean =>
      fitsBatch(
        { ...x, maxSize: limits.maxSize, maxTokens: limits.maxTokens, maxMemoryBytes: limits.maxMemoryBytes },
        bucket,
        memory,
      );
    let b = ready.find((r) => r.key === key && room(r)) ?? forming.get(key);
    if (b && !room(b)) {
      // The next compatible member would overflow the forming batch: it has reached its limit and closes now.
      const reason = b.size >= limits.maxSize ? 'size' : b.tokens + bucket > limits.maxTokens ? 'tokens' : 'memory';
      b.actor.send({ type: 'batch.flush', reason });
      b = undefined;
    }
    if (!b) b = open(key, bucket);
    b.members.push(item);
    b.size++;
    b.tokens += bucket;
    b.memoryBytes += memory;
    waiting.set(item.id, { item, batch: b });
    b.actor.send({ type: 'batch.add', tokens: bucket, memoryBytes: memory });
    return null;
  };

  return {
    limits,
    check,
    submit,
    next: () => {
      const b = ready.shift();
      if (!b) return null;
      running.add(b);
      b.closed = closedView(b);
      b.actor.send({ type: 'batch.started' });
      const t = clock.now();
      for (const m of b.members) if (waiting.get(m.id)?.item === m) m.started?.(t);
      return b.closed;
    },
    complete: (id, results) => {
      const b = batches.get(id);
      if (!b || !running.has(b)) return;
      if (results.length !== b.members.length) {
        b.failure = failure(
          'internal',
          `batch ${id} returned ${results.length} results for ${b.members.length} members`,
        );
        b.actor.send({ type: 'batch.failed', code: 'internal' });
        return;
      }
      b.results = results;
      b.actor.send({ type: 'batch.completed' });
    },
    fail: (id, f) => {
      const b = batches.get(id);
      if (!b) return;
      b.failure = f;
      b.actor.send({ type: 'batch.failed', code: f.code });
    },
    cancel: (id) => waiting.delete(id),
    flush: () => {
      for (const b of [...forming.values()]) b.actor.send({ type: 'batch.flush' });
    },
    abortAll: (f) => {
      for (const b of [...batches.values()]) {
        b.failure = f;
        b.actor.send({ type: 'batch.abort' });
      }
    },
    hasWork: () => batches.size > 0,
    stats: () => ({
      forming: forming.size,
      ready: ready.length,
      running: running.size,
      queued: waiting.size,
      batches: seq,
      closedBy: { ...closedBy },
    }),
    checkInvariants: () => checkInvariants({ clock, limits, batches, forming, waiting, faults }),
  };
}

/** Why an item cannot be queued (its shape, its size, a duplicate id, a full queue), or null if it can. */
/** Why `item` would be refused by a batcher with `limits` that holds `queued` requests (`known`: one with its id),
 * or null. The control plane checks a request with it before handing it to the replica's core. */
export function statelessAdmission(
  item: Pick<StatelessItem, 'id' | 'tokens'>,
  limits: StatelessLimits,
  known: boolean,
  queued: number,
): Failure | null {
  const bucket = shapeBucket(item.tokens, limits.buckets);
  if (bucket < 0 || !(item.tokens >= 1)) {
    return failure(
      'invalid_request',
      `input of ${item.tokens} tokens is outside the buckets (1-${limits.buckets[limits.buckets.length - 1] ?? 0})`,
    );
  }
  const memory = bucket * limits.bytesPerToken;
  if (
    !fitsBatch(
      {
        size: 0,
        tokens: 0,
        memoryBytes: 0,
        maxSize: limits.maxSize,
        maxTokens: limits.maxTokens,
        maxMemoryBytes: limits.maxMemoryBytes,
      },
      bucket,
      memory,
    )
  ) {
    return failure(
      'invalid_request',
      `input padded to ${bucket} tokens does not fit one batch (${limits.maxTokens} tokens, ${limits.maxMemoryBytes} bytes)`,
    );
  }
  if (known) return failure('invalid_request', `request ${item.id} is already waiting`);
  if (queued >= limits.maxQueued)
    return failure('overloaded', `the batch queue holds its limit of ${limits.maxQueued} requests`, {
      retryAfterMs: limits.maxDelayMs,
    });
  return null;
}

/** What the executor sees of a batch once it is closed. */
function closedView(b: Batch): ClosedBatch {
  return {
    id: b.id,
    key: b.key,
    members: b.members,
    bucket: b.bucket,
    tokens: b.tokens,
    memoryBytes: b.memoryBytes,
    closedBy: b.closedBy,
    openedAt: b.openedAt,
    closedAt: b.closedAt,
  };
}

/** Throws if the batcher's books disagree with its batch actors, a batch breaks its limits or key, a batch formed
 * past its delay, or a waiting request points at an ended batch. */
function checkInvariants(st: {
  clock: StatelessDeps['clock'];
  limits: StatelessDeps['limits'];
  batches: ReadonlyMap<string, Batch>;
  forming: ReadonlyMap<string, Batch>;
  waiting: ReadonlyMap<string, { item: StatelessItem; batch: Batch }>;
  faults: readonly string[];
}): void {
  const { clock, limits, batches, forming, waiting, faults } = st;
  if (faults.length > 0) throw new Error(`batch actor error: ${faults[0]}`);
  const now = clock.now();
  for (const b of batches.values()) {
    const c = b.actor.getSnapshot().context;
    if (c.size !== b.members.length || b.size !== c.size || b.tokens !== c.tokens || b.memoryBytes !== c.memoryBytes) {
      throw new Error(
        `${b.id} counts ${c.size} members and ${c.tokens} tokens, holds ${b.members.length} and ${b.tokens}`,
      );
    }
    if (c.size > limits.maxSize || c.tokens > limits.maxTokens || c.memoryBytes > limits.maxMemoryBytes) {
      throw new Error(`${b.id} exceeds its limits: ${c.size} members, ${c.tokens} tokens, ${c.memoryBytes} bytes`);
    }
    for (const m of b.members) {
      if (compatibilityKey(m, shapeBucket(m.tokens, limits.buckets)) !== b.key)
        throw new Error(`${b.id} holds ${m.id}, incompatible with ${b.key}`);
    }
    if (forming.get(b.key) === b && now - b.openedAt > limits.maxDelayMs + 1e-6) {
      throw new Error(`${b.id} has been forming ${now - b.openedAt} ms, past its delay of ${limits.maxDelayMs} ms`);
    }
  }
  for (const [id, w] of waiting) {
    if (!batches.has(w.batch.id)) throw new Error(`request ${id} waits on ${w.batch.id}, which has ended`);
  }
}

/** The batch actor's actions, applied to the batcher's books: a closed batch joins `ready`; a finished one answers
 * each member once, with its result or the batch's failure. */
function batchActions(books: {
  clock: StatelessDeps['clock'];
  batches: ReadonlyMap<string, Batch>;
  forming: Map<string, Batch>;
  ready: Batch[];
  closedBy: Record<string, number>;
  settle(b: Batch): void;
  answer(item: StatelessItem, outcome: StatelessOutcome): void;
  onReady(): void;
}) {
  const { clock, batches, forming, ready, closedBy, settle, answer, onReady } = books;
  return {
    dispatch: ({ context }) => {
      const b = batches.get(context.id);
      if (!b) return;
      if (forming.get(b.key) === b) forming.delete(b.key);
      b.closedAt = clock.now();
      b.closedBy = context.closedBy;
      const by = context.closedBy ?? 'flush';
      closedBy[by] = (closedBy[by] ?? 0) + 1;
      ready.push(b);
      onReady();
    },
    deliverResults: ({ context }) => {
      const b = batches.get(context.id);
      if (!b) return;
      settle(b);
      const results = b.results ?? [];
      b.members.forEach((m, i) =>
        answer(m, {
          ok: true,
          result: results[i],
          batch: b.id,
          batchSize: b.members.length,
          closedBy: context.closedBy,
        }),
      );
    },
    failMembers: ({ context }) => {
      const b = batches.get(context.id);
      if (!b) return;
      settle(b);
      const f = b.failure ?? failure('internal', `batch ${b.id} ended without a result`);
      for (const m of b.members) answer(m, { ok: false, failure: f });
    },
  } satisfies Parameters<typeof batchMachine.provide>[0]['actions'];
}

/** A batch just opened, with no members yet. */
function emptyBatch(id: string, key: string, bucket: number, actor: Batch['actor'], now: number): Batch {
  return {
    id,
    key,
    bucket,
    members: [],
    size: 0,
    tokens: 0,
    memoryBytes: 0,
    closedBy: null,
    openedAt: now,
    closedAt: -1,
    actor,
    results: null,
    failure: null,
    closed: null,
  };
}
