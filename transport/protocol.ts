// The wire protocol between the control plane and node agents: one discriminated union, one version, one schema.
import { arr, int, num, obj, oneOf, optional, str, union, type Infer } from './schema.ts';

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
  'node.registered': obj({ node: id, epoch }),
  'node.heartbeat': obj({ node: id, epoch, t: ms }),
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
  'gpu.failed': obj({ gpu, code: id, replica: optional(id), epoch: optional(epoch) }),
  'gpu.inject': obj({ gpu, fault: oneOf('fault', 'hang', 'straggle', 'repair'), factor: optional(num({ min: 1, max: 100 })) }),
  'step.execute': obj({ replica: id, epoch, step: count, gpus: arr(gpu, { min: 1, max: 64 }), shape: stepShape }),
  'step.completed': obj({ gpu, replica: id, epoch, step: count, busyMs: optional(ms) }),
});

/** A message between the control plane and a node agent. */
export type NodeMessage = Infer<typeof nodeMessageSchema>;

/** Message type names, for exhaustive handling. */
export type NodeMessageType = NodeMessage['type'];
