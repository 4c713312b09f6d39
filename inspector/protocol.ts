// The inspection stream: versioned frames the page reads, live over /v1/inspect or from a recorded file. Every value
// in a frame passes `clean`, which keeps numbers, booleans, short strings and small arrays of them, and drops any
// field that could hold prompt or output text, so a frame never carries what a client wrote or a model produced.
import type { MachineDef } from './statechart.ts';

/** Version of the frame format; bumped on any incompatible change. */
export const INSPECT_VERSION = 1;
/** The WebSocket subprotocol of the live stream. */
export const INSPECT_SUBPROTOCOL = 'switchyard.inspect.v1';
/** `format` field of a recorded file. */
export const RECORDING_FORMAT = 'switchyard.inspect';

/** Plain data that survived sanitizing. */
export type Clean = number | boolean | string | null | readonly Clean[] | { readonly [k: string]: Clean };

/** First frame of every stream: what follows and how to draw it. */
export interface HelloFrame {
  k: 'hello';
  v: number;
  t: number;
  mode: 'live' | 'replay';
  scenario: string;
  gpus: number;
  machines: Record<string, MachineDef>;
}

/** An actor came into view (created, or already running when inspection began). */
export interface ActorFrame {
  k: 'actor';
  t: number;
  id: string;
  /** Machine id: gpu, replica, request, placement. */
  m: string;
}

/** An actor changed state (or handled an event worth showing); `ev` is the event that caused it. */
export interface StateFrame {
  k: 'state';
  t: number;
  id: string;
  m: string;
  /** Dotted state path (`ready.busy`). */
  s: string;
  ev: Record<string, Clean>;
  ctx: Record<string, Clean>;
  /** The actor reached a final state. */
  done?: boolean;
}

/** A request's routing decisions so far (admission, and each resume), from the control plane's `explain`. */
export interface TraceFrame {
  k: 'trace';
  t: number;
  id: string;
  trace: Clean[];
}

/** One GPU as the control plane sees it, with its memory split. */
export interface GpuView {
  index: number;
  /** free, probing, loading, serving, draining, unloading, failed, reserved, offline */
  state: string;
  /** The GPU machine's state path this corresponds to (for its statechart). */
  machineState: string;
  replica: string | null;
  /** A co-located replica on the GPU's second lane (`share` placement), or null. */
  guest: string | null;
  model: string | null;
  healthy: boolean;
  memoryBytes: number;
  weightsBytes: number;
  kvBytes: number;
}

/** One replica with its batcher's accounts. */
export interface ReplicaView {
  id: string;
  model: string;
  version: string;
  state: string;
  epoch: number;
  gpus: number[];
  step: number;
  waiting: number;
  running: number;
  blocksUsed: number;
  blocksTotal: number;
  steps: number;
}

/** A periodic summary of the node: GPUs, replicas, placement. */
export interface NodeFrame {
  k: 'node';
  t: number;
  placement: {
    policy: string;
    state: string;
    mode: string;
    target: string;
    reservation: boolean;
    unavailable: Record<string, string>;
  };
  gpus: GpuView[];
  replicas: ReplicaView[];
  live: number;
}

/** A placement timeline event (replica created/ready/failed/stopped, GPU failed/ready, model (un)available). */
export interface PlaceFrame {
  k: 'place';
  t: number;
  ev: Record<string, Clean>;
}

/** Frames were dropped (oldest first) because the reader fell behind or the buffer was full. */
export interface DroppedFrame {
  k: 'dropped';
  t: number;
  n: number;
}

/** Any frame of the stream. */
export type Frame = HelloFrame | ActorFrame | StateFrame | TraceFrame | NodeFrame | PlaceFrame | DroppedFrame;

/** One WebSocket message of the live stream: a tick's frames. */
export interface InspectMessage {
  v: number;
  frames: Frame[];
}

/** A recorded simulation, as `simulate --trace out.json` writes it. */
export interface Recording {
  format: typeof RECORDING_FORMAT;
  v: number;
  scenario: string;
  seed: number;
  /** Frames in time order; the first is `hello`. */
  frames: Frame[];
  /** Frames the recorder left out because it reached its bound. */
  dropped: number;
}

/** Field names that may hold client or model text: never copied, whatever their value. */
const TEXT_FIELDS =
  /^(prompt|prompts|text|texts|content|contents|messages|message_text|output|outputs|completion|completions|choices|delta|input|inputs|body|token_text|tokenText|logprobs|stop|suffix|user)$/i;
/** Longest string kept; longer ones are cut (ids, codes and system messages are short). */
const MAX_STRING = 200;
/** Longest array kept; longer ones are cut. */
const MAX_ARRAY = 64;

/** Sanitizes a value for a frame: plain data only, no text fields, bounded strings, arrays and depth. */
export function clean(v: unknown, depth = 0): Clean | undefined {
  if (v === null) return null;
  switch (typeof v) {
    case 'number':
      return Number.isFinite(v) ? v : null;
    case 'boolean':
      return v;
    case 'string':
      return v.length > MAX_STRING ? `${v.slice(0, MAX_STRING)}…` : v;
    case 'object': {
      if (depth >= 4) return undefined;
      if (Array.isArray(v)) {
        const out: Clean[] = [];
        for (const x of v.slice(0, MAX_ARRAY)) {
          const c = clean(x, depth + 1);
          if (c !== undefined) out.push(c);
        }
        return out;
      }
      const proto = Object.getPrototypeOf(v) as unknown;
      if (proto !== Object.prototype && proto !== null) return undefined;
      return cleanFields(v as Record<string, unknown>, null, depth);
    }
    default:
      return undefined;
  }
}

/** Sanitizes an object's fields, keeping only `allow` (all non-text fields when null). */
export function cleanFields(
  o: Record<string, unknown>,
  allow: readonly string[] | null,
  depth = 0,
): Record<string, Clean> {
  const out: Record<string, Clean> = {};
  for (const k of allow ?? Object.keys(o)) {
    if (TEXT_FIELDS.test(k) || !Object.hasOwn(o, k)) continue;
    const c = clean(o[k], depth + 1);
    if (c !== undefined) out[k] = c;
  }
  return out;
}
