// Prefix reuse by slot, for a real engine whose sequences each have a cache stream of their own (llama.cpp with
// kv_unified = false: a slot's cells are its sequence's alone). A sequence that leaves its slot (finished, preempted,
// withdrawn) leaves its cells there; the batcher remembers their token ids. A sequence scheduled later takes the
// free slot whose kept cells start as its prompt does (prompt and, for a resumed one, the tokens it already has),
// starts with those tokens computed and prefills only the rest; the engine keeps those cells, erases the others and
// checks the kept token ids itself (llama-engine.ts), so a wrong guess here costs a recompute, never wrong text.
//
// How this differs from the block cache (prefix-cache.ts, which the cost model's replicas use):
// - Nothing is shared: a kept prefix serves one sequence, the one that takes its slot; a prefix a running sequence
//   holds serves nobody else. The block cache lets any number of running sequences read one cached block.
// - At most one prefix per free slot is kept (slots − running of them), not as many as free blocks hold.
// - Reuse is by token, not by block: a turn that extends the previous turn's prompt and answer reuses all of it.
// - Kept cells cost the ledger nothing: each slot's stream is fixed, so they are free space that whoever takes the
//   slot overwrites. Eviction is that overwrite, so a kept prefix never holds up an admission.
// A simulation of a llama.cpp model runs the cost model and so the block cache: its reuse is an upper bound of what
// the engine reuses slot by slot.
//
// Which free slot a sequence takes: the one whose kept cells share the longest prefix with its tokens, when that is
// at least one block long (the prefill saved outweighs a pass the slot may add to each decode step until the run of
// slots in use closes up). Among slots that match as long (none, or the same shared system prompt), one that loses
// nothing (empty, or keeping no more than the match), else the least recently used prefix (LRU eviction), and only
// then the one adding the fewest passes (a hole between two slots in use closes a gap, one beside a slot in use adds
// none), else the lowest. Passes come last because a hole is mostly a slot whose sequence just finished: filling it
// first overwrote the prefix a conversation's next turn, a think time later, was about to reuse (measured live: a
// third of later turns routed to the right replica found their prefix gone), while a pass costs under a millisecond a
// decode step and a lost prefix its whole prefill. The lowest free slot alone (slots.ts without reuse) would
// likewise overwrite the most recently finished prefix first.
//
// What the control plane's prefix index hears (KvLedger.takeChanges): the chain hashes (block-hash.ts) of the full
// blocks of the token ids each slot's cells hold, counted per slot: a hash is added when the first slot keeps it and
// evicted when the last slot holding it drops it, reported as the net change since the last look. A slot taken by a
// sequence keeps the blocks of the prefix it reused while that sequence runs, and learns the rest when it leaves.
import { tokenBlockHashes } from './block-hash.ts';
import type { CacheChanges } from './kv-ledger.ts';
import type { Sequence, SequenceTokens } from './sequence.ts';
import type { SlotTable } from './slots.ts';

/** A slot a sequence takes, and how many of its first tokens that slot's cells already hold. */
export interface SlotPick {
  slot: number;
  tokens: number;
}

/** The prefixes the free slots of one batcher keep. */
export interface SlotPrefix {
  /** The free slot a sequence with token ids should take, and the tokens it reuses there (at most `goal - 1`: the
   * last prompt token is always computed, for its logits). Some slot must be free. */
  pick(s: Sequence, goal: number, slots: SlotTable): SlotPick;
  /** A sequence was scheduled in `slot` reusing its first `tokens` tokens: the slot drops the rest of its prefix. */
  take(slot: number, tokens: number): void;
  /** A sequence left `slot`: its computed tokens stay in the slot's cells (nothing for a sequence without token ids). */
  leave(slot: number, s: Sequence): void;
  /** The token ids a free slot's cells hold, as far as the batcher knows (null: none known, or a sequence runs). */
  kept(slot: number): readonly number[] | null;
  /** Net changes of the hashes kept since the last call (null: none); `full`: every hash kept now, as after an
   * overflow. */
  takeChanges(full: boolean): CacheChanges | null;
  /** Forgets every slot's prefix (the replica lost its memory). */
  clear(): void;
  /** Throws if the per-hash counts disagree with the slots' hashes. */
  check(): void;
}

interface Kept {
  /** Token ids its cells hold; null while a sequence runs in it (known again when it leaves). */
  tokens: readonly number[] | null;
  /** Chain hashes of the full blocks among them (while a sequence runs: of the prefix it reused). */
  hashes: readonly number[];
  /** The clock of its last use (taken or left), for LRU. */
  used: number;
}

/** Tokens `kept` and a sequence's token ids (prompt, then what it generated) share from the start, at most `limit`. */
function common(kept: readonly number[], t: SequenceTokens, limit: number): number {
  const n = Math.min(kept.length, limit);
  const p = t.prompt;
  const inPrompt = Math.min(n, p.length);
  let i = 0;
  while (i < inPrompt && kept[i] === p[i]) i++;
  if (i < inPrompt) return i;
  const out = t.out;
  while (i < n && kept[i] === out[i - p.length]) i++;
  return i;
}

/** The first `n` token ids of a sequence (prompt, then what it generated). */
function firstTokens(t: SequenceTokens, n: number): number[] {
  const p = t.prompt;
  if (n <= p.length) return p.slice(0, n);
  return p.concat(t.out.slice(0, n - p.length));
}

/** Creates the slot prefixes of a batcher whose blocks hold `blockTokens` tokens; at most `maxChanges` changes are
 * told apart between two looks (past it, the next look is a full one). */
export function createSlotPrefix(blockTokens: number, maxChanges: number): SlotPrefix {
  const slots: (Kept | undefined)[] = [];
  // Slots keeping each hash; and, for each hash whose presence changed since the last look, whether it was present.
  const refs = new Map<number, number>();
  const since = new Map<number, boolean>();
  let overflow = false;
  let tick = 0;
  const touched = (h: number, was: boolean): void => {
    if (overflow || since.has(h)) return;
    if (since.size >= maxChanges) {
      overflow = true;
      since.clear();
    } else since.set(h, was);
  };
  const hold = (h: number): void => {
    const n = refs.get(h) ?? 0;
    if (n === 0) touched(h, false);
    refs.set(h, n + 1);
  };
  const drop = (h: number): void => {
    const n = refs.get(h) ?? 0;
    if (n > 1) return void refs.set(h, n - 1);
    touched(h, true);
    refs.delete(h);
  };
  return {
    pick: (s, goal, table) => {
      const t = s.tokens!;
      let best = -1;
      let bestLen = 0;
      let bestMatch = 0;
      let bestRuns = 2;
      let bestAge = 0;
      for (let slot = 0; slot < table.size; slot++) {
        if (table.has(slot)) continue;
        const k = slots[slot];
        const len = k?.tokens ? common(k.tokens, t, goal - 1) : 0;
        const match = len >= blockTokens ? len : 0;
        const runs =
          1 - (slot > 0 && table.has(slot - 1) ? 1 : 0) - (slot + 1 < table.size && table.has(slot + 1) ? 1 : 0);
        // A slot that loses nothing (empty, or keeping no more than what matches) counts as the oldest.
        const age = k?.tokens && k.tokens.length > match ? k.used : 0;
        const better =
          best < 0 ||
          match > bestMatch ||
          (match === bestMatch && (age < bestAge || (age === bestAge && runs < bestRuns)));
        if (!better) continue;
        best = slot;
        bestLen = len;
        bestMatch = match;
        bestRuns = runs;
        bestAge = age;
      }
      if (best < 0) throw new Error(`no free slot among ${table.size}`);
      return { slot: best, tokens: bestLen };
    },
    take: (slot, tokens) => {
      const k = slots[slot];
      if (!k) {
        slots[slot] = { tokens: null, hashes: [], used: ++tick };
        return;
      }
      const blocks = Math.floor(tokens / blockTokens);
      if (blocks < k.hashes.length) {
        for (let i = blocks; i < k.hashes.length; i++) drop(k.hashes[i]!);
        k.hashes = k.hashes.slice(0, blocks);
      }
      k.tokens = null;
      k.used = ++tick;
    },
    leave: (slot, s) => {
      const t = s.tokens;
      if (t === undefined) return;
      const tokens = firstTokens(t, Math.min(s.computed, t.prompt.length + t.out.length));
      const hashes = tokenBlockHashes(tokens, blockTokens);
      // The new hashes are held before the old ones are dropped: a block kept across the change is no change.
      for (const h of hashes) hold(h);
      const k = slots[slot];
      if (k) for (const h of k.hashes) drop(h);
      slots[slot] = { tokens, hashes, used: ++tick };
    },
    kept: (slot) => slots[slot]?.tokens ?? null,
    takeChanges: (full) => {
      if (full || overflow) {
        overflow = false;
        since.clear();
        return { added: [...refs.keys()].slice(0, maxChanges), evicted: [], overflow: true };
      }
      if (since.size === 0) return null;
      const added: number[] = [];
      const evicted: number[] = [];
      for (const [h, was] of since) {
        const now = refs.has(h);
        if (now && !was) added.push(h);
        else if (!now && was) evicted.push(h);
      }
      since.clear();
      return { added, evicted, overflow: false };
    },
    clear: () => {
      slots.length = 0;
      refs.clear();
      since.clear();
      overflow = false;
    },
    check: () => {
      const count = new Map<number, number>();
      for (const k of slots) for (const h of k?.hashes ?? []) count.set(h, (count.get(h) ?? 0) + 1);
      if (count.size !== refs.size) throw new Error(`slots keep ${count.size} hashes, ${refs.size} are counted`);
      for (const [h, n] of count)
        if (refs.get(h) !== n) throw new Error(`hash ${h} is kept by ${n} slots, counted ${refs.get(h) ?? 0}`);
    },
  };
}
