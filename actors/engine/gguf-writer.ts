// Serialises metadata and tensors into a GGUF v3 file image (the format llama.cpp loads), byte for byte deterministic.
//
// Layout (all little-endian): magic "GGUF", u32 version 3, u64 tensor count, u64 metadata count, the metadata
// key/values, the tensor infos (name, dims with the fastest-varying first, ggml type, offset into the data section),
// zero padding up to the alignment, then each tensor's data at its aligned offset.

/** A scalar metadata type of GGUF, by its short name. */
export type GgufScalarType =
  'u8' | 'i8' | 'u16' | 'i16' | 'u32' | 'i32' | 'f32' | 'bool' | 'string' | 'u64' | 'i64' | 'f64';

/** One metadata key/value: a scalar of a GGUF type, or a homogeneous array of one. */
export type GgufKv =
  | { key: string; type: Exclude<GgufScalarType, 'string' | 'bool'>; value: number }
  | { key: string; type: 'string'; value: string }
  | { key: string; type: 'bool'; value: boolean }
  | { key: string; type: 'array'; itemType: 'string'; value: readonly string[] }
  | { key: string; type: 'array'; itemType: Exclude<GgufScalarType, 'string' | 'bool'>; value: ArrayLike<number> };

/** A tensor element type we write: float32, float16, or ggml's 8-bit blocks (q8_0: 32 values share a half scale). */
export type GgufTensorType = 'f32' | 'f16' | 'q8_0';

/** One tensor: dims listed fastest-varying first (ggml's ne order); data is row-major in that order. A q8_0 tensor's
 * first dim is a multiple of its 32-value block. */
export interface GgufTensor {
  name: string;
  dims: readonly number[];
  type: GgufTensorType;
  data: Float32Array;
}

/** GGUF value type ids (gguf_type in ggml). */
const VALUE_TYPE: Record<GgufScalarType | 'array', number> = {
  u8: 0,
  i8: 1,
  u16: 2,
  i16: 3,
  u32: 4,
  i32: 5,
  f32: 6,
  bool: 7,
  string: 8,
  array: 9,
  u64: 10,
  i64: 11,
  f64: 12,
};
const SCALAR_BYTES: Record<Exclude<GgufScalarType, 'string'>, number> = {
  u8: 1,
  i8: 1,
  u16: 2,
  i16: 2,
  u32: 4,
  i32: 4,
  f32: 4,
  bool: 1,
  u64: 8,
  i64: 8,
  f64: 8,
};
/** ggml_type ids of the tensor types we write. */
const TENSOR_TYPE = { f32: 0, f16: 1, q8_0: 8 } as const;
/** Values per q8_0 block and its bytes (a half scale, then one signed byte per value): ggml's block_q8_0. */
export const Q8_0_BLOCK = Object.freeze({ values: 32, bytes: 34 });
const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
const GGUF_VERSION = 3;
/** The alignment llama.cpp assumes when general.alignment is absent. */
export const GGUF_DEFAULT_ALIGNMENT = 32;

const utf8 = new TextEncoder();
const alignUp = (n: number, a: number): number => Math.ceil(n / a) * a;

/** Sequential little-endian writer over a preallocated buffer. */
interface Cursor {
  view: DataView;
  bytes: Uint8Array;
  at: number;
}

const putString = (c: Cursor, s: string): void => {
  const encoded = utf8.encode(s);
  c.view.setBigUint64(c.at, BigInt(encoded.length), true);
  c.bytes.set(encoded, c.at + 8);
  c.at += 8 + encoded.length;
};

const putScalar = (c: Cursor, type: Exclude<GgufScalarType, 'string'>, v: number | boolean): void => {
  const n = typeof v === 'boolean' ? (v ? 1 : 0) : v;
  const { view, at } = c;
  switch (type) {
    case 'u8':
      view.setUint8(at, n);
      break;
    case 'i8':
      view.setInt8(at, n);
      break;
    case 'u16':
      view.setUint16(at, n, true);
      break;
    case 'i16':
      view.setInt16(at, n, true);
      break;
    case 'u32':
      view.setUint32(at, n, true);
      break;
    case 'i32':
      view.setInt32(at, n, true);
      break;
    case 'f32':
      view.setFloat32(at, n, true);
      break;
    case 'bool':
      view.setUint8(at, n);
      break;
    case 'u64':
      view.setBigUint64(at, BigInt(n), true);
      break;
    case 'i64':
      view.setBigInt64(at, BigInt(n), true);
      break;
    case 'f64':
      view.setFloat64(at, n, true);
      break;
  }
  c.at += SCALAR_BYTES[type];
};

const stringBytes = (s: string): number => 8 + utf8.encode(s).length;

const kvBytes = (kv: GgufKv): number => {
  const head = stringBytes(kv.key) + 4;
  if (kv.type === 'string') return head + stringBytes(kv.value);
  if (kv.type !== 'array') return head + SCALAR_BYTES[kv.type];
  const items =
    kv.itemType === 'string'
      ? kv.value.reduce((sum, s) => sum + stringBytes(s), 0)
      : kv.value.length * SCALAR_BYTES[kv.itemType];
  return head + 4 + 8 + items;
};

const putKv = (c: Cursor, kv: GgufKv): void => {
  putString(c, kv.key);
  c.view.setUint32(c.at, VALUE_TYPE[kv.type], true);
  c.at += 4;
  if (kv.type === 'string') return putString(c, kv.value);
  if (kv.type !== 'array') return putScalar(c, kv.type, kv.value);
  c.view.setUint32(c.at, VALUE_TYPE[kv.itemType], true);
  c.view.setBigUint64(c.at + 4, BigInt(kv.value.length), true);
  c.at += 12;
  if (kv.itemType === 'string') {
    for (const s of kv.value) putString(c, s);
  } else {
    for (let i = 0; i < kv.value.length; i++) putScalar(c, kv.itemType, kv.value[i]!);
  }
};

// One shared word to reinterpret float bits without allocating per value.
const F32_SCRATCH = new Float32Array(1);
const U32_SCRATCH = new Uint32Array(F32_SCRATCH.buffer);

/** Converts a float32 to IEEE half bits, rounding to nearest even (overflow to infinity, subnormals kept). */
export function f32ToF16Bits(value: number): number {
  F32_SCRATCH[0] = value;
  const x = U32_SCRATCH[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rem > mid || (rem === mid && half & 1) ? 1 : 0));
  }
  let half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half += 1; // may carry into the exponent: still correct
  e = half >>> 10;
  return sign | (e >= 0x1f ? 0x7c00 : half);
}

const tensorInfoBytes = (t: GgufTensor): number => stringBytes(t.name) + 4 + 8 * t.dims.length + 4 + 8;
const tensorDataBytes = (t: GgufTensor): number =>
  t.type === 'q8_0'
    ? (t.data.length / Q8_0_BLOCK.values) * Q8_0_BLOCK.bytes
    : t.data.length * (t.type === 'f32' ? 4 : 2);

const checkTensor = (t: GgufTensor): void => {
  const count = t.dims.reduce((a, b) => a * b, 1);
  if (t.dims.length < 1 || t.dims.length > 4 || count !== t.data.length) {
    throw new RangeError(`tensor ${t.name}: dims ${t.dims.join('x')} do not match ${t.data.length} values`);
  }
  if (t.type === 'q8_0' && t.dims[0]! % Q8_0_BLOCK.values !== 0)
    throw new RangeError(
      `tensor ${t.name}: a q8_0 row of ${t.dims[0]} values is not a whole number of 32-value blocks`,
    );
};

/** Writes `data` as q8_0 blocks from byte `at`: each block's scale is its largest magnitude / 127 (as a half), and
 * each value is rounded to the nearest multiple of it (ggml's reference quantisation). */
function putQ8_0(view: DataView, at: number, data: Float32Array): void {
  const { values, bytes } = Q8_0_BLOCK;
  for (let b = 0; b < data.length; b += values, at += bytes) {
    let amax = 0;
    for (let i = 0; i < values; i++) amax = Math.max(amax, Math.abs(data[b + i]!));
    const d = amax / 127;
    const inv = d === 0 ? 0 : 1 / d;
    view.setUint16(at, f32ToF16Bits(d), true);
    for (let i = 0; i < values; i++) view.setInt8(at + 2 + i, Math.round(data[b + i]! * inv));
  }
}

/** Writes one tensor's data from byte `at` in its element type. */
function putTensorData(view: DataView, at: number, t: GgufTensor): void {
  if (t.type === 'q8_0') return putQ8_0(view, at, t.data);
  if (t.type === 'f32') for (let j = 0; j < t.data.length; j++, at += 4) view.setFloat32(at, t.data[j]!, true);
  else for (let j = 0; j < t.data.length; j++, at += 2) view.setUint16(at, f32ToF16Bits(t.data[j]!), true);
}

/** Builds the complete GGUF v3 image of the given metadata and tensors; same inputs give the same bytes. */
export function writeGguf(kvs: readonly GgufKv[], tensors: readonly GgufTensor[]): Uint8Array {
  const alignKv = kvs.find((kv) => kv.key === 'general.alignment');
  const alignment = alignKv && alignKv.type === 'u32' ? alignKv.value : GGUF_DEFAULT_ALIGNMENT;
  tensors.forEach(checkTensor);
  const headerBytes =
    4 + 4 + 8 + 8 + kvs.reduce((s, kv) => s + kvBytes(kv), 0) + tensors.reduce((s, t) => s + tensorInfoBytes(t), 0);
  const dataStart = alignUp(headerBytes, alignment);
  const offsets: number[] = [];
  let dataBytes = 0;
  for (const t of tensors) {
    offsets.push(dataBytes);
    dataBytes = alignUp(dataBytes + tensorDataBytes(t), alignment);
  }
  const bytes = new Uint8Array(dataStart + dataBytes);
  const c: Cursor = { view: new DataView(bytes.buffer), bytes, at: 0 };
  c.view.setUint32(0, GGUF_MAGIC, true);
  c.view.setUint32(4, GGUF_VERSION, true);
  c.view.setBigUint64(8, BigInt(tensors.length), true);
  c.view.setBigUint64(16, BigInt(kvs.length), true);
  c.at = 24;
  for (const kv of kvs) putKv(c, kv);
  tensors.forEach((t, i) => {
    putString(c, t.name);
    c.view.setUint32(c.at, t.dims.length, true);
    c.at += 4;
    for (const d of t.dims) {
      c.view.setBigUint64(c.at, BigInt(d), true);
      c.at += 8;
    }
    c.view.setUint32(c.at, TENSOR_TYPE[t.type], true);
    c.view.setBigUint64(c.at + 4, BigInt(offsets[i]!), true);
    c.at += 12;
  });
  tensors.forEach((t, i) => putTensorData(c.view, dataStart + offsets[i]!, t));
  return bytes;
}
