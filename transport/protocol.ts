// The wire protocol between the control plane and node agents: one discriminated union, one version, one schema.
import { arr, int, nullable, num, obj, oneOf, optional, str, union, type Infer } from './schema.ts';

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
  // `gpus`: the devices that answered the node's health check since the last heartbeat.
  'node.heartbeat': obj({ node: id, epoch, t: ms, gpus: optional(arr(gpu, { max: 128 })) }),
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
  'gpu.fence': obj({ gpu, code: id }),
  'step.execute': obj({ replica: id, epoch, step: count, gpus: arr(gpu, { min: 1, max: 64 }), shape: stepShape }),
  'step.completed': obj({ gpu, replica: id, epoch, step: count, busyMs: optional(ms) }),
});

/** A message between the control plane and a node agent. */
export type NodeMessage = Infer<typeof nodeMessageSchema>;

/** Message type names, for exhaustive handling. */
export type NodeMessageType = NodeMessage['type'];
