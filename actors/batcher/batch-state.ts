// What one replica's continuous batcher holds between steps: the KV ledger, the waiting queues, the running set
// (ordered by class, then age, so the newest of the lowest class is last: the first to preempt), and counters.
import { createKvLedger, type KvLedger } from './kv-ledger.ts';
import { createSlotTable, type SlotTable } from './slots.ts';
import { ChurnMap } from '../../runtime/churn-map.ts';
import type { Sequence } from './sequence.ts';
import type { ContinuousLimits } from './types.ts';
import { createWaitingQueues, type WaitingQueues } from './waiting.ts';

/** The batcher's state, shared by its step planner, preemption, completion and invariant checks. */
export interface BatchState {
  readonly limits: ContinuousLimits;
  readonly ledger: KvLedger;
  /** The engine slots of the running sequences (slots.ts): one each, the lowest free one when scheduled. */
  readonly slots: SlotTable;
  readonly waiting: WaitingQueues;
  /** Running sequences, highest class and oldest first. */
  readonly running: Sequence[];
  /** Every sequence here, waiting or running. */
  readonly byId: ChurnMap<string, Sequence>;
  /** Victims preempted while planning the current step: they are not re-admitted in the same step. */
  readonly victims: Set<Sequence>;
  runCounter: number;
  preemptions: number;
  steps: number;
  /** Static batching: the members of the batch in progress (running or finished); 0 means a batch may form. */
  staticOpen: number;
}

/** Creates the empty state of a batcher with the given limits. */
export function createBatchState(limits: ContinuousLimits): BatchState {
  const ledger = createKvLedger(limits.blockTokens, limits.blocksTotal, limits.prefixCache === true);
  return {
    limits,
    ledger,
    slots: createSlotTable(limits.maxRunning),
    waiting: createWaitingQueues(ledger),
    running: [],
    byId: new ChurnMap(),
    victims: new Set(),
    runCounter: 0,
    preemptions: 0,
    steps: 0,
    staticOpen: 0,
  };
}

/** Adds s to the running set at its place by (priority, admission order), in `slot` (free) when given, else in the
 * lowest free slot. */
export function insertRunning(st: BatchState, s: Sequence, slot = -1): void {
  s.running = true;
  s.slot = slot >= 0 ? st.slots.take(slot) : st.slots.take();
  s.runOrder = ++st.runCounter;
  let i = st.running.length;
  while (i > 0 && st.running[i - 1]!.priority > s.priority) i--;
  st.running.splice(i, 0, s);
}

/** Takes s out of the running set and frees its slot (its blocks are the caller's to release). */
export function removeRunning(st: BatchState, s: Sequence): void {
  const i = st.running.indexOf(s);
  if (i >= 0) st.running.splice(i, 1);
  leaveSlot(st, s);
}

/** s no longer runs: its slot is free for the next sequence scheduled, and keeps s's cells (slot-prefix.ts). */
export function leaveSlot(st: BatchState, s: Sequence): void {
  s.running = false;
  if (s.slot >= 0) {
    st.slots.free(s.slot);
    st.ledger.slotPrefix?.leave(s.slot, s);
  }
  s.slot = -1;
}

/** Free blocks a new admission may use: the watermark is kept back while anything runs (vLLM's watermark). */
export function spareBlocks(st: BatchState): number {
  return st.ledger.free() - (st.running.length > 0 ? st.limits.watermarkBlocks : 0);
}
