// The wire protocol between the control plane and node agents: one discriminated union, one version, one schema.
import { arr, bool, int, nullable, num, obj, oneOf, optional, str, union, type Infer } from './schema.ts';

/** Protocol version carried by every registration; a peer with another version is refused. */
export const PROTOCOL_VERSION = 1;

const id = str({ min: 1, max: 200 });
const gpu = int({ min: 0, max: 63 });
const epoch = int({ min: 0 });
const count = int({ min: 0, max: 10_000_000 });
const ms = num({ min: 0, max: 1e12 });

/** A step's shape as the node's cost model needs it: prefill chunks [tokens, cached] and decode batch. */
const stepShape = obj({
  prefill: arr(arr(count, { min: 2, max: 2 }), { max: 4096 }),
  decodeBatch: count,
  decodeContext: count,
});

/** Most sequences or items of one engine step, and most token ids a sequence opens with. */
export const ENGINE_WIRE_BOUNDS = Object.freeze({ maxItems: 4096, maxTokens: 1 << 20, maxText: 64 * 1024 });

const seqId = str({ min: 1, max: 200 });
const tokenId = int({ min: 0, max: 2 ** 31 - 1 });
const text = str({ max: ENGINE_WIRE_BOUNDS.maxText });

/** A llama.cpp replica's engine, as `gpu.assign` carries it: the worker runs one host over the replica's GPUs. */
const engineSpec = obj({
  kind: oneOf('llama.cpp'),
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
});

/** A sequence opening on an engine (once per residency): its tokens so far, sampling, and tokens it may still make. */
const engineOpen = obj({
  seq: seqId,
  tokens: arr(tokenId, { min: 1, max: ENGINE_WIRE_BOUNDS.maxTokens }),
  left: int({ min: 1, max: 10_000_000 }),
  temperature: optional(num({ min: 0, max: 100 })),
  topP: optional(num({ min: 0, max: 1 })),
  seed: optional(int({ min: 0, max: 2 ** 32 - 1 })),
  stop: optional(arr(str({ min: 1, max: 1024 }), { max: 16 })),
  /** How many of `tokens` (the last ones) the sequence generated before (a recompute): their text was streamed. */
  generated: optional(int({ min: 0, max: ENGINE_WIRE_BOUNDS.maxTokens })),
});

/** One item of an engine step: prefill tokens [from, from + n) of the sequence's tokens, or a decode (n = 0). */
const engineItem = obj({ seq: seqId, from: count, n: count, sample: bool() });

/** What an engine step sampled for one sequence: the token, its whole-character text, and why it ended, if it did. */
const engineSampled = obj({
  seq: seqId,
  token: tokenId,
  text,
  finish: optional(oneOf('eos', 'stop', 'length')),
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
  // An engine replica's step also carries its items and the sequences it opens (see engineItem, engineOpen).
  'step.execute': obj({
    replica: id,
    epoch,
    step: count,
    gpus: arr(gpu, { min: 1, max: 64 }),
    shape: stepShape,
    open: optional(arr(engineOpen, { max: ENGINE_WIRE_BOUNDS.maxItems })),
    items: optional(arr(engineItem, { max: ENGINE_WIRE_BOUNDS.maxItems })),
  }),
  // An engine replica answers once per step for all its ranks (`ranks`), with the sampled tokens and its cache.
  'step.completed': obj({
    gpu,
    replica: id,
    epoch,
    step: count,
    busyMs: optional(ms),
    ranks: optional(arr(gpu, { min: 1, max: 64 })),
    // Ranks of a tensor-parallel gang that ran the step together under the cost model: one report per rank, in order.
    gang: optional(arr(gpu, { min: 2, max: 64 })),
    sampled: optional(arr(engineSampled, { max: ENGINE_WIRE_BOUNDS.maxItems })),
    cache: optional(obj({ sequences: count, cellsPerSequence: count })),
  }),
  // Frees sequences' cells in an engine replica (cancelled, preempted); their tokens are forgotten.
  'seq.free': obj({ replica: id, epoch, seqs: arr(seqId, { min: 1, max: ENGINE_WIRE_BOUNDS.maxItems }) }),
});

/** A message between the control plane and a node agent. */
export type NodeMessage = Infer<typeof nodeMessageSchema>;

/** Message type names, for exhaustive handling. */
export type NodeMessageType = NodeMessage['type'];
