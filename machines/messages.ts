// What entities say to each other: one discriminated union of every message, routed by the runtime to a local actor or
// over the wire. The node protocol (transport/protocol.ts) validates the members that cross to a worker; a test keeps
// the two in step.
import type {
  CacheReport,
  CoreLimits,
  CoreStatelessLimits,
  ReplicaLoad,
  SeqEvent,
  SubmitItem,
  SubmitSeq,
} from './core-messages.ts';

/** A step's shape as the node's cost model needs it: prefill chunks `[tokens, cached]`, decode batch and context. */
export interface WireStepShape {
  prefill: number[][];
  decodeBatch: number;
  decodeContext: number;
}

/** A real engine a replica runs on: llama.cpp (the worker starts one host over all of the replica's GPUs), or a model
 * server speaking the OpenAI API (`openai`: started per replica from `upstream.command`, or attached at
 * `upstream.url`); for `openai`, `file` is the GGUF whose vocabulary tokenizes the served model's prompts and
 * `sequences` the requests it runs at once. */
export interface WireEngineSpec {
  kind: 'llama.cpp' | 'openai';
  file: string;
  contextTokens: number;
  sequences: number;
  threads: number;
  batchTokens?: number;
  upstream?: WireUpstreamSpec;
}

/** A model server a replica's requests go to (`engine: openai`); see actors/worker/upstream/. */
export interface WireUpstreamSpec {
  /** The server's model name: the `model` of each request, `{model}` in the command. */
  model: string;
  /** Attach to this base URL (`http://127.0.0.1:8000`); else the command is started per replica. */
  url?: string;
  /** argv with `{port}`, `{gpus}`, `{model}` filled in; started with CUDA_VISIBLE_DEVICES = the replica's GPUs. */
  command?: string[];
  cwd?: string;
  env?: Partial<Record<string, string>>;
  /** Paths answered when ready, and of the Prometheus gauges. */
  health: string;
  metrics: string;
  /** Gauge names: requests waiting, running, and the KV cache's usage (a fraction; first name found wins). */
  gauges: { waiting: string[]; running: string[]; kvUsage: string[] };
  /** How the prompt goes: token ids (vLLM, SGLang, llama.cpp's server) or the text they decode to. */
  prompt: 'ids' | 'text';
  /** Ask for and read each chunk's `token_ids` (vLLM's `return_token_ids`); else the text is tokenized. */
  tokenIds: boolean;
  /** Bounds: start (health answered), a stream with no progress, consecutive errors, queued requests. */
  startTimeoutMs: number;
  hangMs: number;
  maxErrors: number;
  queue: number;
  /** Park the server with vLLM's `/sleep` on release and `/wake_up` on the next assignment of the same GPUs. */
  sleep: boolean;
  /** Lines of the server's stdout and stderr kept. */
  logLines: number;
}

/** A sequence opening on an engine: its token ids so far, the output tokens it may still make, and its sampling. */
export interface WireEngineOpen {
  seq: string;
  tokens: number[];
  left: number;
  temperature?: number;
  topP?: number;
  seed?: number;
  stop?: string[];
}

/** One item of an engine step: prefill tokens [from, from + n) of the sequence, or a decode when n = 0. */
export interface WireEngineItem {
  seq: string;
  from: number;
  n: number;
  sample: boolean;
}

/** What an engine step sampled for one sequence, and why the sequence ended, if it did. */
export interface WireEngineSampled {
  seq: string;
  token: number;
  text: string;
  finish?: 'eos' | 'stop' | 'length';
}

/** A replica's engine core as `gpu.assign` carries it: its ranks, owner, and batching limits. */
export interface WireCoreSpec {
  gpus: number[];
  owner: string;
  limits: CoreLimits;
  stateless?: CoreStatelessLimits;
  /** Check the batcher's invariants after every step (simulation). */
  check?: boolean;
}

/** Faults an operator or a test can inject into a GPU of the node. */
export type InjectedFault = 'fault' | 'hang' | 'straggle' | 'repair' | 'silent';

/** One device as its node reports it: its GPU machine's state and the replica (and epoch) it holds. */
export interface NodeInventoryDevice {
  gpu: number;
  state: 'offline' | 'probing' | 'free' | 'loading' | 'serving' | 'unloading' | 'failed' | 'repairing';
  replica?: string;
  epoch?: number;
}

/** Messages between the control plane and a node agent (the node protocol). */
export type NodeProtocolMessage =
  | { type: 'node.register'; node: string; protocol: number; gpus: number[]; epoch: number }
  /** The control plane's settings for the node: health heartbeat period, repair time, co-location lanes per GPU. */
  | { type: 'node.registered'; node: string; epoch: number; heartbeatMs?: number; repairMs?: number; lanes?: number }
  /** `gpus`: the devices that answered the node's health check since the last heartbeat. */
  | { type: 'node.heartbeat'; node: string; epoch: number; t: number; gpus?: number[]; loads?: number }
  | {
      type: 'gpu.assign';
      gpu: number;
      replica: string;
      epoch: number;
      model: string;
      gpuType: string;
      tp: number;
      loadMs: number;
      unloadMs: number;
      slowdown?: number;
      engine?: WireEngineSpec;
      /** The replica's engine core, run by the node once every rank is loaded (see actors/engine-core/). */
      core?: WireCoreSpec;
    }
  | { type: 'gpu.release'; gpu: number; replica: string; epoch: number }
  | { type: 'gpu.loaded'; gpu: number; replica: string; epoch: number }
  | { type: 'gpu.released'; gpu: number; replica: string; epoch: number }
  | { type: 'gpu.ready'; gpu: number }
  /** A fault on a free GPU reports replica null; placement forwards it to the owner without replica and epoch. */
  | { type: 'gpu.failed'; gpu: number; code: string; replica?: string | null; epoch?: number }
  | { type: 'gpu.inject'; gpu: number; fault: InjectedFault; factor?: number }
  /** The control plane declares a device failed: the node takes it out of service (once per `fence` id). */
  | { type: 'gpu.fence'; gpu: number; code: string; fence?: number }
  /** What a node holds, sent after each registration (see NodeInventoryDevice). */
  | { type: 'node.inventory'; node: string; fence: number; loads: number; devices: NodeInventoryDevice[] }
  /** Someone inspects the control plane: the node forwards its GPU actors' snapshots for `leaseMs` (renewed while
   * someone watches; `leaseMs` 0 ends it at once). */
  | { type: 'inspect.watch'; leaseMs: number }
  /** One GPU actor's snapshot, as the node's inspection saw it (only while a watch lease holds). */
  | {
      type: 'inspect.snapshot';
      id: string;
      state: string;
      status: string;
      event: string;
      replica: string | null;
      epoch: number;
      faultCode: string | null;
    }
  /** Sequences (generative) or items (stateless) handed to a replica's engine core. */
  | { type: 'seq.submit'; replica: string; epoch: number; seqs?: SubmitSeq[]; items?: SubmitItem[] }
  /** Sequences or items that left on the control plane (cancelled, expired): the core drops them at once. */
  | { type: 'seq.cancel'; replica: string; epoch: number; ids: string[] }
  /** A core's report (one per step at most): each sequence's changes and the replica's load. `at`: the core's clock
   * when it reported; `start`: when the step whose events these are started (scheduled events happened then);
   * `ranks`: a partial report, the ranks that finished the step in flight while another has not (a hung rank). */
  | {
      type: 'seq.progress';
      replica: string;
      epoch: number;
      at: number;
      start: number;
      events: SeqEvent[];
      load: ReplicaLoad;
      ranks?: number[];
      /** Its prefix cache's changes since the last report. */
      cache?: CacheReport;
    };

/** Messages inside the control plane: replicas report to placement, a request leaves the queue that holds it. */
export type ControlMessage =
  | { type: 'replica.ready'; replica: string; epoch: number; gpus: number[] }
  | { type: 'replica.failed'; replica: string; epoch: number; gpus: number[]; failedGpus: number[] }
  | { type: 'replica.stopped'; replica: string; epoch: number; gpus: number[]; failedGpus: number[] }
  | { type: 'request.withdraw'; id: string }
  /** The node link lost its node for good (grace over, or a new incarnation): its GPUs fail as one event. */
  | { type: 'node.lost'; gpus: number[]; code: string };

/** Every message between entities. */
export type Message = NodeProtocolMessage | ControlMessage;

/** A message's type name. */
export type MessageType = Message['type'];

/** The message of one type. */
export type MessageOf<T extends MessageType> = Extract<Message, { type: T }>;

/** A message a machine sends to another entity, as emitted data (`emit({ type: 'out', to, msg })`). */
export interface OutEvent {
  type: 'out';
  /** Destination system id (`gpu.3`, `replica.llama@v1#0`, `placement`, `req.17`). */
  to: string;
  msg: Message;
}
