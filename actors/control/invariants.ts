// The control plane's invariant checks (simulation): no request scheduled past its queue bound, and work conservation:
// no request waits while a compatible replica has room for it. Each step's ledger and members are checked by the
// replica's engine core itself (its `check` option), where the ledger lives.
import type { ReplicaHandle } from '../replica.ts';
import type { Live } from './types.ts';

/** Slack (ms) on top of a replica's longest step before a wait with room counts as a violation (P10). */
export const CONSERVATION_TOLERANCE_MS = 100;

/** The invariant checker of one control plane. */
export interface InvariantChecker {
  /** Violations seen, as readable lines. */
  readonly violations: string[];
  /** A request's first scheduling at `t`: its wait must be within its bound. */
  scheduled(l: Live, t: number): void;
}

/** Creates the checker; with `enabled` false it records nothing. */
export function createInvariantChecker(enabled: boolean): InvariantChecker {
  const violations: string[] = [];
  return {
    violations,
    scheduled: (l, t) => {
      // No request waits past its bound: checked as it is scheduled, not only in the final report.
      if (enabled && t - l.receivedAt > l.budgetMs + 1e-6)
        violations.push(
          `${l.id} at ${t} ms: scheduled after waiting ${t - l.receivedAt} ms, past its ${l.budgetMs} ms bound`,
        );
    },
  };
}

/**
 * The longest step replica `r` can take at the cost model's speed: a full token budget of prefill beside its most
 * running decodes, at the largest context its KV cache holds (ms).
 */
export function longestStepMs(r: ReplicaHandle): number {
  const lim = r.work.limits;
  const context = Math.min(lim.maxRunning * lim.maxContext, lim.blocksTotal * lim.blockTokens);
  const shape = {
    prefill: [{ tokens: lim.tokenBudget, cached: 0 }],
    decodeBatch: lim.maxRunning,
    decodeContext: context,
  };
  return r.cost.stepS(shape) * 1000;
}

/** True when `r` has a free slot and uncommitted KV for `tokens` more tokens. */
export function hasRoom(r: ReplicaHandle, tokens: number): boolean {
  const st = r.work.stats();
  const lim = r.work.limits;
  return (
    st.running + st.waiting < lim.maxRunning &&
    st.blocksTotal - st.committedBlocks >= Math.ceil(tokens / lim.blockTokens)
  );
}

/**
 * Work conservation (P10), sampled: a held request while an accepting replica of its model@version has room for
 * it, or a replica that is accepting, runs no step and has requests waiting. Either may last at most the replica's
 * longest step plus CONSERVATION_TOLERANCE_MS; `sample(now)` returns the waits that outlasted it (once each).
 */
export function createConservationMonitor(deps: { held(): Iterable<Live>; replicas(): Iterable<ReplicaHandle> }): {
  sample(now: number): string[];
} {
  const since = new Map<string, number>();
  const reported = new Set<string>();
  const bound = new Map<string, number>();
  const boundOf = (r: ReplicaHandle): number => {
    let b = bound.get(r.id);
    if (b === undefined) bound.set(r.id, (b = longestStepMs(r) + CONSERVATION_TOLERANCE_MS));
    return b;
  };
  return {
    sample: (now) => {
      const seen = new Set<string>();
      const out: string[] = [];
      const check = (key: string, limit: number, what: () => string): void => {
        seen.add(key);
        const s = since.get(key) ?? now;
        since.set(key, s);
        if (now - s > limit && !reported.has(key)) {
          reported.add(key);
          out.push(`${what()} for ${Math.round(now - s)} ms, over the bound of ${Math.round(limit)} ms`);
        }
      };
      const replicas = [...deps.replicas()].filter((r) => r.accepting());
      for (const l of deps.held()) {
        if (l.actor.getSnapshot().status !== 'active') continue;
        const need = l.spec.promptTokens + l.estOutputTokens;
        const r = replicas.find((x) => x.model === l.model && x.version === l.version && hasRoom(x, need));
        if (r) check(`held ${l.id}`, boundOf(r), () => `${l.id} held while ${r.id} had room for it`);
      }
      for (const r of replicas) {
        // The core's last report: no step in flight while sequences waited (it plans one whenever it can).
        const l = r.work.last();
        if (!l || l.inflightPredictedMs > 0 || l.waiting === 0) continue;
        check(`idle ${r.id}`, boundOf(r), () => `${r.id} ran no step with requests waiting in its queue`);
      }
      for (const k of since.keys()) if (!seen.has(k)) since.delete(k);
      for (const k of reported) if (!seen.has(k)) reported.delete(k);
      return out;
    },
  };
}
