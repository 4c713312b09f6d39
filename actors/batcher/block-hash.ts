// Block hashes of a prompt: the identity of each full block of `blockTokens` tokens together with everything before
// it (a chain, as vLLM's prefix caching keys its blocks), so that two prompts share block i's hash exactly when they
// share their first (i + 1) × blockTokens tokens. The engine core's prefix cache and the control plane's prefix index
// both speak these hashes. A real engine hashes token ids; the simulator, whose requests carry no tokens, hashes the
// segments a traffic model says a prompt is made of (a system prompt, earlier turns), each a key and a length.
//
// Hashes are 53-bit integers (two 32-bit multiply-xorshift lanes), exact in a double and in msgpack; a collision
// only costs a wrong guess in routing or the cost model, never wrong text: a real engine compares the tokens
// themselves before it reuses a cache.

/** The seed of every chain (the hash "before" block 0). */
const SEED_A = 0x9e3779b9;
const SEED_B = 0x85ebca6b;

/** Most blocks hashed for one prompt: a longer prompt's tail blocks are not shared by the index or the cache. */
export const MAX_HASHED_BLOCKS = 4096;

/** A piece of a prompt as the simulator knows it: `tokens` tokens of the content named `key` (same key and
 * position: same tokens). */
export interface PromptSegment {
  key: number;
  tokens: number;
}

function mix(h: number, v: number): number {
  let x = Math.imul(h ^ v, 0x5bd1e995);
  x ^= x >>> 15;
  x = Math.imul(x, 0x27d4eb2d);
  return (x ^ (x >>> 13)) >>> 0;
}

/** The running state of a chain: two lanes, folded into one hash per block. */
class Chain {
  a = SEED_A;
  b = SEED_B;
  add(v: number): void {
    // Values up to 2^53: both halves count.
    const lo = v >>> 0;
    const hi = Math.floor(v / 4294967296) >>> 0;
    this.a = mix(mix(this.a, lo), hi);
    this.b = mix(mix(this.b, hi ^ 0x68e31da4), lo);
  }
  /** The chain's hash now: 32 bits of one lane and 21 of the other. */
  value(): number {
    return this.a * 2097152 + (this.b & 0x1fffff);
  }
}

/** The chain hashes of the full blocks of `tokens` (token ids). */
export function tokenBlockHashes(tokens: readonly number[], blockTokens: number): number[] {
  const blocks = Math.min(MAX_HASHED_BLOCKS, Math.floor(tokens.length / blockTokens));
  const out: number[] = new Array<number>(blocks);
  const c = new Chain();
  for (let b = 0; b < blocks; b++) {
    for (let i = b * blockTokens; i < (b + 1) * blockTokens; i++) c.add(tokens[i]!);
    out[b] = c.value();
  }
  return out;
}

/** The chain hashes of the full blocks of a prompt made of `segments`, in order. */
export function segmentBlockHashes(segments: readonly PromptSegment[], blockTokens: number): number[] {
  const total = segments.reduce((n, s) => n + Math.max(0, s.tokens), 0);
  const blocks = Math.min(MAX_HASHED_BLOCKS, Math.floor(total / blockTokens));
  const out: number[] = new Array<number>(blocks);
  const c = new Chain();
  let seg = 0;
  let offset = 0;
  for (let b = 0; b < blocks; b++) {
    // A block's content: the (key, offset) ranges it covers; a range's tokens are named by its key and where it starts.
    let need = blockTokens;
    while (need > 0) {
      const s = segments[seg]!;
      const left = s.tokens - offset;
      if (left <= 0) {
        seg++;
        offset = 0;
        continue;
      }
      const take = Math.min(left, need);
      c.add(s.key);
      c.add(offset);
      c.add(take);
      offset += take;
      need -= take;
    }
    out[b] = c.value();
  }
  return out;
}

/** Blocks two hash lists share from the start. */
export function sharedBlocks(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}
