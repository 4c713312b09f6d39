// The server's outgoing msgpack frames, written straight into one growing buffer: a frame is an array of messages,
// and a request's tokens are written from its slot (id, seq, n, text) without a message object per token. Plain
// msgpack (the same values `encode` would produce: maps with string keys, undefined properties omitted, integers in
// their smallest form, other numbers as float64), so any msgpack client decodes it; our own bytes need no pre-scan.

import type { Forwarded } from './forward.ts';

/** A request's tokens waiting for the next frame: the fields of a `tokens` message. */
export interface TokensEntry {
  readonly id: string;
  seq: number;
  n: number;
  text: string | undefined;
  /** The writer's cache: the message's bytes up to its `seq` value (type and id), encoded at its first frame. */
  head?: Uint8Array | undefined;
}

const enc = new TextEncoder();
let buf = new Uint8Array(64 * 1024);
let view = new DataView(buf.buffer);
let at = 0;

function room(n: number): void {
  if (at + n <= buf.length) return;
  let size = buf.length * 2;
  while (size < at + n) size *= 2;
  const next = new Uint8Array(size);
  next.set(buf.subarray(0, at));
  buf = next;
  view = new DataView(buf.buffer);
}

/** A marker then `n` (below 2^32) in 2 or 4 big-endian bytes, whichever holds it. The caller made room. */
function wide(n: number, m16: number, m32: number): void {
  if (n < 0x10000) {
    buf[at++] = m16;
    view.setUint16(at, n);
    at += 2;
  } else {
    buf[at++] = m32;
    view.setUint32(at, n);
    at += 4;
  }
}

/** An array's or a map's header: its fixed form below 16 entries, else a marker and a 2- or 4-byte count. */
function header(n: number, fix: number, b16: number, b32: number): void {
  room(5);
  if (n < 16) buf[at++] = fix | n;
  else wide(n, b16, b32);
}

function writeString(s: string): void {
  const len = s.length;
  // Short ASCII (ids, keys, types): byte by byte; anything else through the UTF-8 encoder.
  if (len < 32) {
    let ascii = true;
    for (let i = 0; i < len; i++) if (s.charCodeAt(i) > 0x7f) ascii = false;
    if (ascii) {
      room(len + 1);
      buf[at++] = 0xa0 | len;
      for (let i = 0; i < len; i++) buf[at++] = s.charCodeAt(i);
      return;
    }
  }
  const max = len * 3;
  room(max + 5);
  // Reserve the widest header the string can need, write, then move the bytes if a narrower header fits.
  const head = max < 32 ? 1 : max < 0x100 ? 2 : max < 0x10000 ? 3 : 5;
  const start = at;
  const { written } = enc.encodeInto(s, buf.subarray(start + head));
  const n = written;
  const need = n < 32 ? 1 : n < 0x100 ? 2 : n < 0x10000 ? 3 : 5;
  if (need !== head) buf.copyWithin(start + need, start + head, start + head + n);
  at = start;
  if (need === 1) buf[at++] = 0xa0 | n;
  else sized(n, 0xd9, 0xda, 0xdb);
  at += n;
}

/** A marker then `n` (below 2^32) in the fewest of 1, 2 or 4 big-endian bytes: a uint, or a bin's length. The caller
 * made room. */
function sized(n: number, m8: number, m16: number, m32: number): void {
  if (n < 0x100) {
    buf[at++] = m8;
    buf[at++] = n;
  } else wide(n, m16, m32);
}

/** A number as msgpackr writes it (so `encode` stays byte for byte what it was): integers of up to 32 bits in
 * their smallest form, every other number as a float64. */
function writeNumber(x: number): void {
  room(9);
  if (x >>> 0 === x) {
    if (x < 0x80) buf[at++] = x;
    else sized(x, 0xcc, 0xcd, 0xce);
    return;
  }
  if (x >> 0 === x) {
    if (x >= -32) buf[at++] = x & 0xff;
    else if (x >= -0x80) {
      buf[at++] = 0xd0;
      view.setInt8(at++, x);
    } else if (x >= -0x8000) {
      buf[at++] = 0xd1;
      view.setInt16(at, x);
      at += 2;
    } else {
      buf[at++] = 0xd2;
      view.setInt32(at, x);
      at += 4;
    }
    return;
  }
  buf[at++] = 0xcb;
  view.setFloat64(at, x);
  at += 8;
}

function isPlain(v: object): boolean {
  const p = Object.getPrototypeOf(v) as unknown;
  return p === Object.prototype || p === null;
}

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);

/** How deep `writeValue` may nest: the receivers' limit for frames, far more for `writeMessage`. */
let maxDepth = 32;

function writeValue(v: unknown, depth: number): void {
  if (depth > maxDepth) throw new TypeError(`too_deep: frame nests deeper than ${maxDepth}`);
  if (v === null || v === undefined) {
    room(1);
    buf[at++] = 0xc0;
  } else if (typeof v === 'string') writeString(v);
  else if (typeof v === 'number') writeNumber(v);
  else if (typeof v === 'boolean') {
    room(1);
    buf[at++] = v ? 0xc3 : 0xc2;
  } else if (Array.isArray(v)) {
    header(v.length, 0x90, 0xdc, 0xdd);
    for (const x of v) writeValue(x, depth + 1);
  } else if (v instanceof Uint8Array) {
    const n = v.byteLength;
    room(n + 5);
    sized(n, 0xc4, 0xc5, 0xc6);
    buf.set(v, at);
    at += n;
  } else if (typeof v === 'object' && isPlain(v)) {
    const o = v as Record<string, unknown>;
    let n = 0;
    for (const k in o) if (o[k] !== undefined) n++;
    header(n, 0x80, 0xde, 0xdf);
    for (const k in o) {
      const x = o[k];
      if (x === undefined) continue;
      // What every receiver refuses (codec.ts), refused at its sender.
      if (k === '__proto__' || k === 'constructor' || k === 'prototype') throw new TypeError(`forbidden_key: ${k}`);
      writeString(k);
      writeValue(x, depth + 1);
    }
  } else if (typeof v === 'bigint') {
    // As msgpackr writes one (int64); a peer refuses any outside the safe range, so it is refused here.
    if (v > MAX_SAFE || v < MIN_SAFE) throw new TypeError(`unsafe_integer: ${v} is outside the safe integer range`);
    room(9);
    buf[at++] = 0xd3;
    view.setBigInt64(at, v);
    at += 8;
  } else {
    const what = typeof v === 'object' ? (Object.getPrototypeOf(v)?.constructor?.name ?? 'object') : typeof v;
    throw new TypeError(`extension_refused: a ${what} has no plain msgpack form`);
  }
}

const ascii = (...parts: string[]): Uint8Array => {
  const bytes: number[] = [];
  for (const p of parts) {
    bytes.push(0xa0 | p.length);
    for (let i = 0; i < p.length; i++) bytes.push(p.charCodeAt(i));
  }
  return Uint8Array.from(bytes);
};
// A tokens message's constant bytes: its keys and type, in the order `tokensMessage` has them.
const TOKENS_HEAD = ascii('type', 'tokens', 'id');
const SEQ_KEY = ascii('seq');
const N_KEY = ascii('n');
const TEXT_KEY = ascii('text');
const TO_KEY = ascii('to');
const MSG_KEY = ascii('msg');

function writeConst(b: Uint8Array): void {
  room(b.length);
  for (let i = 0; i < b.length; i++) buf[at++] = b[i]!;
}

/** The bytes of a tokens message before its seq value (the id and keys never change): written once per entry. */
function tokensHead(e: TokensEntry): Uint8Array {
  const start = at;
  writeConst(TOKENS_HEAD);
  writeString(e.id);
  writeConst(SEQ_KEY);
  const head = buf.slice(start, at);
  at = start;
  return head;
}

function writeTokens(e: TokensEntry): void {
  const hasText = e.text !== undefined;
  const head = (e.head ??= tokensHead(e));
  room(1 + head.length);
  buf[at++] = 0x80 | (hasText ? 5 : 4);
  buf.set(head, at);
  at += head.length;
  writeNumber(e.seq);
  writeConst(N_KEY);
  writeNumber(e.n);
  if (hasText) {
    writeConst(TEXT_KEY);
    writeString(e.text!);
  }
}

/**
 * Writes one frame: an array of `items`, each a message object or a request's tokens entry (told apart by `isTokens`).
 * Returns a copy of the bytes (the socket may still hold it after this returns; the work buffer is reused).
 */
export function writeFrame<M>(items: readonly (M | TokensEntry)[], isTokens: (x: M | TokensEntry) => boolean): Buffer {
  const saved = enter();
  try {
    at = 0;
    header(items.length, 0x90, 0xdc, 0xdd);
    for (const x of items) {
      if (isTokens(x)) writeTokens(x as TokensEntry);
      else writeValue(x, 1);
    }
    return takeBytes();
  } finally {
    leave(saved);
  }
}

/** Writes in progress: a getter read while writing may itself encode (a write inside a write gets a buffer of its
 * own, and the outer one resumes where it was). */
let writing = 0;
interface Saved {
  buf: typeof buf;
  view: typeof view;
  at: number;
  maxDepth: number;
}
function enter(): Saved | null {
  if (writing++ === 0) return null;
  const saved = { buf, view, at, maxDepth };
  buf = new Uint8Array(1024);
  view = new DataView(buf.buffer);
  at = 0;
  return saved;
}
function leave(saved: Saved | null): void {
  writing--;
  if (saved) ({ buf, view, at, maxDepth } = saved);
}

/** Copies the work buffer's `at` bytes out (the socket may hold them after this returns; the buffer is reused). */
function takeBytes(): Buffer {
  const out = Buffer.allocUnsafe(at);
  out.set(buf.subarray(0, at));
  // A rare huge frame does not keep its buffer.
  if (buf.length > 16 * 1024 * 1024) {
    buf = new Uint8Array(64 * 1024);
    view = new DataView(buf.buffer);
  }
  return out;
}

/**
 * Any plain value (objects with Object's or no prototype, arrays, strings, numbers, booleans, null, undefined,
 * Uint8Array) as the bytes msgpackr writes for it with codec.ts's options: undefined properties omitted, undefined
 * items nil. Throws a TypeError on anything else (a class instance, a Map, a bigint...) or a forbidden key.
 */
export function writeMessage(value: unknown): Buffer {
  const saved = enter();
  try {
    at = 0;
    maxDepth = 10_000;
    writeValue(value, 0);
    return takeBytes();
  } finally {
    maxDepth = 32;
    leave(saved);
  }
}

/**
 * Writes one node-link frame holding one envelope, `{ to, msg }`, whose message is a forwarded map (forward.ts): its
 * entries as they are, then the forwarder's own fields, which a decoder reads last (so they win). The map was checked
 * by the codec's pre-scan (scanMap) against limits that leave room for this envelope.
 */
export function writeForwardedFrame(to: string, f: Forwarded): Buffer {
  const saved = enter();
  try {
    at = 0;
    const own = Object.keys(f.own);
    const { bytes, entries, offset } = f.map;
    header(1, 0x90, 0xdc, 0xdd);
    header(2, 0x80, 0xde, 0xdf);
    writeConst(TO_KEY);
    writeString(to);
    writeConst(MSG_KEY);
    header(entries + own.length, 0x80, 0xde, 0xdf);
    const n = bytes.length - offset;
    room(n);
    buf.set(offset === 0 ? bytes : bytes.subarray(offset), at);
    at += n;
    for (const k of own) {
      writeString(k);
      writeValue(f.own[k], 2);
    }
    return takeBytes();
  } finally {
    leave(saved);
  }
}

/** The message a tokens entry stands for (the JSON format, and tests). */
export function tokensMessage(e: TokensEntry): { type: 'tokens'; id: string; seq: number; n: number; text?: string } {
  return e.text === undefined
    ? { type: 'tokens', id: e.id, seq: e.seq, n: e.n }
    : { type: 'tokens', id: e.id, seq: e.seq, n: e.n, text: e.text };
}
