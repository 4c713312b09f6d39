// The collector of a serving control plane: the same estimates and token-gap histograms as the simulator's, but only
// the most recent request records are kept (a long-running server cannot keep every record; /metrics has the totals).
import { createCollector, type Collector, type RequestRecord } from '../actors/metrics/collector.ts';

/** Creates a collector that keeps the last `keep` records and running totals of outcomes and output tokens. */
export function createBoundedCollector(keep = 10_000): Collector {
  const inner = createCollector();
  const ring: RequestRecord[] = [];
  let next = 0;
  let outTokens = 0;
  let overBudget = 0;
  const outcomes = new Map<string, number>();
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
    },
    outcomes: () => Object.fromEntries([...outcomes].sort(([a], [b]) => a.localeCompare(b))),
    outputTokens: () => outTokens,
    overBudget: () => overBudget,
    // Latency summaries cover the records kept; tbt and estimates come from the inner collector's histograms.
    latency: (model) => {
      const view = createCollector();
      for (const r of ring) view.record(r);
      const l = view.latency(model);
      return { ...l, tbtMs: inner.latency(model).tbtMs };
    },
  };
}
