// The wire protocol between the control plane and node agents: one discriminated union, one version, one schema.
import {
  anyOf,
  arr,
  bool,
  int,
  nullable,
  num,
  obj,
  oneOf,
  optional,
  record,
  str,
  union,
  type Infer,
  type Schema,
} from './schema.ts';
import { MAX_CACHE_REPORT } from '../machines/core-messages.ts';

/** Protocol version carried by every registration; a peer with another version is refused. */
export const PROTOCOL_VERSION = 2;

const id = str({ min: 1, max: 200 });
const gpu = int({ min: 0, max: 63 });
const epoch = int({ min: 0 });
const count = int({ min: 0, max: 10_000_000 });
const ms = num({ min: 0, max: 1e12 });
/** A GPU actor's id (`gpu.<n>`) and the states its machine can be in, as dotted paths. */
const gpuActorId = str({ min: 5, max: 8, pattern: /^gpu\.\d{1,3}$/ });
const GPU_STATES = [
  'offline',
  'probing',
  'free',
  'allocated.loading',
  'allocated.serving',
  'allocated.unloading',
  'failed',
  'repairing',
] as const;

/** Most sequences, items or ids of one message, most token ids of one sequence, most text of one event, and most
 * events of one progress report. */
export const ENGINE_WIRE_BOUNDS = Object.freeze({
  maxItems: 4096,
  maxTokens: 1 << 20,
  maxText: 64 * 1024,
  maxEvents: 4 * 4096,
});

const seqId = str({ min: 1, max: 200 });
const tokenId = int({ min: 0, max: 2 ** 31 - 1 });
const text = str({ max: ENGINE_WIRE_BOUNDS.maxText });

const gaugeNames = arr(str({ min: 1, max: 200 }), { min: 1, max: 8 });
/** An `openai` replica's model server (WireUpstreamSpec): the worker checks the URL and command again. */
const upstreamSpec = obj({
  model: str({ min: 1, max: 200 }),
  url: optional(str({ min: 1, max: 2048 })),
  command: optional(arr(str({ max: 4096 }), { min: 1, max: 128 })),
  cwd: optional(str({ min: 1, max: 4096 })),
  env: optional(record(str({ min: 1, max: 200 }), str({ max: 4096 }), { max: 64 })),
  health: str({ min: 1, max: 200 }),
  metrics: str({ min: 1, max: 200 }),
  gauges: obj({ waiting: gaugeNames, running: gaugeNames, kvUsage: gaugeNames }),
  prompt: oneOf('ids', 'text'),
  tokenIds: bool(),
  startTimeoutMs: int({ min: 1, max: 86_400_000 }),
  hangMs: int({ min: 1, max: 86_400_000 }),
  maxErrors: int({ min: 1, max: 1000 }),
  queue: int({ min: 0, max: 100_000 }),
  sleep: bool(),
  logLines: int({ min: 1, max: 100_000 }),
});

/** A replica's real engine, as `gpu.assign` carries it: llama.cpp (the worker runs one host over the replica's GPUs)
 * or a model server speaking the OpenAI API (`openai`). */
const engineSpec = obj({
  kind: oneOf('llama.cpp', 'openai'),
  file: str({ min: 1, max: 4096 }),
  contextTokens: int({ min: 2, max: 10_000_000 }),
  sequences: int({ min: 1, max: 4096 }),
  threads: int({ min: 1, max: 256 }),
  batchTokens: optional(int({ min: 1, max: 10_000_000 })),
  /** Where the layers run: the CPU, or a GPU backend of node-llama-cpp's prebuilt builds (`auto`: the first that
   * loads); absent: the CPU. */
  gpu: optional(oneOf('auto', 'cuda', 'vulkan', 'metal', 'cpu')),
  /** Layers offloaded to the GPU (absent: all of them when a GPU backend is used). */
  gpuLayers: optional(int({ min: 0, max: 100_000 })),
  upstream: optional(upstreamSpec),
});

/** How a real engine samples a sequence. */
const sampling = obj({
  temperature: optional(num({ min: 0, max: 100 })),
  topP: optional(num({ min: 0, max: 1 })),
  seed: optional(int({ min: 0, max: 2 ** 32 - 1 })),
  stop: optional(arr(str({ min: 1, max: 1024 }), { max: 16 })),
  // Log-probabilities with this many alternatives, and JSON output under a JSON schema (as JSON text).
  logprobs: optional(int({ min: 0, max: 20 })),
  jsonSchema: optional(str({ min: 2, max: 65_536 })),
});

/** A priority class's rank (0 the highest), and a running total that only grows (steps, tokens, preemptions). */
const classRank = int({ min: 0, max: 255 });
const total = int({ min: 0 });
const tokenIds = arr(tokenId, { max: ENGINE_WIRE_BOUNDS.maxTokens });
/** A block's chain hash (actors/batcher/block-hash.ts): a safe integer. */
const blockHash = int({ min: 0, max: Number.MAX_SAFE_INTEGER });

/** A generative sequence handed to a replica's core (machines/core-messages.ts SubmitSeq). */
const submitSeq = obj({
  id: seqId,
  priority: classRank,
  order: total,
  promptTokens: count,
  outputTokens: count,
  maxTokens: count,
  estOutputTokens: count,
  generated: count,
  atHead: optional(bool()),
  prompt: optional(tokenIds),
  out: optional(tokenIds),
  sampling: optional(sampling),
  blocks: optional(arr(blockHash, { max: 4096 })),
});

/** A stateless item's execution options: bounded names (a key schema types its record as partial, but every key
 * present has a value). */
const itemOptions = record(str({ min: 1, max: 200 }), anyOf(str({ max: 1024 }), num(), bool()), {
  max: 64,
}) as Schema<Record<string, string | number | boolean>>;

/** A stateless request handed to a replica's core: one member of a dynamic batch (SubmitItem). */
const submitItem = obj({
  id: seqId,
  tokens: count,
  dtype: str({ min: 1, max: 64 }),
  adapter: nullable(str({ min: 1, max: 200 })),
  options: itemOptions,
});

/** A token's log-probability and the most likely tokens at its position (TokenLogprob). */
const logprob = num({ min: -1e4, max: 0 });
const pieceText = str({ max: 256 });
const tokenLogprob = obj({
  lp: logprob,
  text: pieceText,
  top: arr(obj({ token: tokenId, text: pieceText, lp: logprob }), { max: 20 }),
});

/** One change of one sequence in a step (SeqEvent), by kind `k`. */
const seqEvent = union('k', {
  s: obj({ id: seqId, c: optional(count) }),
  p: obj({ id: seqId }),
  t: obj({
    id: seqId,
    n: count,
    ids: optional(arr(tokenId, { max: ENGINE_WIRE_BOUNDS.maxItems })),
    text: optional(text),
    lp: optional(arr(tokenLogprob, { max: 16 })),
  }),
  f: obj({
    id: seqId,
    reason: oneOf('done', 'eos', 'stop', 'length'),
    result: optional(num()),
    batch: optional(id),
    size: optional(count),
    error: optional(str({ max: 1024 })),
  }),
  // `at`: the end of each decode step it covers (a report of several), on the core's clock.
  g: obj({
    ids: optional(arr(seqId, { max: ENGINE_WIRE_BOUNDS.maxItems })),
    at: optional(arr(ms, { min: 1, max: ENGINE_WIRE_BOUNDS.maxEvents })),
  }),
});

/** A replica's load as its core reports it (ReplicaLoad): every field bounded. */
const replicaLoad = obj({
  waiting: count,
  running: count,
  blocksUsed: total,
  blocksTotal: total,
  prefillTokensAhead: total,
  decodeTokensAhead: total,
  waitingBlocks: total,
  waitingByClass: arr(count, { max: 256 }),
  waitingTokensByClass: arr(total, { max: 256 }),
  committedBlocks: total,
  runningCommittedBlocks: total,
  runningContext: total,
  preemptions: total,
  steps: total,
  received: total,
  cancelled: total,
  queued: count,
  saturated: bool(),
  stepCount: total,
  stepMembers: total,
  stepTokens: total,
  stepPredictedMs: num({ min: 0 }),
  stepBusyMs: num({ min: 0 }),
  inflightPredictedMs: ms,
  inflightMs: ms,
});

/** A replica's engine core as `gpu.assign` carries it: its ranks, owner and batching limits (WireCoreSpec). */
const coreSpec = obj({
  gpus: arr(gpu, { min: 1, max: 64 }),
  owner: id,
  limits: obj({
    policy: oneOf('chunked', 'prefill-first', 'static'),
    maxRunning: int({ min: 1, max: 100_000 }),
    tokenBudget: int({ min: 1, max: 10_000_000 }),
    blockTokens: int({ min: 1, max: 1024 }),
    blocksTotal: total,
    maxContext: int({ min: 1, max: 10_000_000 }),
    watermarkBlocks: total,
    prefixCache: optional(bool()),
  }),
  stateless: optional(
    obj({
      maxSize: int({ min: 1, max: ENGINE_WIRE_BOUNDS.maxItems }),
      maxTokens: int({ min: 1, max: 100_000_000 }),
      maxMemoryBytes: num({ min: 0 }),
      maxDelayMs: num({ min: 0, max: 3_600_000 }),
      buckets: arr(int({ min: 1, max: 10_000_000 }), { max: 64 }),
      bytesPerToken: num({ min: 0 }),
      maxQueued: total,
    }),
  ),
  check: optional(bool()),
});

/** Every message that crosses between the control plane and a node agent. */
export const nodeMessageSchema = union('type', {
  'node.register': obj({ node: id, protocol: int({ min: 0 }), gpus: arr(gpu, { max: 64 }), epoch }),
  // The control plane's settings for the node: health heartbeat period, repair time, co-location lanes per GPU.
  'node.registered': obj({
    node: id,
    epoch,
    heartbeatMs: optional(ms),
    repairMs: optional(ms),
    lanes: optional(int({ min: 1, max: 8 })),
  }),
  // `gpus`: the devices that answered the node's health check since the last heartbeat; `loads`: loads it ran so far.
  'node.heartbeat': obj({ node: id, epoch, t: ms, gpus: optional(arr(gpu, { max: 128 })), loads: optional(count) }),
  'gpu.assign': obj({
    gpu,
    replica: id,
    epoch,
    model: id,
    gpuType: id,
    tp: int({ min: 1, max: 64 }),
    loadMs: ms,
    unloadMs: ms,
    slowdown: optional(num({ min: 1, max: 100 })),
    engine: optional(engineSpec),
    // The replica's engine core, run by the node once every rank serves the replica's epoch.
    core: optional(coreSpec),
  }),
  'gpu.release': obj({ gpu, replica: id, epoch }),
  'gpu.loaded': obj({ gpu, replica: id, epoch }),
  'gpu.released': obj({ gpu, replica: id, epoch }),
  'gpu.ready': obj({ gpu }),
  // A fault on a free GPU reports replica null.
  'gpu.failed': obj({ gpu, code: id, replica: optional(nullable(id)), epoch: optional(epoch) }),
  // `silent`: the device stops answering (health checks and steps), as a crashed GPU does.
  'gpu.inject': obj({
    gpu,
    fault: oneOf('fault', 'hang', 'straggle', 'repair', 'silent'),
    factor: optional(num({ min: 1, max: 100 })),
  }),
  // The control plane declares a device failed (missed heartbeats, a hung rank): the node takes it out of service.
  // `fence` numbers it, so a repeated fence (resent until confirmed) applies once.
  'gpu.fence': obj({ gpu, code: id, fence: optional(int({ min: 1 })) }),
  // What a node holds, sent after each registration: per device its state and the replica (and epoch) it serves,
  // the highest fence it applied and how many loads it ran. A restarted control plane adopts what it can verify.
  'node.inventory': obj({
    node: id,
    fence: int({ min: 0 }),
    loads: int({ min: 0 }),
    devices: arr(
      obj({
        gpu,
        state: oneOf('offline', 'probing', 'free', 'loading', 'serving', 'unloading', 'failed', 'repairing'),
        replica: optional(id),
        epoch: optional(epoch),
      }),
      { max: 128 },
    ),
  }),
  // Someone inspects the control plane: the node forwards its GPU actors' snapshots while the lease holds.
  'inspect.watch': obj({ leaseMs: int({ min: 0, max: 60_000 }) }),
  'inspect.snapshot': obj({
    id: gpuActorId,
    state: oneOf(...GPU_STATES),
    status: oneOf('active', 'done', 'error', 'stopped'),
    event: id,
    replica: nullable(id),
    epoch: int({ min: 0 }),
    faultCode: nullable(id),
  }),
  // Sequences (generative) or items (stateless) handed to a replica's engine core.
  'seq.submit': obj({
    replica: id,
    epoch,
    seqs: optional(arr(submitSeq, { max: ENGINE_WIRE_BOUNDS.maxItems })),
    items: optional(arr(submitItem, { max: ENGINE_WIRE_BOUNDS.maxItems })),
  }),
  // Sequences or items that left on the control plane (cancelled, expired): the core drops them at once.
  'seq.cancel': obj({ replica: id, epoch, ids: arr(seqId, { min: 1, max: ENGINE_WIRE_BOUNDS.maxItems }) }),
  // A core's report, one per step at most: each sequence's changes and the replica's load; `ranks` for a partial one.
  'seq.progress': obj({
    replica: id,
    epoch,
    at: ms,
    start: ms,
    events: arr(seqEvent, { max: ENGINE_WIRE_BOUNDS.maxEvents }),
    load: replicaLoad,
    ranks: optional(arr(gpu, { min: 1, max: 64 })),
    cache: optional(
      obj({
        add: arr(blockHash, { max: MAX_CACHE_REPORT }),
        evict: arr(blockHash, { max: MAX_CACHE_REPORT }),
        reset: optional(bool()),
      }),
    ),
  }),
});

/** A message between the control plane and a node agent. */
export type NodeMessage = Infer<typeof nodeMessageSchema>;

/** Message type names, for exhaustive handling. */
export type NodeMessageType = NodeMessage['type'];
