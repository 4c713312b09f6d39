// Messages between a worker and its engine host child process (Node IPC), with their version, bounds and validators.
import type { EngineCapacity, EngineFailure, EngineLoadOptions, StepPlan, StepResult } from './engine.ts';

/** Version of the host protocol; a message carrying another version is refused. */
export const HOST_PROTOCOL_VERSION = 1;

/** Size bounds checked on every message from the child. */
export const HOST_BOUNDS = Object.freeze({
  /** Longest text piece or error message, in UTF-16 units. */
  maxText: 64 * 1024,
  /** Most sampled tokens in one step result. */
  maxSampled: 4096,
  /** Most token ids in a tokenize reply. */
  maxTokens: 1 << 20,
  /** Longest sequence id. */
  maxSeqId: 256,
});

/** Commands from the worker to the host. */
export type HostCommand =
  | { v: 1; type: 'load'; file: string; options: EngineLoadOptions }
  | { v: 1; type: 'step'; id: number; plan: StepPlan }
  | { v: 1; type: 'free'; id: number; seq: string }
  | { v: 1; type: 'tokenize'; id: number; text: string }
  | { v: 1; type: 'probe'; id: number }
  | { v: 1; type: 'unload' };

/** Replies and reports from the host to the worker. */
export type HostMessage =
  | { v: 1; type: 'loaded'; capacity: EngineCapacity }
  | { v: 1; type: 'load_failed'; failure: EngineFailure }
  | { v: 1; type: 'reply'; id: number; ok: true; value: HostReplyValue }
  | { v: 1; type: 'reply'; id: number; ok: false; failure: EngineFailure }
  | { v: 1; type: 'unloaded' };

/** What a successful reply carries, by command: a step result, freed text, token ids, or capacity (probe). */
export type HostReplyValue =
  | { kind: 'step'; result: StepResult; capacity: EngineCapacity }
  | { kind: 'free'; text: string; capacity: EngineCapacity }
  | { kind: 'tokenize'; tokens: number[] }
  | { kind: 'probe'; capacity: EngineCapacity };

type Check = (x: unknown, path: string) => void;

class InvalidMessage extends Error {}

const fail = (path: string, what: string): never => {
  throw new InvalidMessage(`${path} ${what}`);
};
const isObj = (x: unknown): x is Record<string, unknown> => typeof x === 'object' && x !== null && !Array.isArray(x);
const obj: Check = (x, p) => {
  if (!isObj(x)) fail(p, 'is not an object');
};
const str =
  (max: number): Check =>
  (x, p) => {
    if (typeof x !== 'string' || x.length > max) fail(p, `is not a string of at most ${max} characters`);
  };
const nat: Check = (x, p) => {
  if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0) fail(p, 'is not a non-negative integer');
};
const num: Check = (x, p) => {
  if (typeof x !== 'number' || !Number.isFinite(x) || x < 0) fail(p, 'is not a non-negative number');
};
const arr =
  (max: number, item: Check): Check =>
  (x, p) => {
    if (!Array.isArray(x) || x.length > max) fail(p, `is not an array of at most ${max} items`);
    (x as unknown[]).forEach((v, i) => item(v, `${p}[${i}]`));
  };
const field = (x: unknown, key: string, check: Check, p: string): void =>
  check((x as Record<string, unknown>)[key], `${p}.${key}`);

const checkFailure: Check = (x, p) => {
  obj(x, p);
  field(x, 'code', str(64), p);
  field(x, 'message', str(HOST_BOUNDS.maxText), p);
  if (typeof (x as { retryable?: unknown }).retryable !== 'boolean') fail(`${p}.retryable`, 'is not a boolean');
};

const checkCapacity: Check = (x, p) => {
  obj(x, p);
  for (const k of ['sequences', 'cellsPerSequence', 'totalCells', 'batchTokens', 'freeSequences']) field(x, k, nat, p);
  field(x, 'used', obj, p);
  const used = (x as { used: Record<string, unknown> }).used;
  if (Object.keys(used).length > HOST_BOUNDS.maxSampled) fail(`${p}.used`, 'has too many sequences');
  for (const [k, v] of Object.entries(used)) {
    str(HOST_BOUNDS.maxSeqId)(k, `${p}.used key`);
    nat(v, `${p}.used.${k}`);
  }
  const offload = (x as { offload?: unknown }).offload;
  if (offload === undefined) return;
  obj(offload, `${p}.offload`);
  field(offload, 'backend', str(16), `${p}.offload`);
  field(offload, 'devices', arr(16, str(256)), `${p}.offload`);
  field(offload, 'gpuLayers', nat, `${p}.offload`);
  field(offload, 'totalLayers', nat, `${p}.offload`);
};

const checkSampled: Check = (x, p) => {
  obj(x, p);
  field(x, 'seq', str(HOST_BOUNDS.maxSeqId), p);
  field(x, 'token', nat, p);
  field(x, 'text', str(HOST_BOUNDS.maxText), p);
  const finish = (x as { finish?: unknown }).finish;
  if (finish !== undefined && finish !== 'eos' && finish !== 'stop') fail(`${p}.finish`, 'is not eos or stop');
};

const checkReplyValue: Check = (x, p) => {
  obj(x, p);
  const kind = (x as { kind?: unknown }).kind;
  if (kind === 'step') {
    field(x, 'result', obj, p);
    const r = (x as { result: unknown }).result;
    field(r, 'sampled', arr(HOST_BOUNDS.maxSampled, checkSampled), `${p}.result`);
    for (const k of ['ms']) field(r, k, num, `${p}.result`);
    for (const k of ['tokens', 'dispatches']) field(r, k, nat, `${p}.result`);
    field(x, 'capacity', checkCapacity, p);
  } else if (kind === 'free') {
    field(x, 'text', str(HOST_BOUNDS.maxText), p);
    field(x, 'capacity', checkCapacity, p);
  } else if (kind === 'tokenize') {
    field(x, 'tokens', arr(HOST_BOUNDS.maxTokens, nat), p);
  } else if (kind === 'probe') {
    field(x, 'capacity', checkCapacity, p);
  } else {
    fail(`${p}.kind`, 'is not a known reply kind');
  }
};

/** Validates a message from the host child; returns it typed, or an error string saying what is wrong. */
export function parseHostMessage(x: unknown): { ok: true; msg: HostMessage } | { ok: false; error: string } {
  try {
    obj(x, 'message');
    const m = x as Record<string, unknown>;
    if (m.v !== HOST_PROTOCOL_VERSION) fail('message.v', `is not protocol version ${HOST_PROTOCOL_VERSION}`);
    switch (m.type) {
      case 'loaded':
        checkCapacity(m.capacity, 'message.capacity');
        break;
      case 'load_failed':
        checkFailure(m.failure, 'message.failure');
        break;
      case 'reply':
        nat(m.id, 'message.id');
        if (m.ok === true) checkReplyValue(m.value, 'message.value');
        else if (m.ok === false) checkFailure(m.failure, 'message.failure');
        else fail('message.ok', 'is not a boolean');
        break;
      case 'unloaded':
        break;
      default:
        fail('message.type', 'is not a known host message type');
    }
    return { ok: true, msg: x as HostMessage };
  } catch (err) {
    if (err instanceof InvalidMessage) return { ok: false, error: err.message };
    throw err;
  }
}

/** Validates a command from the worker (the host's own edge); returns it typed, or an error string. */
export function parseHostCommand(x: unknown): { ok: true; cmd: HostCommand } | { ok: false; error: string } {
  try {
    obj(x, 'command');
    const c = x as Record<string, unknown>;
    if (c.v !== HOST_PROTOCOL_VERSION) fail('command.v', `is not protocol version ${HOST_PROTOCOL_VERSION}`);
    if (c.type !== 'load' && c.type !== 'unload') nat(c.id, 'command.id');
    switch (c.type) {
      case 'load':
        str(4096)(c.file, 'command.file');
        obj(c.options, 'command.options');
        break;
      case 'step':
        obj(c.plan, 'command.plan');
        arr(HOST_BOUNDS.maxSampled, obj)((c.plan as { items?: unknown }).items, 'command.plan.items');
        break;
      case 'free':
        str(HOST_BOUNDS.maxSeqId)(c.seq, 'command.seq');
        break;
      case 'tokenize':
        str(HOST_BOUNDS.maxTokens)(c.text, 'command.text');
        break;
      case 'probe':
      case 'unload':
        break;
      default:
        fail('command.type', 'is not a known host command type');
    }
    return { ok: true, cmd: x as HostCommand };
  } catch (err) {
    if (err instanceof InvalidMessage) return { ok: false, error: err.message };
    throw err;
  }
}
