// Preemption by recompute: the victim is the newest running sequence of the lowest class (the last of the running
// set). Its blocks are freed, it goes back to the head of its class queue, and when scheduled again it re-prefills
// its prompt plus the tokens it has already streamed. Two causes: a running sequence cannot grow (memory), or the
// queue head of a higher class cannot be admitted while a lower class runs (priority).
import { leaveSlot, spareBlocks, type BatchState } from './batch-state.ts';
import { prefillTarget, type Sequence } from './sequence.ts';

/** Preempts the newest running sequence of the lowest class; undefined when nothing runs. */
export function preemptOne(st: BatchState, now: number): Sequence | undefined {
  const victim = st.running[st.running.length - 1];
  if (!victim) return undefined;
  st.running.pop();
  leaveSlot(st, victim);
  // Its computed blocks stay cached (with a prefix cache): its recompute may find them.
  st.ledger.commit(victim);
  st.ledger.release(victim);
  victim.computed = 0;
  st.preemptions++;
  st.victims.add(victim);
  st.waiting.push(victim, true);
  victim.listener.preempted(victim, now);
  return victim;
}

/** True when the queue head cannot be admitted now for want of a slot or blocks (chunked admits any chunk that fits). */
export function headBlocked(st: BatchState, head: Sequence): boolean {
  if (st.running.length >= st.limits.maxRunning) return true;
  const spare = spareBlocks(st);
  return st.limits.policy === 'chunked' ? spare < 1 : st.ledger.blocksFor(prefillTarget(head)) > spare;
}

/** Preempts lower-class running sequences while the queue head of a higher class cannot be admitted. */
export function preemptForPriority(st: BatchState, now: number): void {
  for (;;) {
    const head = st.waiting.peek();
    const last = st.running[st.running.length - 1];
    if (!head || !last || last.priority <= head.priority || st.victims.has(head)) return;
    if (!headBlocked(st, head)) return;
    preemptOne(st, now);
  }
}

/** The error for a sequence that cannot fit in the whole cache even alone. */
export function tooLarge(st: BatchState, s: Sequence): Error {
  return new Error(`sequence ${s.id} needs more KV blocks than the replica has (${st.limits.blocksTotal})`);
}
