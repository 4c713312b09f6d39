// The control plane's index of what each replica's engine core holds in its prefix cache: per replica, the chain
// hashes of cached blocks (block-hash.ts), fed by the cores' reports of blocks kept and evicted, bounded per replica
// (least recently reported first out: approximate, as SGLang's router and Dynamo's KV router are). The cost policy
// asks how many of a request's first blocks a replica holds and prices only the rest as prefill. A replica that lost
// its memory (failed, stopped, restarted, a new epoch) is dropped whole: it has no prefix.

/** Most blocks remembered per replica. */
export const MAX_INDEXED_BLOCKS = 65_536;

/** The index over every replica. */
export interface PrefixIndex {
  /** A replica's core kept these blocks (any order; a chain's blocks each count alone). */
  add(replica: string, hashes: readonly number[]): void;
  /** A replica's core evicted these blocks. */
  remove(replica: string, hashes: readonly number[]): void;
  /** Forgets a replica's cache (it lost it, or it is gone). */
  drop(replica: string): void;
  /** Blocks at the start of `hashes` the replica holds. */
  cachedBlocks(replica: string, hashes: readonly number[]): number;
  /** Blocks remembered for a replica. */
  size(replica: string): number;
  /** The replicas with blocks remembered. */
  replicas(): string[];
}

/** Creates an empty index; `max` bounds each replica's entries. */
export function createPrefixIndex(max = MAX_INDEXED_BLOCKS): PrefixIndex {
  // Insertion order is report order: the first key is the least recently reported.
  const byReplica = new Map<string, Set<number>>();
  return {
    add: (replica, hashes) => {
      let set = byReplica.get(replica);
      if (!set) byReplica.set(replica, (set = new Set()));
      for (const h of hashes) {
        set.delete(h);
        set.add(h);
      }
      if (set.size > max) {
        let over = set.size - max;
        for (const h of set) {
          if (over-- <= 0) break;
          set.delete(h);
        }
      }
    },
    remove: (replica, hashes) => {
      const set = byReplica.get(replica);
      if (!set) return;
      for (const h of hashes) set.delete(h);
    },
    drop: (replica) => void byReplica.delete(replica),
    cachedBlocks: (replica, hashes) => {
      const set = byReplica.get(replica);
      if (!set) return 0;
      let n = 0;
      while (n < hashes.length && set.has(hashes[n]!)) n++;
      return n;
    },
    size: (replica) => byReplica.get(replica)?.size ?? 0,
    replicas: () => [...byReplica.keys()].filter((r) => byReplica.get(r)!.size > 0),
  };
}
