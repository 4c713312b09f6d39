// The client streaming protocol of `/v1/ws`: frames in msgpack or JSON (chosen by subprotocol), one version, one
// schema for each direction. Clients send one message or an array of them per frame; the server always sends arrays.
import { decodeUntrusted, encode, type CodecLimits, DEFAULT_LIMITS } from './codec.ts';
import { arr, bool, int, num, obj, oneOf, optional, str, union, validate, type Infer, type Schema } from './schema.ts';

/** Version of the client protocol; it is part of the subprotocol names. */
export const CLIENT_PROTOCOL_VERSION = 1;
/** Subprotocol for msgpack frames. */
export const SUBPROTOCOL_MSGPACK = `switchyard.v${CLIENT_PROTOCOL_VERSION}.msgpack`;
/** Subprotocol for JSON text frames. */
export const SUBPROTOCOL_JSON = `switchyard.v${CLIENT_PROTOCOL_VERSION}.json`;
/** Subprotocols in the server's order of preference. */
export const CLIENT_SUBPROTOCOLS = [SUBPROTOCOL_MSGPACK, SUBPROTOCOL_JSON] as const;
/** Frame encodings. */
export type FrameFormat = 'msgpack' | 'json';
/** Most messages in one client frame. */
export const MAX_MESSAGES_PER_FRAME = 256;
/** Longest prompt text accepted (characters). */
export const MAX_PROMPT_CHARS = 256 * 1024;

const reqId = str({ min: 1, max: 128 });
const name = str({ min: 1, max: 100 });
const code = str({ min: 1, max: 64 });
const count = int({ min: 0, max: 10_000_000 });
const ms = num({ min: 0, max: 1e12 });

/** The fields of a request, whichever client API it came by (the stream API's `submit`, OpenAI HTTP, chat). */
const requestFields = {
  model: name,
  version: optional(str({ min: 1, max: 50 })),
  priority: optional(str({ min: 1, max: 50 })),
  /** Prompt text; its token count is estimated (see docs/serving.md) unless promptTokens is given. */
  prompt: optional(str({ max: MAX_PROMPT_CHARS })),
  promptTokens: optional(int({ min: 1, max: 1_000_000 })),
  maxTokens: int({ min: 1, max: 1_000_000 }),
  /** Shortens the class's queue budget (ms from receipt). */
  deadlineMs: optional(ms),
  // Sampling, with the OpenAI API's bounds (temperature, top_p, seed, stop); they reach a real engine, the cost model
  // ignores them.
  temperature: optional(num({ min: 0, max: 2 })),
  topP: optional(num({ min: 0, max: 1 })),
  seed: optional(int({ min: 0, max: 2 ** 32 - 1 })),
  stop: optional(arr(str({ min: 1, max: 1024 }), { max: 4 })),
  /** Each token's log-probability with this many most likely alternatives (a real engine only). */
  logprobs: optional(int({ min: 0, max: 20 })),
  /** JSON output that validates against this JSON schema, as JSON text (a real engine only; see docs/serving.md). */
  jsonSchema: optional(str({ min: 2, max: 65_536 })),
};

/** The schema of a request as every client API hands it to serving. */
export const clientRequestSchema = obj(requestFields);

/** One chat message, as the chat endpoint hands it to serving (its text parts joined). */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

/** The one request type from every client API to serving, which counts its prompt for the control plane. The chat
 * endpoint adds its messages: a real engine's model renders them through its own chat template (the prompt is then
 * their `role: text` lines, which the cost model's estimate counts). */
export type ClientRequest = Infer<typeof clientRequestSchema> & { messages?: readonly ChatMessage[] };

/** The sampling parameters of a request. */
export type Sampling = Pick<ClientRequest, 'temperature' | 'topP' | 'seed' | 'stop' | 'logprobs' | 'jsonSchema'>;

/** Messages a client sends. */
export const clientMessageSchema = union('type', {
  submit: obj({
    /** Chosen by the client, unique among its live requests on this connection. */
    id: reqId,
    ...requestFields,
    /** Send the pseudo-text of each token (default true); false sends counts only. */
    text: optional(bool()),
  }),
  cancel: obj({ id: reqId }),
});

/** A message a client sends. */
export type ClientMessage = Infer<typeof clientMessageSchema>;

const failureFields = { code, message: str({ max: 2000 }), retryable: bool(), retryAfterMs: optional(ms) };

/** Messages the server sends. Every accepted request ends with exactly one `done` or `error` carrying its id. */
export const serverMessageSchema = union('type', {
  hello: obj({
    protocol: int({ min: 0 }),
    server: name,
    /** What serves the models: `simulated`, `llama.cpp`, or several joined by `+`. */
    backend: str({ min: 1, max: 64 }),
    models: arr(name, { max: 64 }),
  }),
  accepted: obj({ id: reqId, request: name, model: name, version: str({ max: 50 }) }),
  rejected: obj({ id: reqId, ...failureFields }),
  tokens: obj({
    id: reqId,
    seq: count,
    n: int({ min: 1, max: 10_000_000 }),
    text: optional(str({ max: 4 * 1024 * 1024 })),
  }),
  done: obj({
    id: reqId,
    finishReason: oneOf('length', 'stop'),
    usage: obj({ promptTokens: count, completionTokens: count }),
    timings: obj({ queueMs: ms, ttftMs: ms, e2eMs: ms }),
  }),
  /** A request's failure (with id: its terminal frame) or a refused frame (without id: the connection stays usable). */
  error: obj({ id: optional(reqId), ...failureFields }),
});

/** A message the server sends. */
export type ServerMessage = Infer<typeof serverMessageSchema>;

/** The schema of a server frame. */
export const serverFrameSchema = arr(serverMessageSchema, { min: 1, max: 100_000 });

const clientFrameArray = arr(clientMessageSchema, { min: 1, max: MAX_MESSAGES_PER_FRAME });

/** Limits for client frames: small frames, shallow nesting. */
export const CLIENT_FRAME_LIMITS: CodecLimits = Object.freeze({
  ...DEFAULT_LIMITS,
  maxBytes: 1024 * 1024,
  maxDepth: 8,
  maxArrayLength: MAX_MESSAGES_PER_FRAME,
  maxMapSize: 32,
});

/** Why a frame was refused. */
export interface FrameError {
  code: 'invalid_request';
  message: string;
}

/** Bounded pre-check of JSON text: size and nesting depth, before JSON.parse sees it. */
function jsonTooDeep(text: string, maxDepth: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92) i++;
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 123 || c === 91) {
      if (++depth > maxDepth) return true;
    } else if (c === 125 || c === 93) depth--;
  }
  return false;
}

/** Decodes an untrusted frame (text for JSON, bytes for msgpack) into validated messages; never throws. */
export function decodeFrame<T>(
  data: Uint8Array | string,
  format: FrameFormat,
  one: Schema<T>,
  many: Schema<T[]>,
  limits: CodecLimits = CLIENT_FRAME_LIMITS,
): { ok: true; messages: T[] } | { ok: false; error: FrameError } {
  let value: unknown;
  if (format === 'json') {
    if (typeof data !== 'string')
      return { ok: false, error: { code: 'invalid_request', message: 'binary frame on a JSON connection' } };
    if (data.length > limits.maxBytes)
      return {
        ok: false,
        error: { code: 'invalid_request', message: `frame of ${data.length} characters exceeds ${limits.maxBytes}` },
      };
    if (jsonTooDeep(data, limits.maxDepth))
      return { ok: false, error: { code: 'invalid_request', message: `frame nests deeper than ${limits.maxDepth}` } };
    try {
      value = JSON.parse(data);
    } catch (e) {
      return { ok: false, error: { code: 'invalid_request', message: `not JSON: ${(e as Error).message}` } };
    }
  } else {
    if (typeof data === 'string')
      return { ok: false, error: { code: 'invalid_request', message: 'text frame on a msgpack connection' } };
    const d = decodeUntrusted(data, limits);
    if (!d.ok) return { ok: false, error: { code: 'invalid_request', message: `${d.error.code}: ${d.error.message}` } };
    value = d.value;
  }
  const v = Array.isArray(value) ? validate(many, value) : validate(one, value);
  if (!v.ok) return { ok: false, error: { code: 'invalid_request', message: `${v.error.message} at ${v.error.path}` } };
  return { ok: true, messages: Array.isArray(v.value) ? (v.value as T[]) : [v.value as T] };
}

/** Decodes a client frame. */
export function decodeClientFrame(
  data: Uint8Array | string,
  format: FrameFormat,
): ReturnType<typeof decodeFrame<ClientMessage>> {
  return decodeFrame(data, format, clientMessageSchema, clientFrameArray);
}

/** Decodes a server frame (the client's side); server frames are larger, so the default codec limits apply. */
export function decodeServerFrame(
  data: Uint8Array | string,
  format: FrameFormat,
): ReturnType<typeof decodeFrame<ServerMessage>> {
  return decodeFrame(data, format, serverMessageSchema, serverFrameSchema, {
    ...DEFAULT_LIMITS,
    maxBytes: 16 * 1024 * 1024,
    maxStringBytes: 4 * 1024 * 1024,
  });
}

/** Encodes a frame (one message or an array) in the connection's format. */
export function encodeFrame(value: unknown, format: FrameFormat): Uint8Array | string {
  return format === 'json' ? JSON.stringify(value) : encode(value);
}

/** The format a negotiated subprotocol names. */
export function formatOf(subprotocol: string): FrameFormat {
  return subprotocol === SUBPROTOCOL_JSON ? 'json' : 'msgpack';
}
