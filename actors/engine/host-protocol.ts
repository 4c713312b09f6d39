// Messages between a worker and its engine host child process (Node IPC), with their version, bounds and validators.
//
// The worker hands the host requests, not steps: `open` starts the replica's engine core beside the loaded engine,
// `submit` and `cancel` carry sequences in and out, and the host sends one `report` per step (the core's events and
// load). Both directions are checked field by field at the edge that receives them, but for a report's body: the host
// encodes the report as the msgpack map the control plane reads, and the worker forwards those bytes, checked by the
// hardened codec's pre-scan, without decoding them (transport/forward.ts); the control plane validates them with the
// rest of its frame. What the worker itself needs of a report (finished sequences, counts) comes beside the body.
import type { EngineCapacity, EngineFailure, EngineLoadOptions } from './engine.ts';
import type { CoreLimits, CoreReport, ReplicaLoad, SubmitSeq } from '../../machines/core-messages.ts';
import { MAX_CACHE_REPORT } from '../../machines/core-messages.ts';
import { decodeUntrusted, DEFAULT_LIMITS, type CodecLimits } from '../../transport/codec.ts';

/** Version of the host protocol; a message carrying another version is refused. */
export const HOST_PROTOCOL_VERSION = 2;

/** Size bounds checked on every message, both ways. */
export const HOST_BOUNDS = Object.freeze({
  /** Longest text piece or error message, in UTF-16 units. */
  maxText: 64 * 1024,
  /** Most sequences in one submit, cancel, or a report's token ids of one event. */
  maxSeqs: 4096,
  /** Most sequence ids in one cancel (every sequence of a host). */
  maxCancel: 1 << 16,
  /** Most events in one report. */
  maxEvents: 4 * 4096,
  /** Most token ids in a tokenize reply or one sequence's prompt. */
  maxTokens: 1 << 20,
  /** Largest token id. */
  maxTokenId: 2 ** 31 - 1,
  /** Longest sequence id. */
  maxSeqId: 256,
  /** Largest encoded report body, in bytes: a node-link frame's limit (1 MiB) less room for its envelope. */
  maxReportBytes: 1024 * 1024 - 4096,
});

/** The replica's engine core as the host runs it: who it is, whose sequences it takes, and its batching limits. */
export interface HostCoreSpec {
  replica: string;
  epoch: number;
  owner: string;
  limits: CoreLimits;
  /** Check the batcher's invariants after every step. */
  check?: boolean;
  /** The calibrated profile the control plane prices this replica with: the core predicts its steps with it too
   * (without one, with the model file's size, as the control plane prices an uncalibrated engine). */
  profile?: string;
}

/** What a host measured of its engine: steps, the engine's time in them, and its idle time between a step's return
 * and the next dispatch while the core had runnable work (see llama-executor.ts). */
export interface HostStats {
  steps: number;
  busyMs: number;
  idleMs: number;
  idleGaps: number;
}

/** Diagnosis (benchmarks): a folder in the worker's environment; each engine host then writes its HostStats, with its
 * pid and clock, to `engine-stats-<pid>.json` there whenever its core runs out of work (and so once a run ends). */
export const ENGINE_STATS_DIR_ENV = 'SWITCHYARD_ENGINE_STATS_DIR';

/** What a host writes to ENGINE_STATS_DIR_ENV's folder. */
export interface HostStatsFile extends HostStats {
  pid: number;
  /** The host's wall clock (ms) when written. */
  at: number;
}

/** Commands from the worker to the host. */
export type HostCommand =
  | { v: 2; type: 'load'; file: string; options: EngineLoadOptions }
  | { v: 2; type: 'open'; id: number; core: HostCoreSpec }
  | { v: 2; type: 'submit'; seqs: SubmitSeq[] }
  | { v: 2; type: 'cancel'; ids: string[] }
  | { v: 2; type: 'tokenize'; id: number; text: string }
  | { v: 2; type: 'probe'; id: number }
  | { v: 2; type: 'unload' };

/** Replies and reports from the host to the worker. `failed`: the core or its engine failed, or a command was
 * refused; the host is then of no further use. */
export type HostMessage =
  | { v: 2; type: 'loaded'; capacity: EngineCapacity }
  | { v: 2; type: 'load_failed'; failure: EngineFailure }
  | { v: 2; type: 'reply'; id: number; ok: true; value: HostReplyValue }
  | { v: 2; type: 'reply'; id: number; ok: false; failure: EngineFailure }
  | {
      v: 2;
      type: 'progress';
      /** The core's report (CoreReport) as one msgpack map, base64. */
      body: string;
      /** Sequences the report finishes (its `f` events), the submits the core has seen (load.received), and what it
       * still holds (load.waiting + running + queued): what the worker's progress watch reads. */
      finished: string[];
      received: number;
      pending: number;
      stats: HostStats;
    }
  | { v: 2; type: 'failed'; failure: EngineFailure }
  | { v: 2; type: 'unloaded' };

/** What a successful reply carries, by command: the capacity once the core is open, token ids, or a probe's answer. */
export type HostReplyValue =
  | { kind: 'open'; capacity: EngineCapacity }
  | { kind: 'tokenize'; tokens: number[] }
  | { kind: 'probe'; capacity: EngineCapacity; stats: HostStats };

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
  (max: number, min = 0): Check =>
  (x, p) => {
    if (typeof x !== 'string' || x.length > max || x.length < min) {
      fail(p, `is not a string of ${min} to ${max} characters`);
    }
  };
const nat: Check = (x, p) => {
  if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0) fail(p, 'is not a non-negative integer');
};
const num: Check = (x, p) => {
  if (typeof x !== 'number' || !Number.isFinite(x) || x < 0) fail(p, 'is not a non-negative number');
};
const bool: Check = (x, p) => {
  if (typeof x !== 'boolean') fail(p, 'is not a boolean');
};
const upTo =
  (max: number, check: Check = nat): Check =>
  (x, p) => {
    check(x, p);
    if ((x as number) > max) fail(p, `is above ${max}`);
  };
const oneOf =
  (...values: readonly string[]): Check =>
  (x, p) => {
    if (typeof x !== 'string' || !values.includes(x)) fail(p, `is not one of ${values.join(', ')}`);
  };
const arr =
  (max: number, item: Check): Check =>
  (x, p) => {
    if (!Array.isArray(x) || x.length > max) fail(p, `is not an array of at most ${max} items`);
    (x as unknown[]).forEach((v, i) => item(v, `${p}[${i}]`));
  };
const field = (x: unknown, key: string, check: Check, p: string): void =>
  check((x as Record<string, unknown>)[key], `${p}.${key}`);
const optional = (x: unknown, key: string, check: Check, p: string): void => {
  if ((x as Record<string, unknown>)[key] !== undefined) field(x, key, check, p);
};
/** An object with exactly the listed fields (optional ones may be absent): nothing unchecked crosses the edge. */
const shape =
  (fields: Readonly<Record<string, Check>>, optionalFields: Readonly<Record<string, Check>> = {}): Check =>
  (x, p) => {
    obj(x, p);
    for (const k of Object.keys(x as object)) {
      if (!(k in fields) && !(k in optionalFields)) fail(`${p}.${k}`, 'is not a known field');
    }
    for (const [k, c] of Object.entries(fields)) field(x, k, c, p);
    for (const [k, c] of Object.entries(optionalFields)) optional(x, k, c, p);
  };

const seqId = str(HOST_BOUNDS.maxSeqId, 1);
const tokenId = upTo(HOST_BOUNDS.maxTokenId);
const tokenIds = arr(HOST_BOUNDS.maxTokens, tokenId);

const checkFailure: Check = (x, p) => {
  obj(x, p);
  field(x, 'code', str(64), p);
  field(x, 'message', str(HOST_BOUNDS.maxText), p);
  field(x, 'retryable', bool, p);
};

const checkCapacity: Check = (x, p) => {
  obj(x, p);
  for (const k of ['sequences', 'cellsPerSequence', 'totalCells', 'batchTokens', 'freeSequences']) field(x, k, nat, p);
  field(x, 'used', obj, p);
  const used = (x as { used: Record<string, unknown> }).used;
  if (Object.keys(used).length > HOST_BOUNDS.maxSeqs) fail(`${p}.used`, 'has too many sequences');
  for (const [k, v] of Object.entries(used)) {
    seqId(k, `${p}.used key`);
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

const checkStats = shape({ steps: nat, busyMs: num, idleMs: num, idleGaps: nat });

/** Every required field of a core's limits (a field added to CoreLimits fails to compile here until it is checked). */
const LIMIT_FIELDS: Record<Exclude<keyof CoreLimits, 'prefixCache'>, Check> = {
  policy: oneOf('chunked', 'prefill-first', 'static'),
  maxRunning: upTo(HOST_BOUNDS.maxSeqs),
  tokenBudget: upTo(HOST_BOUNDS.maxTokens),
  blockTokens: upTo(1 << 16),
  blocksTotal: nat,
  maxContext: upTo(HOST_BOUNDS.maxTokens),
  watermarkBlocks: nat,
};

const checkCoreSpec = shape(
  {
    replica: str(HOST_BOUNDS.maxSeqId, 1),
    epoch: nat,
    owner: str(HOST_BOUNDS.maxSeqId),
    limits: shape(LIMIT_FIELDS, { prefixCache: bool }),
  },
  { check: bool, profile: str(4096, 1) },
);

const checkSampling = shape(
  {},
  {
    temperature: upTo(100, num),
    topP: upTo(1, num),
    seed: upTo(2 ** 32 - 1),
    stop: arr(16, str(1024, 1)),
    logprobs: upTo(20),
    jsonSchema: str(65_536, 2),
  },
);

/** A submitted sequence: lengths, and for a real engine its token ids, which must agree with the lengths. */
const checkSubmitSeq: Check = (x, p) => {
  shape(
    {
      id: seqId,
      priority: upTo(255),
      order: nat,
      promptTokens: upTo(HOST_BOUNDS.maxTokens),
      outputTokens: upTo(HOST_BOUNDS.maxTokens),
      maxTokens: upTo(HOST_BOUNDS.maxTokens),
      estOutputTokens: upTo(HOST_BOUNDS.maxTokens),
      generated: upTo(HOST_BOUNDS.maxTokens),
      prompt: tokenIds,
    },
    { atHead: bool, out: tokenIds, sampling: checkSampling, blocks: arr(4096, nat) },
  )(x, p);
  const s = x as unknown as SubmitSeq;
  if (s.prompt!.length !== s.promptTokens) fail(`${p}.prompt`, `does not hold its ${s.promptTokens} tokens`);
  if ((s.out?.length ?? 0) !== s.generated) fail(`${p}.out`, `does not hold its ${s.generated} generated tokens`);
};

const SEQ_EVENTS: Readonly<Record<string, Check>> = {
  s: shape({ k: oneOf('s'), id: seqId }, { c: upTo(HOST_BOUNDS.maxTokens) }),
  p: shape({ k: oneOf('p'), id: seqId }),
  t: shape(
    { k: oneOf('t'), id: seqId, n: upTo(HOST_BOUNDS.maxTokens) },
    {
      ids: arr(HOST_BOUNDS.maxSeqs, tokenId),
      text: str(HOST_BOUNDS.maxText),
      lp: arr(16, shape({ lp: num, text: str(256), top: arr(20, shape({ token: tokenId, text: str(256), lp: num })) })),
    },
  ),
  f: shape(
    { k: oneOf('f'), id: seqId, reason: oneOf('done', 'eos', 'stop', 'length') },
    { result: num, batch: str(HOST_BOUNDS.maxSeqId, 1), size: nat, error: str(1024) },
  ),
  g: shape({ k: oneOf('g') }, { ids: arr(HOST_BOUNDS.maxSeqs, seqId) }),
};

const checkEvent: Check = (x, p) => {
  obj(x, p);
  const check = SEQ_EVENTS[String((x as { k?: unknown }).k)];
  if (!check) fail(`${p}.k`, 'is not a known event kind');
  check!(x, p);
};

/** Every field of a replica's load (a field added to ReplicaLoad fails to compile here until it is checked). */
const LOAD_FIELDS: Record<keyof ReplicaLoad, Check> = {
  waiting: nat,
  running: nat,
  blocksUsed: nat,
  blocksTotal: nat,
  prefillTokensAhead: nat,
  decodeTokensAhead: nat,
  waitingBlocks: nat,
  waitingByClass: arr(256, nat),
  waitingTokensByClass: arr(256, nat),
  committedBlocks: nat,
  runningCommittedBlocks: nat,
  runningContext: nat,
  preemptions: nat,
  steps: nat,
  received: nat,
  cancelled: nat,
  queued: nat,
  saturated: bool,
  stepCount: nat,
  stepMembers: nat,
  stepTokens: nat,
  stepPredictedMs: num,
  stepBusyMs: num,
  inflightPredictedMs: num,
  inflightMs: num,
};

const checkReport = shape(
  { at: num, start: num, events: arr(HOST_BOUNDS.maxEvents, checkEvent), load: shape(LOAD_FIELDS) },
  {
    ranks: arr(64, upTo(63)),
    cache: shape({ add: arr(MAX_CACHE_REPORT, nat), evict: arr(MAX_CACHE_REPORT, nat) }, { reset: bool }),
  },
);

const checkReplyValue: Check = (x, p) => {
  obj(x, p);
  const kind = (x as { kind?: unknown }).kind;
  if (kind === 'open') {
    field(x, 'capacity', checkCapacity, p);
  } else if (kind === 'tokenize') {
    field(x, 'tokens', tokenIds, p);
  } else if (kind === 'probe') {
    field(x, 'capacity', checkCapacity, p);
    field(x, 'stats', checkStats, p);
  } else {
    fail(`${p}.kind`, 'is not a known reply kind');
  }
};

/** Runs `check` over a message, turning the first problem into an error string. */
function parse<T>(
  x: unknown,
  what: string,
  check: (m: Record<string, unknown>) => void,
): { ok: true; value: T } | { ok: false; error: string } {
  try {
    obj(x, what);
    const m = x as Record<string, unknown>;
    if (m.v !== HOST_PROTOCOL_VERSION) fail(`${what}.v`, `is not protocol version ${HOST_PROTOCOL_VERSION}`);
    check(m);
    return { ok: true, value: x as T };
  } catch (err) {
    if (err instanceof InvalidMessage) return { ok: false, error: err.message };
    throw err;
  }
}

/** Validates a message from the host child; returns it typed, or an error string saying what is wrong. */
export function parseHostMessage(x: unknown): { ok: true; msg: HostMessage } | { ok: false; error: string } {
  const r = parse<HostMessage>(x, 'message', (m) => {
    switch (m.type) {
      case 'loaded':
        return checkCapacity(m.capacity, 'message.capacity');
      case 'load_failed':
      case 'failed':
        return checkFailure(m.failure, 'message.failure');
      case 'reply':
        nat(m.id, 'message.id');
        if (m.ok === true) return checkReplyValue(m.value, 'message.value');
        if (m.ok === false) return checkFailure(m.failure, 'message.failure');
        return fail('message.ok', 'is not a boolean');
      case 'progress':
        str(Math.ceil(HOST_BOUNDS.maxReportBytes / 3) * 4, 4)(m.body, 'message.body');
        arr(HOST_BOUNDS.maxEvents, seqId)(m.finished, 'message.finished');
        nat(m.received, 'message.received');
        nat(m.pending, 'message.pending');
        return checkStats(m.stats, 'message.stats');
      case 'unloaded':
        return;
      default:
        fail('message.type', 'is not a known host message type');
    }
  });
  return r.ok ? { ok: true, msg: r.value } : r;
}

/** The limits a report body is scanned with: a node-link frame's, less the envelope the worker writes around it (two
 * levels, and room for its own fields). */
export const REPORT_BODY_LIMITS: CodecLimits = Object.freeze({
  ...DEFAULT_LIMITS,
  maxBytes: HOST_BOUNDS.maxReportBytes,
  maxDepth: DEFAULT_LIMITS.maxDepth - 2,
  maxMapSize: DEFAULT_LIMITS.maxMapSize - 8,
});

/** Decodes and validates a report body (a forwarded report read in this process); throws saying what is wrong. */
export function decodeReportBody(bytes: Uint8Array): CoreReport {
  const d = decodeUntrusted(bytes, REPORT_BODY_LIMITS);
  if (!d.ok) throw new Error(`report body refused: ${d.error.code}: ${d.error.message}`);
  try {
    checkReport(d.value, 'report');
  } catch (err) {
    if (err instanceof InvalidMessage) throw new Error(`report body refused: ${err.message}`);
    throw err;
  }
  return d.value as CoreReport;
}

/** Validates a core report (as the control plane does on its wire); returns it typed, or an error string. */
export function parseCoreReport(x: unknown): { ok: true; report: CoreReport } | { ok: false; error: string } {
  try {
    checkReport(x, 'report');
    return { ok: true, report: x as CoreReport };
  } catch (err) {
    if (err instanceof InvalidMessage) return { ok: false, error: err.message };
    throw err;
  }
}

/** Validates a command from the worker (the host's own edge); returns it typed, or an error string. */
export function parseHostCommand(x: unknown): { ok: true; cmd: HostCommand } | { ok: false; error: string } {
  const r = parse<HostCommand>(x, 'command', (c) => {
    switch (c.type) {
      case 'load':
        str(4096, 1)(c.file, 'command.file');
        return obj(c.options, 'command.options');
      case 'open':
        nat(c.id, 'command.id');
        return checkCoreSpec(c.core, 'command.core');
      case 'submit':
        return arr(HOST_BOUNDS.maxSeqs, checkSubmitSeq)(c.seqs, 'command.seqs');
      case 'cancel':
        return arr(HOST_BOUNDS.maxCancel, seqId)(c.ids, 'command.ids');
      case 'tokenize':
        nat(c.id, 'command.id');
        return str(HOST_BOUNDS.maxTokens)(c.text, 'command.text');
      case 'probe':
        return nat(c.id, 'command.id');
      case 'unload':
        return;
      default:
        fail('command.type', 'is not a known host command type');
    }
  });
  return r.ok ? { ok: true, cmd: r.value } : r;
}
