// The engine core's prefix cache: KV blocks a sequence computed stay cached, keyed by their chain hash
// (block-hash.ts), after the sequence leaves, so a later prompt that starts the same way reuses them and prefills only
// the rest (vLLM's automatic prefix caching, block-granular). A cached block is either in use (held by running
// sequences, counted by how many) or idle (held by none: evictable). The ledger sees both counts: idle blocks are free
// space that costs an eviction to take, so admission never waits on the cache. Eviction takes idle blocks least
// recently used first and, among equals, the deepest first (a chain is evicted from its tail, so what remains is
// still a prefix). Deterministic: ties break on the hash.

interface Block {
  hash: number;
  /** The block before it in its chain (null: the first block of a prompt). */
  parent: number | null;
  depth: number;
  /** Running sequences that hold it. */
  refs: number;
  /** Children cached (a block with children is never evicted before them). */
  children: number;
  /** Clock of its last use (acquired or released). */
  used: number;
  /** Its position in the eviction heap, -1 when not in it. */
  at: number;
}

/** A prefix cache over a ledger's blocks. */
export interface PrefixCache {
  /** Cached blocks at the start of `hashes` (the longest chain present, in use or idle). */
  match(hashes: readonly number[]): number;
  /** A sequence takes the first `n` blocks of `hashes` (all cached: see match); returns how many of them were idle
   * (the ledger moves those from idle to in use). */
  acquire(hashes: readonly number[], n: number, now: number): number;
  /** A sequence leaves: it held the first `held` blocks of `hashes` (acquired or since computed and inserted). They
   * stay cached and become idle when no other sequence holds them. */
  release(hashes: readonly number[], held: number, now: number): void;
  /** A running sequence computed blocks `from`..`to - 1` of `hashes`: they enter the cache held by it. Blocks
   * already cached (another sequence computed the same) are held instead; returns how many were new. */
  insert(hashes: readonly number[], from: number, to: number, now: number): number;
  /** Evicts up to `n` idle blocks; returns the hashes evicted (the control plane's index forgets them). */
  evict(n: number): number[];
  /** Cached blocks held by no sequence. */
  idle(): number;
  /** How many of the first `n` blocks of `hashes` (all cached) are idle. */
  idleAmong(hashes: readonly number[], n: number): number;
  /** Cached blocks in all. */
  size(): number;
  /** Forgets everything (a replica that lost its memory). */
  clear(): void;
}

/** Creates an empty prefix cache. */
export function createPrefixCache(): PrefixCache {
  const blocks = new Map<number, Block>();
  // Min-heap of evictable blocks (idle leaves): least recently used first, then deepest, then smallest hash.
  const heap: Block[] = [];
  let idle = 0;
  const before = (x: Block, y: Block): boolean =>
    x.used !== y.used ? x.used < y.used : x.depth !== y.depth ? x.depth > y.depth : x.hash < y.hash;
  const swap = (i: number, j: number): void => {
    const t = heap[i]!;
    heap[i] = heap[j]!;
    heap[j] = t;
    heap[i]!.at = i;
    heap[j]!.at = j;
  };
  const up = (i: number): void => {
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(heap[i]!, heap[p]!)) break;
      swap(i, p);
      i = p;
    }
  };
  const down = (i: number): void => {
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < heap.length && before(heap[l]!, heap[m]!)) m = l;
      if (r < heap.length && before(heap[r]!, heap[m]!)) m = r;
      if (m === i) return;
      swap(i, m);
      i = m;
    }
  };
  const unheap = (b: Block): void => {
    if (b.at < 0) return;
    const i = b.at;
    const last = heap.pop()!;
    b.at = -1;
    if (last !== b) {
      heap[i] = last;
      last.at = i;
      up(i);
      down(last.at);
    }
  };
  /** Puts a block in the heap when it is evictable (idle, no children), out of it otherwise. */
  const place = (b: Block): void => {
    const evictable = b.refs === 0 && b.children === 0;
    if (evictable && b.at < 0) {
      b.at = heap.length;
      heap.push(b);
      up(b.at);
    } else if (!evictable) unheap(b);
  };
  const hold = (b: Block, now: number): boolean => {
    const wasIdle = b.refs === 0;
    if (wasIdle) idle--;
    b.refs++;
    b.used = now;
    unheap(b);
    return wasIdle;
  };

  return {
    match: (hashes) => {
      let n = 0;
      while (n < hashes.length && blocks.has(hashes[n]!)) n++;
      return n;
    },
    acquire: (hashes, n, now) => {
      let wasIdle = 0;
      for (let i = 0; i < n; i++) {
        const b = blocks.get(hashes[i]!);
        if (!b) throw new RangeError(`prefix block ${i} of the sequence is not cached`);
        if (hold(b, now)) wasIdle++;
      }
      return wasIdle;
    },
    insert: (hashes, from, to, now) => {
      let added = 0;
      for (let i = from; i < to; i++) {
        const h = hashes[i]!;
        const known = blocks.get(h);
        if (known) {
          hold(known, now);
          continue;
        }
        const parent = i === 0 ? null : hashes[i - 1]!;
        const b: Block = { hash: h, parent, depth: i, refs: 1, children: 0, used: now, at: -1 };
        blocks.set(h, b);
        added++;
        if (parent !== null) {
          const p = blocks.get(parent);
          if (p) {
            p.children++;
            place(p);
          }
        }
      }
      return added;
    },
    release: (hashes, held, now) => {
      for (let i = 0; i < held; i++) {
        const b = blocks.get(hashes[i]!);
        if (!b || b.refs === 0) continue;
        b.refs--;
        b.used = now;
        if (b.refs === 0) idle++;
        place(b);
      }
    },
    evict: (n) => {
      const out: number[] = [];
      while (out.length < n && heap.length > 0) {
        const b = heap[0]!;
        unheap(b);
        blocks.delete(b.hash);
        idle--;
        out.push(b.hash);
        if (b.parent !== null) {
          const p = blocks.get(b.parent);
          if (p) {
            p.children--;
            place(p);
          }
        }
      }
      return out;
    },
    idle: () => idle,
    idleAmong: (hashes, n) => {
      let k = 0;
      for (let i = 0; i < n; i++) if (blocks.get(hashes[i]!)?.refs === 0) k++;
      return k;
    },
    size: () => blocks.size,
    clear: () => {
      blocks.clear();
      heap.length = 0;
      idle = 0;
    },
  };
}
