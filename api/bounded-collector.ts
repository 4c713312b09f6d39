// The collector of a serving control plane: the same estimates and token-gap histograms as the simulator's, but only
// the most recent request records are kept (a long-running server cannot keep every record; /metrics has the totals).
import { createCollector, type Collector, type PrefixReport, type RequestRecord } from '../actors/metrics/collector.ts';

/** Creates a collector that keeps the last `keep` records and running totals of outcomes, output tokens and prefix
 * reuse (per model). */
export function createBoundedCollector(keep = 10_000): Collector {
  const inner = createCollector();
  const ring: RequestRecord[] = [];
  let next = 0;
  let outTokens = 0;
  let overBudget = 0;
  const outcomes = new Map<string, number>();
  // Prefix reuse of scheduled requests of models with a prefix cache, by model (configured names only reach here).
  const prefix = new Map<string, PrefixReport>();
  return {
    ...inner,
    get records() {
      return next <= ring.length ? ring : [...ring.slice(next % keep), ...ring.slice(0, next % keep)];
    },
    record: (r) => {
      if (ring.length < keep) ring.push(r);
      else ring[next % keep] = r;
      next++;
      if (r.outcome === 'done' || r.outcome === 'failed' || r.outcome === 'cancelled') outTokens += r.tokens;
      if (r.firstScheduledAt >= 0 && r.firstScheduledAt - r.receivedAt > r.budgetMs + 1e-6) overBudget++;
      const k = r.outcome === 'done' ? 'done' : (r.code ?? r.outcome);
      outcomes.set(k, (outcomes.get(k) ?? 0) + 1);
      if (r.promptTokens !== undefined && r.firstScheduledAt >= 0) {
        let p = prefix.get(r.model);
        if (!p) prefix.set(r.model, (p = { requests: 0, promptTokens: 0, cachedTokens: 0, hitRate: 0 }));
        p.requests++;
        p.promptTokens += r.promptTokens;
        p.cachedTokens += r.cachedTokens ?? 0;
        p.hitRate = p.promptTokens > 0 ? p.cachedTokens / p.promptTokens : 0;
      }
    },
    outcomes: () => Object.fromEntries([...outcomes].sort(([a], [b]) => a.localeCompare(b))),
    outputTokens: () => outTokens,
    overBudget: () => overBudget,
    prefix: (model) => {
      if (model) {
        const p = prefix.get(model);
        return p ? { ...p } : null;
      }
      if (prefix.size === 0) return null;
      const sum = { requests: 0, promptTokens: 0, cachedTokens: 0, hitRate: 0 };
      for (const p of prefix.values()) {
        sum.requests += p.requests;
        sum.promptTokens += p.promptTokens;
        sum.cachedTokens += p.cachedTokens;
      }
      sum.hitRate = sum.promptTokens > 0 ? sum.cachedTokens / sum.promptTokens : 0;
      return sum;
    },
    // Latency summaries cover the records kept; tbt and estimates come from the inner collector's histograms.
    latency: (model) => {
      const view = createCollector();
      for (const r of ring) view.record(r);
      const l = view.latency(model);
      return { ...l, tbtMs: inner.latency(model).tbtMs };
    },
  };
}
