// Collects what happened to every request and token, and turns it into the report's latency summaries.
import { createLogHistogram, summarize, type LogHistogram, type Summary } from './histogram.ts';
import type { OutcomeCode } from '../../machines/outcomes.ts';

/** What a finished request contributes to the report. */
export interface RequestRecord {
  id: string;
  model: string;
  priority: string;
  outcome: string;
  code: OutcomeCode | null;
  receivedAt: number;
  firstScheduledAt: number;
  firstTokenAt: number;
  finishedAt: number;
  tokens: number;
  budgetMs: number;
  resumes: number;
  preemptions: number;
  /** A model with a prefix cache: its prompt, and what its replica held of it cached when first scheduled. */
  promptTokens?: number;
  cachedTokens?: number;
}

/** Prefix reuse over the requests of models with a prefix cache that were scheduled. */
export interface PrefixReport {
  requests: number;
  promptTokens: number;
  /** Prompt tokens found cached (prefill saved). */
  cachedTokens: number;
  /** cachedTokens ÷ promptTokens. */
  hitRate: number;
}

/** Per-model latency summaries. */
export interface LatencyReport {
  ttftMs: Summary;
  tpotMs: Summary;
  tbtMs: Summary;
  e2eMs: Summary;
  queueWaitMs: Summary;
}

/** How far one kind of estimate (the router's predicted wait, the predicted step time) was from what happened. */
export interface EstimateError {
  count: number;
  meanPredictedMs: number;
  meanActualMs: number;
  /** Mean of actual - predicted: positive when the estimate was optimistic. */
  meanErrorMs: number;
  meanAbsErrorMs: number;
  /** |actual - predicted| percentiles. */
  absErrorMs: Summary;
}

/** The collector of one run. */
export interface Collector {
  record(r: RequestRecord): void;
  tbt(model: string, ms: number): void;
  /** `n` samples of the time between tokens `ms`: the same as `n` calls of tbt(model, ms). */
  tbtN(model: string, ms: number, n: number): void;
  outcomes(): Record<string, number>;
  latency(model?: string): LatencyReport;
  outputTokens(): number;
  readonly records: readonly RequestRecord[];
  /** Requests whose queue wait exceeded their budget (must be 0). */
  overBudget(): number;
  /** Records one estimate of `kind` against what was then measured. */
  estimate(kind: string, predictedMs: number, actualMs: number): void;
  /** Estimate error per kind, kinds in name order. */
  estimates(): Record<string, EstimateError>;
  /** Prefix reuse (null when no model keeps a prefix cache). */
  prefix(model?: string): PrefixReport | null;
}

/** Creates an empty collector. */
export function createCollector(): Collector {
  const records: RequestRecord[] = [];
  const tbts = new Map<string, LogHistogram>();
  const all = createLogHistogram();
  // Times between tokens come in runs of one value (a step's sequences that decoded in the step before): a run is
  // added when a different sample arrives or the histograms are read, so every histogram sees the same samples in
  // the same order as one add per token.
  let runModel = '';
  // The run's sample, in a typed array: assigning a double to a closure's variable allocates a number each time.
  const runMs = new Float64Array(1);
  let runN = 0;
  const endRun = (): void => {
    if (runN === 0) return;
    let h = tbts.get(runModel);
    if (!h) {
      h = createLogHistogram();
      tbts.set(runModel, h);
    }
    h.addN(runMs[0]!, runN);
    all.addN(runMs[0]!, runN);
    runN = 0;
  };
  /** Equal samples in a row (every sequence of a decode step after another) are kept as one run until one differs. */
  const tbtN = (model: string, ms: number, n: number): void => {
    if (n <= 0) return;
    if (runN > 0 && ms === runMs[0] && model === runModel) {
      runN += n;
      return;
    }
    endRun();
    runModel = model;
    runMs[0] = ms;
    runN = n;
  };

  let outTokens = 0;
  const errors = new Map<string, { n: number; predicted: number; actual: number; abs: number; hist: LogHistogram }>();
  const latency = (model?: string): LatencyReport => {
    endRun();
    const rs = model ? records.filter((r) => r.model === model) : records;
    const done = rs.filter((r) => r.outcome === 'done');
    return {
      ttftMs: summarize(done.map((r) => r.firstTokenAt - r.receivedAt)),
      tpotMs: summarize(done.filter((r) => r.tokens > 1).map((r) => (r.finishedAt - r.firstTokenAt) / (r.tokens - 1))),
      tbtMs: (model ? tbts.get(model) : all)?.summary() ?? summarize([]),
      e2eMs: summarize(done.map((r) => r.finishedAt - r.receivedAt)),
      queueWaitMs: summarize(rs.filter((r) => r.firstScheduledAt >= 0).map((r) => r.firstScheduledAt - r.receivedAt)),
    };
  };
  return {
    records,
    record: (r) => {
      records.push(r);
      if (r.outcome === 'done' || r.outcome === 'failed' || r.outcome === 'cancelled') outTokens += r.tokens;
    },
    tbt: (model, ms) => tbtN(model, ms, 1),
    tbtN,
    outcomes: () => {
      const out: Record<string, number> = {};
      for (const r of records) {
        const k = r.outcome === 'done' ? 'done' : (r.code ?? r.outcome);
        out[k] = (out[k] ?? 0) + 1;
      }
      return Object.fromEntries(Object.entries(out).sort(([a], [b]) => a.localeCompare(b)));
    },
    latency,
    prefix: (model) => {
      let requests = 0;
      let promptTokens = 0;
      let cachedTokens = 0;
      for (const r of records) {
        if (r.promptTokens === undefined || r.firstScheduledAt < 0 || (model && r.model !== model)) continue;
        requests++;
        promptTokens += r.promptTokens;
        cachedTokens += r.cachedTokens ?? 0;
      }
      if (requests === 0) return null;
      return { requests, promptTokens, cachedTokens, hitRate: promptTokens > 0 ? cachedTokens / promptTokens : 0 };
    },
    outputTokens: () => outTokens,
    estimate: (kind, predictedMs, actualMs) => {
      let e = errors.get(kind);
      if (!e) {
        e = { n: 0, predicted: 0, actual: 0, abs: 0, hist: createLogHistogram() };
        errors.set(kind, e);
      }
      e.n++;
      e.predicted += predictedMs;
      e.actual += actualMs;
      e.abs += Math.abs(actualMs - predictedMs);
      e.hist.add(Math.abs(actualMs - predictedMs));
    },
    estimates: () => {
      const r3 = (x: number): number => Math.round(x * 1000) / 1000;
      const out: Record<string, EstimateError> = {};
      for (const k of [...errors.keys()].sort()) {
        const e = errors.get(k)!;
        out[k] = {
          count: e.n,
          meanPredictedMs: r3(e.predicted / e.n),
          meanActualMs: r3(e.actual / e.n),
          meanErrorMs: r3((e.actual - e.predicted) / e.n),
          meanAbsErrorMs: r3(e.abs / e.n),
          absErrorMs: e.hist.summary(),
        };
      }
      return out;
    },
    overBudget: () =>
      records.filter((r) => r.firstScheduledAt >= 0 && r.firstScheduledAt - r.receivedAt > r.budgetMs + 1e-6).length,
  };
}
