// The paged KV-cache ledger of one replica: how many blocks are in use, and each sequence's share of them.
// Blocks are reserved when a sequence is scheduled, grown as it prefills and decodes, and released when it
// finishes, is preempted or withdrawn. A sequence's own blocks are `blocks`; the ledger's own count is their sum.
//
// With a prefix cache (prefix-cache.ts; `prefixCache` in the limits) a sequence's completed full blocks whose chain
// hashes it knows (`hashes`) move into the cache as it computes them: it still reads them (`cached`, counted once
// however many sequences read the same block), and when it leaves they stay, idle, for the next prompt that starts
// the same way. A scheduled sequence takes the cached blocks its prompt starts with and prefills only the rest. Idle
// blocks count as free: taking one evicts it (least recently used first), so the cache never holds up admission.
// `used` is what running sequences hold (their own blocks and the cached ones they read); `cachedIdle` is the rest.
//
// Sequences with token ids (a real engine's) reuse by slot instead (slot-prefix.ts, `slotPrefix` here, with the same
// `prefixCache` limit): the cells a sequence leaves in its slot serve the next sequence there, and cost the ledger
// nothing. The block cache never holds their blocks; `takeChanges` reports both (a replica's sequences all have
// token ids or none do, so one of the two is ever in use).
import { createPrefixCache, type PrefixCache } from './prefix-cache.ts';
import { createSlotPrefix, type SlotPrefix } from './slot-prefix.ts';
import type { Sequence } from './sequence.ts';

/** What a prefix cache changed since the last look: block hashes kept and evicted (the control plane's index). */
export interface CacheChanges {
  added: number[];
  evicted: number[];
  /** More changes happened than were kept: whoever mirrors the cache should forget what it knew and take `added`. */
  overflow: boolean;
}

/** Most changes kept between two looks. */
const MAX_CHANGES = 4096;

/** The changes of a ledger without a cache: always none (frozen: a reader never changes what it takes). */
const NO_CHANGES: CacheChanges = Object.freeze({
  added: Object.freeze([]) as unknown as number[],
  evicted: Object.freeze([]) as unknown as number[],
  overflow: false,
});

/** The block ledger. */
export interface KvLedger {
  readonly blockTokens: number;
  readonly blocksTotal: number;
  /** Blocks running sequences hold: their own and the cached ones they read. */
  readonly used: number;
  /** Cached blocks no running sequence reads (free space that costs an eviction); 0 without a prefix cache. */
  readonly cachedIdle: number;
  /** The prefixes free slots keep for sequences with token ids (slot-prefix.ts); null without a prefix cache. */
  readonly slotPrefix: SlotPrefix | null;
  /** Blocks needed to hold `tokens` tokens. */
  blocksFor(tokens: number): number;
  /** Blocks a sequence will hold at its expected final length. */
  finalBlocks(s: Sequence): number;
  /** Blocks a sequence may still take: never held, or held idle by the cache. */
  free(): number;
  /** The cached blocks a sequence would start with if scheduled now (none past `goal - 1` tokens: the last prompt
   * token is always computed), and how many of them are idle (taking them makes them in use). */
  peekCached(s: Sequence, goal: number): { blocks: number; idle: number };
  /** Takes those cached blocks for a newly scheduled sequence; returns the tokens they hold. */
  attach(s: Sequence, goal: number): number;
  /** Gives a newly scheduled sequence the blocks for `tokens` tokens in all, cached ones included (the caller has
   * checked they are free). */
  reserve(s: Sequence, tokens: number): void;
  /** Grows s's allocation to cover `tokens` cached tokens; false if the blocks are not free. */
  grow(s: Sequence, tokens: number): boolean;
  /** Moves s's completed full blocks into the prefix cache (it keeps reading them). */
  commit(s: Sequence): void;
  /** Returns all of s's blocks: its own freed, its cached ones left to the cache. */
  release(s: Sequence): void;
  /** The cache's changes since the last call, the slots' kept prefixes included (empty without a cache). */
  takeChanges(): CacheChanges;
  /** Forgets every cached block (the replica lost its memory); returns how many were dropped. */
  clearCache(): number;
  /** Throws if the count disagrees with the running sequences' allocations or a sequence outgrew its blocks. */
  check(running: readonly Sequence[]): void;
}

/** Creates an empty ledger of `blocksTotal` blocks of `blockTokens` tokens, with a prefix cache when asked. */
export function createKvLedger(blockTokens: number, blocksTotal: number, prefixCache = false): KvLedger {
  // Blocks the running sequences own (not in the cache).
  let own = 0;
  const cache: PrefixCache | null = prefixCache ? createPrefixCache() : null;
  const slotPrefix: SlotPrefix | null = prefixCache ? createSlotPrefix(blockTokens, MAX_CHANGES) : null;
  // Whether a sequence's blocks go to the block cache: a sequence with token ids reuses by slot instead.
  const blockCached = (s: Sequence): boolean => cache !== null && s.hashes !== undefined && s.tokens === undefined;
  // The cache's clock: the order of its uses is all its eviction needs.
  let tick = 0;
  let changes: CacheChanges = { added: [], evicted: [], overflow: false };
  const note = (list: number[], hashes: readonly number[]): void => {
    if (list.length + hashes.length > MAX_CHANGES) changes.overflow = true;
    else for (const h of hashes) list.push(h);
  };
  const blocksFor = (tokens: number): number => Math.ceil(tokens / blockTokens);
  const cachedAll = (): number => (cache ? cache.size() : 0);
  const idle = (): number => (cache ? cache.idle() : 0);
  const used = (): number => own + cachedAll() - idle();
  const free = (): number => blocksTotal - used();
  /** Evicts idle cached blocks until `n` blocks are physically free. */
  const makeRoom = (n: number): void => {
    const short = n - (blocksTotal - own - cachedAll());
    if (short > 0 && cache) note(changes.evicted, cache.evict(short));
  };
  const capped = (s: Sequence, goal: number): number =>
    Math.min(s.hashes!.length, Math.floor((goal - 1) / blockTokens));
  return {
    blockTokens,
    blocksTotal,
    get used() {
      return used();
    },
    get cachedIdle() {
      return idle();
    },
    slotPrefix,
    blocksFor,
    finalBlocks: (s) => blocksFor(s.promptTokens + Math.max(s.generated + 1, s.estOutputTokens)),
    free,
    peekCached: (s, goal) => {
      if (!cache || !blockCached(s) || goal <= 1) return { blocks: 0, idle: 0 };
      const hashes = s.hashes!.length > capped(s, goal) ? s.hashes!.slice(0, capped(s, goal)) : s.hashes!;
      const blocks = cache.match(hashes);
      return { blocks, idle: cache.idleAmong(hashes, blocks) };
    },
    attach: (s, goal) => {
      if (!cache || !blockCached(s) || goal <= 1) return 0;
      const n = Math.min(cache.match(s.hashes!), capped(s, goal));
      cache.acquire(s.hashes!, n, ++tick);
      s.cached = n;
      return n * blockTokens;
    },
    reserve: (s, tokens) => {
      const need = Math.max(0, blocksFor(tokens) - s.cached);
      makeRoom(need);
      own += need;
      s.blocks = need;
    },
    grow: (s, tokens) => {
      const need = blocksFor(tokens) - s.blocks - s.cached;
      if (need <= 0) return true;
      if (need > free()) return false;
      makeRoom(need);
      own += need;
      s.blocks += need;
      return true;
    },
    commit: (s) => {
      if (!cache || !blockCached(s)) return;
      const hashes = s.hashes!;
      const full = Math.min(Math.floor(s.computed / blockTokens), hashes.length);
      for (let i = s.cached; i < full && s.blocks > 0; i++) {
        if (cache.insert(hashes, i, i + 1, ++tick) > 0) note(changes.added, [hashes[i]!]);
        own--;
        s.blocks--;
        s.cached++;
      }
    },
    release: (s) => {
      if (cache && s.cached > 0) cache.release(s.hashes!, s.cached, ++tick);
      s.cached = 0;
      own -= s.blocks;
      s.blocks = 0;
    },
    takeChanges: () => {
      // Without a cache (most replicas) nothing ever changes: no new lists on every report.
      if (cache === null) return NO_CHANGES;
      const out = changes;
      changes = { added: [], evicted: [], overflow: false };
      const kept = slotPrefix?.takeChanges(out.overflow) ?? null;
      if (kept === null) return out;
      for (const h of kept.added) out.added.push(h);
      for (const h of kept.evicted) out.evicted.push(h);
      out.overflow ||= kept.overflow;
      return out;
    },
    clearCache: () => {
      if (!cache) return 0;
      const n = cache.size();
      cache.clear();
      slotPrefix!.clear();
      changes = { added: [], evicted: [], overflow: true };
      return n;
    },
    check: (running) => {
      let sum = 0;
      for (const s of running) {
        sum += s.blocks;
        if (s.computed > (s.blocks + s.cached) * blockTokens)
          throw new Error(`sequence ${s.id} caches ${s.computed} tokens in ${s.blocks} + ${s.cached} cached blocks`);
      }
      if (sum !== own) throw new Error(`ledger drift: blocks owned ${own}, sequences hold ${sum}`);
      if (own + cachedAll() > blocksTotal)
        throw new Error(`blocks in use ${own} and cached ${cachedAll()} exceed capacity ${blocksTotal}`);
      if (own < 0) throw new Error(`negative blocks in use ${own}`);
      slotPrefix?.check();
    },
  };
}
