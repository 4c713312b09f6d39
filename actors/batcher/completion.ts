// Completion of a step every rank ran: prefill chunks advance the cache, a finished prefill or a decode produces
// one token, and a sequence that reached its output length (or that a real engine ended) leaves and frees its blocks.
import { removeRunning, type BatchState } from './batch-state.ts';
import type { Sequence } from './sequence.ts';
import type { StepPlan } from './types.ts';

function finish(st: BatchState, s: Sequence, now: number): void {
  removeRunning(st, s);
  st.ledger.release(s);
  st.byId.delete(s.id);
  s.listener.finished(s, now);
}

/** Applies a completed step: produces tokens, frees finished sequences; withdrawn or preempted ones are skipped. */
export function completeStep(st: BatchState, p: StepPlan, now: number): void {
  for (const e of p.entries) {
    const s = e.seq;
    if (s.gone || !s.running) continue;
    if (e.chunk > 0) {
      s.computed += e.chunk;
      if (s.computed < s.prefillGoal) continue;
    } else {
      s.computed += 1;
    }
    s.generated++;
    s.listener.tokens(s, 1, now);
    s.lastTokenAt = now;
    // A real engine may end a sequence early (its end token or a stop string); the cost model stops at outputTokens.
    if (s.generated >= s.outputTokens || (s.tokens !== undefined && s.tokens.finish !== null)) finish(st, s, now);
  }
}
