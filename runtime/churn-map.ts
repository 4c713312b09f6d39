// A Map for keys that come and go at a high rate, one per request (live requests, a batcher's sequences, an actor
// group's members): it is rebuilt, as a fresh Map of its live entries, once the deletions since the last rebuild reach
// its size (and REBUILD_MIN).
//
// Why: V8's Map is a hash table that is replaced by a new one when inserts and the holes left by deletions fill it.
// The replaced table keeps a link to its successor (for iterators still walking it) and the entries it held. A
// long-lived map's table is sooner or later promoted to the old generation; from then on each replaced table, dead
// but old, keeps its successor alive through every minor collection, so every later table, and every request that
// was in it when it was replaced, is copied and promoted until the next full collection. Measured in `serve` at
// 1,000 req/s (bench:live's latency load, --trace-gc-nvp): each young-generation collection kept 710-750 KB alive
// and promoted 640-690 KB, mostly requests that had already finished; with these maps rebuilt and XState's own map
// of started actors left empty (registerNothing in system.ts), 290-330 KB and 230-260 KB, and the mean pause fell
// from about 4 ms to 2.5 ms. A rebuilt map is young and replaced long before it could be promoted, so no chain
// starts; the amortized cost is one entry copied per deletion.
//
// Iteration order is the Map's (insertion order), rebuilt or not. Iterating while deleting sees the entries of the
// map the iteration started on: callers that delete while they iterate copy the entries first, as with any Map.

/** Deletions after which a map is rebuilt even when it holds fewer entries. */
const REBUILD_MIN = 32;

/** The subset of Map that the churning maps use. */
export class ChurnMap<K, V> implements Iterable<[K, V]> {
  private m = new Map<K, V>();
  private deleted = 0;

  get size(): number {
    return this.m.size;
  }

  get(k: K): V | undefined {
    return this.m.get(k);
  }

  has(k: K): boolean {
    return this.m.has(k);
  }

  set(k: K, v: V): this {
    this.m.set(k, v);
    return this;
  }

  delete(k: K): boolean {
    if (!this.m.delete(k)) return false;
    if (++this.deleted >= REBUILD_MIN && this.deleted >= this.m.size) {
      this.deleted = 0;
      this.m = new Map(this.m);
    }
    return true;
  }

  clear(): void {
    this.deleted = 0;
    this.m = new Map();
  }

  values(): IterableIterator<V> {
    return this.m.values();
  }

  keys(): IterableIterator<K> {
    return this.m.keys();
  }

  entries(): IterableIterator<[K, V]> {
    return this.m.entries();
  }

  [Symbol.iterator](): IterableIterator<[K, V]> {
    return this.m[Symbol.iterator]();
  }
}
