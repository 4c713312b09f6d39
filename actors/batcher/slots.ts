// Engine slots and the passes a step takes over them.
//
// A llama.cpp context with one cache stream per sequence (node-llama-cpp's kv_unified = false) splits a batch into
// micro-batches (`llama_batch_allocr::split_equal(n_ubatch, sequential = true)` in llama.cpp's src/llama-batch.cpp):
// a micro-batch starts at the first token not yet taken and takes further sequences only while their ids rise by
// exactly one in batch order; it then takes the same number of tokens from each of its sequences (as many as the
// shortest has left). Each micro-batch reads all the weights once: it is a pass. Queued in ascending slot order, a
// step of single-token decodes takes one pass per run of consecutive slots; a prefill chunk's tokens past the
// shortest item of its run take further passes.
//
// The batcher gives each running sequence a slot (the engine's sequence id), the lowest free one when it is
// scheduled: it fills a hole left by a finished or preempted sequence first, else extends the run of slots in use.
// Slots are freed when a sequence leaves (finish, preemption, withdrawal). The engine queues a step's items in
// ascending slot order, so the step's passes are what `passes()` computes from the plan here, and the cost model
// prices them (StepShape.passes). Sequences are not moved between slots: a hole stays until an admission fills it.
// With prefix reuse by slot (slot-prefix.ts) a sequence may be given a particular free slot instead: the one whose
// kept cells start as its prompt does, else one that adds no pass.

/** The free slots of one batcher: slots 0 … size-1, the lowest free one handed out first. */
export interface SlotTable {
  readonly size: number;
  /** Slots in use. */
  readonly used: number;
  /** Takes `slot` when given (it must be free), else the lowest free slot; throws when it is not free or none is
   * (the batcher never runs more sequences than slots). */
  take(slot?: number): number;
  /** Frees a slot taken before; throws on a slot that is not in use. */
  free(slot: number): void;
  /** Whether a slot is in use. */
  has(slot: number): boolean;
}

/** Creates a table of `size` free slots. */
export function createSlotTable(size: number): SlotTable {
  // A bitmap of slots in use and the lowest slot that may be free (every slot below it is in use).
  const inUse = new Uint8Array(size);
  let used = 0;
  let low = 0;
  return {
    size,
    get used() {
      return used;
    },
    take: (slot) => {
      if (slot !== undefined) {
        if (!(slot >= 0 && slot < size) || inUse[slot] === 1) throw new Error(`slot ${slot} is not free`);
        inUse[slot] = 1;
        used++;
        return slot;
      }
      while (low < size && inUse[low] === 1) low++;
      if (low >= size) throw new Error(`no free slot among ${size}`);
      inUse[low] = 1;
      used++;
      return low++;
    },
    free: (slot) => {
      if (!(slot >= 0 && slot < size) || inUse[slot] !== 1) throw new Error(`slot ${slot} is not in use`);
      inUse[slot] = 0;
      used--;
      if (slot < low) low = slot;
    },
    has: (slot) => slot >= 0 && slot < size && inUse[slot] === 1,
  };
}

/** Scratch of passes(): (slot, tokens) pairs packed as slot · 2^21 + tokens, sorted as numbers. */
let scratch = new Float64Array(64);
const TOKEN_BITS = 2 ** 21;

/**
 * Passes (llama.cpp micro-batches) of a step whose item i holds `tokens[i]` tokens of the sequence in `slots[i]`,
 * queued in ascending slot order; `n` items. Tokens per item must be below 2^21 (a step is far smaller).
 */
export function passes(slots: ArrayLike<number>, tokens: ArrayLike<number>, n: number): number {
  if (n <= 0) return 0;
  if (scratch.length < n) scratch = new Float64Array(Math.max(n, scratch.length * 2));
  let allOne = true;
  for (let i = 0; i < n; i++) {
    const t = tokens[i]!;
    if (t !== 1) allOne = false;
    scratch[i] = slots[i]! * TOKEN_BITS + t;
  }
  const v = scratch.subarray(0, n).sort();
  if (allOne) {
    // Single-token items: one pass per run of consecutive slots.
    let runs = 1;
    for (let i = 1; i < n; i++) if (Math.floor(v[i]! / TOKEN_BITS) !== Math.floor(v[i - 1]! / TOKEN_BITS) + 1) runs++;
    return runs;
  }
  return splitEqual(v, n);
}

/** The slot of packed item `i` (module-level, not a closure per call: steps call this on every pass). */
function slotOf(v: Float64Array, i: number): number {
  return Math.floor(v[i]! / TOKEN_BITS);
}

/** The tokens left of packed item `i`. */
function leftOf(v: Float64Array, i: number): number {
  return v[i]! - slotOf(v, i) * TOKEN_BITS;
}

/** split_equal over `n` packed (slot, tokens) pairs in ascending slot order, counting micro-batches; consumes them. */
function splitEqual(v: Float64Array, n: number): number {
  let count = 0;
  let first = 0;
  for (;;) {
    while (first < n && leftOf(v, first) === 0) first++;
    if (first >= n) return count;
    // The micro-batch: the first item with tokens left, then each next one whose slot is one above the last taken.
    let take = leftOf(v, first);
    let last = slotOf(v, first);
    for (let i = first + 1; i < n; i++) {
      if (leftOf(v, i) === 0) continue;
      if (slotOf(v, i) !== last + 1) break;
      last = slotOf(v, i);
      take = Math.min(take, leftOf(v, i));
    }
    last = slotOf(v, first);
    v[first] = v[first]! - take;
    for (let i = first + 1; i < n; i++) {
      if (leftOf(v, i) === 0) continue;
      if (slotOf(v, i) !== last + 1) break;
      last = slotOf(v, i);
      v[i] = v[i]! - take;
    }
    count++;
  }
}

/** The passes of items with these token counts in consecutive slots, in ascending order of tokens: one per distinct
 * count. What a shape without slots (an estimate) is priced at. */
export function fewestPasses(tokens: ArrayLike<number>, n: number): number {
  const seen = new Set<number>();
  for (let i = 0; i < n; i++) if (tokens[i]! > 0) seen.add(tokens[i]!);
  return seen.size;
}
