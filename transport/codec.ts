// The one configured msgpack codec: plain msgpack out, and a bounded, linear-time structural
// pre-scan in front of msgpackr for every frame coming in. The only module allowed to import msgpackr.
import { Packr, type Options } from 'msgpackr';
import { writeMessage } from './frame-writer.ts';
import { validate, type Schema } from './schema.ts';

// Bounds applied to an untrusted frame before any of it is materialised.
export interface CodecLimits {
  maxBytes: number;
  maxDepth: number;
  maxArrayLength: number;
  maxMapSize: number;
  maxStringBytes: number;
}

// Limits for frames from peers: 1 MiB frames, 32 levels, 100k array items, 10k map entries, 1 MiB strings and bins.
export const DEFAULT_LIMITS: CodecLimits = Object.freeze({
  maxBytes: 1024 * 1024,
  maxDepth: 32,
  maxArrayLength: 100_000,
  maxMapSize: 10_000,
  maxStringBytes: 1024 * 1024,
});

// Why a frame was refused.
export type CodecErrorCode =
  | 'frame_too_large'
  | 'malformed'
  | 'too_deep'
  | 'too_many_items'
  | 'extension_refused'
  | 'unsafe_integer'
  | 'forbidden_key'
  | 'invalid_message';

// Every code a refused frame can carry, for callers that check a result is a typed error.
export const CODEC_ERROR_CODES: ReadonlySet<string> = new Set<CodecErrorCode>([
  'frame_too_large',
  'malformed',
  'too_deep',
  'too_many_items',
  'extension_refused',
  'unsafe_integer',
  'forbidden_key',
  'invalid_message',
]);

// A refused frame: the code, a human-readable reason, and for invalid_message the schema path.
export interface CodecError {
  code: CodecErrorCode;
  message: string;
  path?: string;
}

// Outcome of decoding: the value, or a typed refusal. Decoding never throws.
export type DecodeResult<T> = { ok: true; value: T } | { ok: false; error: CodecError };

// skipValues (omit undefined properties, as JSON does) is honoured by msgpackr 2.1.4 but missing from its typings.
const packrOptions: Options & { skipValues: unknown[] } = {
  useRecords: false,
  structuredClone: false,
  moreTypes: false,
  mapsAsObjects: true,
  bundleStrings: false,
  useFloat32: 0,
  int64AsType: 'number',
  copyBuffers: true,
  encodeUndefinedAsNil: true,
  skipValues: [undefined],
};
const packr = new Packr(packrOptions);

const MAX_SAFE_HI = 0x1fffff;
const MIN_SAFE_HI = 0xffe00000;

// Token classes for the pre-scan. A class >= 0 is a scalar with that many payload bytes after
// the type byte; the negative classes need more work. HEADER holds the length-field size.
const FIXMAP = -1;
const FIXARRAY = -2;
const FIXSTR = -3;
const STR = -4;
const BIN = -5;
const ARRAY = -6;
const MAP = -7;
const EXT = -8;
const NEVER_USED = -9;
const INT64 = -10;
const CLASS = new Int8Array(256);
const HEADER = new Uint8Array(256);
for (let t = 0x80; t <= 0x8f; t++) CLASS[t] = FIXMAP;
for (let t = 0x90; t <= 0x9f; t++) CLASS[t] = FIXARRAY;
for (let t = 0xa0; t <= 0xbf; t++) CLASS[t] = FIXSTR;
for (const [t, cls, header] of [
  [0xc1, NEVER_USED, 0],
  [0xc4, BIN, 1],
  [0xc5, BIN, 2],
  [0xc6, BIN, 4],
  [0xc7, EXT, 0],
  [0xc8, EXT, 0],
  [0xc9, EXT, 0],
  [0xca, 4, 0],
  [0xcb, 8, 0],
  [0xcc, 1, 0],
  [0xcd, 2, 0],
  [0xce, 4, 0],
  [0xcf, INT64, 0],
  [0xd0, 1, 0],
  [0xd1, 2, 0],
  [0xd2, 4, 0],
  [0xd3, INT64, 0],
  [0xd4, EXT, 0],
  [0xd5, EXT, 0],
  [0xd6, EXT, 0],
  [0xd7, EXT, 0],
  [0xd8, EXT, 0],
  [0xd9, STR, 1],
  [0xda, STR, 2],
  [0xdb, STR, 4],
  [0xdc, ARRAY, 2],
  [0xdd, ARRAY, 4],
  [0xde, MAP, 2],
  [0xdf, MAP, 4],
] as const) {
  CLASS[t] = cls;
  HEADER[t] = header;
}

// Scan state: the values still owed by each open container (a map owes two per entry) and whether
// it is a map. Module-level so a scan allocates nothing; grown on demand, never shrunk.
let owed = new Float64Array(64);
let isMap = new Uint8Array(64);

type Refusal = { ok: false; error: CodecError };

function refusal(code: CodecErrorCode, message: string): Refusal {
  return { ok: false, error: { code, message } };
}

function isForbiddenKey(b: Uint8Array, at: number, len: number): boolean {
  if (len === 9) {
    // __proto__ / prototype
    if (
      b[at] === 0x5f &&
      b[at + 1] === 0x5f &&
      b[at + 2] === 0x70 &&
      b[at + 3] === 0x72 &&
      b[at + 4] === 0x6f &&
      b[at + 5] === 0x74 &&
      b[at + 6] === 0x6f &&
      b[at + 7] === 0x5f &&
      b[at + 8] === 0x5f
    )
      return true;
    return (
      b[at] === 0x70 &&
      b[at + 1] === 0x72 &&
      b[at + 2] === 0x6f &&
      b[at + 3] === 0x74 &&
      b[at + 4] === 0x6f &&
      b[at + 5] === 0x74 &&
      b[at + 6] === 0x79 &&
      b[at + 7] === 0x70 &&
      b[at + 8] === 0x65
    );
  }
  // constructor
  return (
    len === 11 &&
    b[at] === 0x63 &&
    b[at + 1] === 0x6f &&
    b[at + 2] === 0x6e &&
    b[at + 3] === 0x73 &&
    b[at + 4] === 0x74 &&
    b[at + 5] === 0x72 &&
    b[at + 6] === 0x75 &&
    b[at + 7] === 0x63 &&
    b[at + 8] === 0x74 &&
    b[at + 9] === 0x6f &&
    b[at + 10] === 0x72
  );
}

function readLength(b: Uint8Array, at: number, size: number): number {
  if (size === 1) return b[at] as number;
  if (size === 2) return ((b[at] as number) << 8) | (b[at + 1] as number);
  return (
    (((b[at] as number) << 24) |
      ((b[at + 1] as number) << 16) |
      ((b[at + 2] as number) << 8) |
      (b[at + 3] as number)) >>>
    0
  );
}

function ensureStack(depth: number): void {
  if (depth < owed.length) return;
  const size = Math.max(depth + 1, owed.length * 2);
  const nextOwed = new Float64Array(size);
  nextOwed.set(owed);
  owed = nextOwed;
  const nextIsMap = new Uint8Array(size);
  nextIsMap.set(isMap);
  isMap = nextIsMap;
}

function truncated(at: number): Refusal {
  return refusal('malformed', `truncated frame: value at byte ${at} runs past the end`);
}

function tooLong(what: string, n: number, unit: string, at: number, limit: string, max: number): Refusal {
  return refusal('too_many_items', `${what} of ${n} ${unit} at byte ${at} exceeds ${limit} ${max}`);
}

function nonStringKey(at: number): Refusal {
  return refusal('forbidden_key', `map key at byte ${at} is not a string`);
}

// Walks the msgpack structure once without building values; null when the frame is acceptable.
// Each step consumes at least one byte, so the work is linear in the frame length, and every
// declared length is checked against the limits and the bytes left before anything is skipped.
function scan(b: Uint8Array, limits: CodecLimits): Refusal | null {
  const end = b.length;
  if (end > limits.maxBytes)
    return refusal('frame_too_large', `frame of ${end} bytes exceeds maxBytes ${limits.maxBytes}`);
  const { maxDepth, maxArrayLength, maxMapSize, maxStringBytes } = limits;
  let pos = 0;
  let depth = 0;
  let expectKey = false;
  for (;;) {
    if (pos >= end) return truncated(pos);
    const at = pos;
    const t = b[pos++] as number;
    const cls = CLASS[t] as number;
    if (cls >= 0) {
      if (expectKey) return nonStringKey(at);
      if (cls > end - pos) return truncated(at);
      pos += cls;
    } else if (cls === FIXSTR || cls === STR) {
      let len = t & 0x1f;
      if (cls === STR) {
        const size = HEADER[t] as number;
        if (size > end - pos) return truncated(at);
        len = readLength(b, pos, size);
        pos += size;
      }
      if (len > maxStringBytes) return tooLong('str', len, 'bytes', at, 'maxStringBytes', maxStringBytes);
      if (len > end - pos) return truncated(at);
      if (expectKey && (len === 9 || len === 11) && isForbiddenKey(b, pos, len)) {
        return refusal('forbidden_key', `map key at byte ${at} is __proto__, constructor or prototype`);
      }
      pos += len;
    } else if (cls === FIXMAP || cls === FIXARRAY || cls === MAP || cls === ARRAY) {
      if (expectKey) return nonStringKey(at);
      let n = t & 0x0f;
      if (cls === MAP || cls === ARRAY) {
        const size = HEADER[t] as number;
        if (size > end - pos) return truncated(at);
        n = readLength(b, pos, size);
        pos += size;
      }
      const map = cls === FIXMAP || cls === MAP;
      if (map) {
        if (n > maxMapSize) return tooLong('map', n, 'entries', at, 'maxMapSize', maxMapSize);
        if (n * 2 > end - pos) return truncated(at);
      } else {
        if (n > maxArrayLength) return tooLong('array', n, 'items', at, 'maxArrayLength', maxArrayLength);
        if (n > end - pos) return truncated(at);
      }
      if (depth >= maxDepth)
        return refusal('too_deep', `container at byte ${at} nests deeper than maxDepth ${maxDepth}`);
      if (n > 0) {
        depth++;
        ensureStack(depth);
        owed[depth] = map ? n * 2 : n;
        isMap[depth] = map ? 1 : 0;
        expectKey = map;
        continue;
      }
    } else if (cls === BIN) {
      if (expectKey) return nonStringKey(at);
      const size = HEADER[t] as number;
      if (size > end - pos) return truncated(at);
      const len = readLength(b, pos, size);
      pos += size;
      if (len > maxStringBytes) return tooLong('bin', len, 'bytes', at, 'maxStringBytes', maxStringBytes);
      if (len > end - pos) return truncated(at);
      pos += len;
    } else if (cls === INT64) {
      if (expectKey) return nonStringKey(at);
      if (8 > end - pos) return truncated(at);
      const hi = readLength(b, pos, 4);
      const lo = readLength(b, pos + 4, 4);
      const safe = hi <= MAX_SAFE_HI || (t === 0xd3 && hi >= MIN_SAFE_HI && !(hi === MIN_SAFE_HI && lo === 0));
      if (!safe) return refusal('unsafe_integer', `64-bit integer at byte ${at} is outside the safe integer range`);
      pos += 8;
    } else if (cls === EXT) {
      return refusal('extension_refused', `extension type byte 0x${t.toString(16)} at byte ${at}`);
    } else {
      return refusal('malformed', `never-used type byte 0x${t.toString(16)} at byte ${at}`);
    }
    // A value is complete: count it against its container, closing containers that are now full.
    for (;;) {
      if (depth === 0) {
        if (pos !== end) return refusal('malformed', `${end - pos} trailing bytes after the value`);
        return null;
      }
      const left = (owed[depth] as number) - 1;
      owed[depth] = left;
      if (left > 0) {
        expectKey = isMap[depth] === 1 && left % 2 === 0;
        break;
      }
      depth--;
    }
  }
}

// Encodes a value as plain msgpack (no records, structured clone or extensions). Object properties
// that are undefined are omitted and undefined array items become nil, as in JSON. A value with no
// plain form (a class instance, Date, Map, an unsafe bigint, symbol, function, a forbidden key) throws a
// TypeError at its sender instead of being refused by its receiver; so does a cycle.
// The bytes are msgpackr's for the same value with `packrOptions` (a test compares them), written by
// frame-writer.ts into one reused buffer: no scan of our own output, no 8 KiB blocks per few frames.
export function encode(value: unknown): Uint8Array {
  try {
    return writeMessage(value);
  } catch (e) {
    throw new TypeError(`encode(): ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** msgpackr's encoding of `value` with the codec's options, unchecked: what `encode` must equal (tests only). */
export function packrEncode(value: unknown): Uint8Array {
  return packr.pack(value);
}

// Decodes one untrusted frame within limits. Never throws: every refusal is a typed CodecError.
export function decodeUntrusted(bytes: Uint8Array, limits: CodecLimits = DEFAULT_LIMITS): DecodeResult<unknown> {
  if (!(bytes instanceof Uint8Array)) return refusal('malformed', 'frame is not a Uint8Array');
  let refused: Refusal | null;
  try {
    refused = scan(bytes, limits);
  } catch (e) {
    return refusal('malformed', `frame could not be scanned: ${e instanceof Error ? e.message : typeof e}`);
  }
  if (refused !== null) return refused;
  try {
    return { ok: true, value: packr.unpack(bytes) as unknown };
  } catch (e) {
    return refusal('malformed', `msgpack decoder refused the frame: ${e instanceof Error ? e.message : typeof e}`);
  }
}

// Decodes an untrusted frame and validates it against the schema. Never throws.
export function decodeMessage<T>(
  bytes: Uint8Array,
  schema: Schema<T>,
  limits: CodecLimits = DEFAULT_LIMITS,
): DecodeResult<T> {
  const decoded = decodeUntrusted(bytes, limits);
  if (!decoded.ok) return decoded;
  const checked = validate(schema, decoded.value);
  if (checked.ok) return checked;
  return { ok: false, error: { code: 'invalid_message', message: checked.error.message, path: checked.error.path } };
}

// Encodes then decodes within DEFAULT_LIMITS, so the in-process simulated transport exercises the
// real wire encoding. Throws if the value would not survive the wire.
export function roundTrip<T>(value: T): T {
  const decoded = decodeUntrusted(encode(value));
  if (!decoded.ok) throw new TypeError(`roundTrip(): ${decoded.error.code}: ${decoded.error.message}`);
  return decoded.value as T;
}

/** One msgpack map of untrusted bytes, checked whole by the pre-scan (one well-formed value within the limits, no
 * forbidden key, nothing after it) and not decoded: its entry count and where its entries start. */
export interface ScannedMap {
  readonly bytes: Uint8Array;
  readonly entries: number;
  /** Offset of the first entry (after the map's header). */
  readonly offset: number;
}

/**
 * Checks that untrusted bytes are exactly one msgpack map within `limits`, by the same linear pre-scan every frame
 * gets, without materialising anything: for forwarding a peer's map inside a frame of this side's own (see
 * frame-writer.ts `writeForwardedFrame`), whose receiver then decodes and validates it with the rest. Never throws.
 */
export function scanMap(bytes: Uint8Array, limits: CodecLimits = DEFAULT_LIMITS): DecodeResult<ScannedMap> {
  if (!(bytes instanceof Uint8Array)) return refusal('malformed', 'frame is not a Uint8Array');
  let refused: Refusal | null;
  try {
    refused = scan(bytes, limits);
  } catch (e) {
    return refusal('malformed', `frame could not be scanned: ${e instanceof Error ? e.message : typeof e}`);
  }
  if (refused !== null) return refused;
  const t = bytes[0] as number;
  if (t >= 0x80 && t <= 0x8f) return { ok: true, value: { bytes, entries: t & 0x0f, offset: 1 } };
  if (t === 0xde) return { ok: true, value: { bytes, entries: readLength(bytes, 1, 2), offset: 3 } };
  if (t === 0xdf) return { ok: true, value: { bytes, entries: readLength(bytes, 1, 4), offset: 5 } };
  return refusal('invalid_message', 'the value is not a map');
}
