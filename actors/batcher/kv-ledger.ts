// The paged KV-cache ledger of one replica: how many blocks are in use, and each sequence's share of them.
// Blocks are reserved when a sequence is scheduled, grown as it prefills and decodes, and released when it
// finishes, is preempted or withdrawn. The ledger's count is always the sum of the running sequences' blocks.
import type { Sequence } from './sequence.ts';

/** The block ledger; `used` is the sum of every resident sequence's `blocks`. */
export interface KvLedger {
  readonly blockTokens: number;
  readonly blocksTotal: number;
  readonly used: number;
  /** Blocks needed to hold `tokens` tokens. */
  blocksFor(tokens: number): number;
  /** Blocks a sequence will hold at its expected final length. */
  finalBlocks(s: Sequence): number;
  free(): number;
  /** Gives a newly scheduled sequence the blocks for `tokens` (the caller has checked they are free). */
  reserve(s: Sequence, tokens: number): void;
  /** Grows s's allocation to cover `tokens` cached tokens; false if the blocks are not free. */
  grow(s: Sequence, tokens: number): boolean;
  /** Returns all of s's blocks. */
  release(s: Sequence): void;
  /** Throws if the count disagrees with the running sequences' allocations or a sequence outgrew its blocks. */
  check(running: readonly Sequence[]): void;
}

/** Creates an empty ledger of `blocksTotal` blocks of `blockTokens` tokens. */
export function createKvLedger(blockTokens: number, blocksTotal: number): KvLedger {
  let used = 0;
  const blocksFor = (tokens: number): number => Math.ceil(tokens / blockTokens);
  const free = (): number => blocksTotal - used;
  return {
    blockTokens,
    blocksTotal,
    get used() {
      return used;
    },
    blocksFor,
    finalBlocks: (s) => blocksFor(s.promptTokens + Math.max(s.generated + 1, s.estOutputTokens)),
    free,
    reserve: (s, tokens) => {
      const need = blocksFor(tokens);
      used += need;
      s.blocks = need;
    },
    grow: (s, tokens) => {
      const need = blocksFor(tokens) - s.blocks;
      if (need <= 0) return true;
      if (need > free()) return false;
      used += need;
      s.blocks += need;
      return true;
    },
    release: (s) => {
      used -= s.blocks;
      s.blocks = 0;
    },
    check: (running) => {
      let sum = 0;
      for (const s of running) {
        sum += s.blocks;
        if (s.computed > s.blocks * blockTokens)
          throw new Error(`sequence ${s.id} caches ${s.computed} tokens in ${s.blocks} blocks`);
      }
      if (sum !== used) throw new Error(`ledger drift: blocks used ${used}, sequences hold ${sum}`);
      if (used > blocksTotal) throw new Error(`blocks in use ${used} exceed capacity ${blocksTotal}`);
      if (used < 0) throw new Error(`negative blocks in use ${used}`);
    },
  };
}
