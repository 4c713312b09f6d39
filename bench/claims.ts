// The claims `npm run bench` checks: each a target and where its figure sits in a benchmark's closing JSON line.
// The report (bench/report.ts) opens docs/BENCHMARKS.md with one row per claim holding this run's figure, so the page
// carries one current figure per claim beside the full output it came from.

/** A benchmark's closing JSON line. */
export type Figures = Record<string, unknown>;

/** One claim: what is claimed, its target, the benchmark that measures it and how to read and judge its figure. */
export interface Claim {
  claim: string;
  target: string;
  bench: string;
  /** The figure as shown, or undefined when the run did not produce it. */
  shown: (f: Figures) => string | undefined;
  /** Whether the figure meets the target; undefined when there is no figure. */
  met: (f: Figures) => boolean | undefined;
}

/** The value at a dotted path (`conv.roundRobinOverCostP99`), when it is a finite number. */
export function num(f: Figures, path: string): number | undefined {
  let v: unknown = f;
  for (const k of path.split('.')) {
    if (v === null || typeof v !== 'object' || !Object.prototype.hasOwnProperty.call(v, k)) return undefined;
    v = (v as Record<string, unknown>)[k];
  }
  return typeof v === 'number' && Number.isFinite(v) ? v : undefined;
}

const fixed =
  (d: number, suffix = '') =>
  (x: number | undefined) =>
    x === undefined ? undefined : `${x.toFixed(d)}${suffix}`;
const int = (x: number | undefined): string | undefined =>
  x === undefined ? undefined : Math.round(x).toLocaleString('en-US');

/** A claim on one number: shown with `show`, met when `ok` holds. */
function one(
  claim: string,
  target: string,
  bench: string,
  path: string,
  show: (x: number | undefined) => string | undefined,
  ok: (x: number) => boolean,
): Claim {
  return {
    claim,
    target,
    bench,
    shown: (f) => show(num(f, path)),
    met: (f) => {
      const x = num(f, path);
      return x === undefined ? undefined : ok(x);
    },
  };
}

/** A claim on several numbers shown together, met when every one holds. */
function all(
  claim: string,
  target: string,
  bench: string,
  parts: { path: string; show: (x: number | undefined) => string | undefined; ok: (x: number) => boolean }[],
  sep = ' / ',
): Claim {
  return {
    claim,
    target,
    bench,
    shown: (f) => {
      const xs = parts.map((p) => p.show(num(f, p.path)));
      return xs.every((x) => x === undefined) ? undefined : xs.map((x) => x ?? '–').join(sep);
    },
    met: (f) => {
      const xs = parts.map((p) => num(f, p.path));
      if (xs.some((x) => x === undefined)) return undefined;
      return parts.every((p, i) => p.ok(xs[i]!));
    },
  };
}

/** A prefix hit rate against the oracle's (`hit` ÷ `oracle` ≥ 0.8), shown with both rates. */
function hitRateClaim(claim: string, hit: string, oracle: string): Claim {
  const rates = (f: Figures): [number, number] | undefined => {
    const [h, o] = [num(f, hit), num(f, oracle)];
    return h === undefined || !o ? undefined : [h, o];
  };
  return {
    claim,
    target: '≥ 0.8×',
    bench: 'prefix',
    shown: (f) => {
      const r = rates(f);
      return r && `${(r[0] / r[1]).toFixed(2)}× (${(r[0] * 100).toFixed(1)} % vs ${(r[1] * 100).toFixed(1)} %)`;
    },
    met: (f) => {
      const r = rates(f);
      return r && r[0] / r[1] >= 0.8;
    },
  };
}

const zero = { show: int, ok: (x: number) => x === 0 };
const within = (lo: number, hi: number) => (x: number) => x >= lo && x <= hi;
const ratio = fixed(3);

export const CLAIMS: Claim[] = [
  one(
    'simulated requests per wall second, splitwise_conv, one replica',
    '≥ 20,000',
    'sim',
    'simRequestsPerWallS',
    int,
    (x) => x >= 20_000,
  ),
  one('the same on eight replicas', '≥ 5,000', 'sim', 'simRequestsPerWallS8Replicas', int, (x) => x >= 5_000),
  one(
    '`cost` vs `round-robin` p99 TTFT at 80 % load, splitwise_code',
    '≥ 2×',
    'routing',
    'roundRobinOverCostP99',
    fixed(2, '×'),
    (x) => x >= 2,
  ),
  one('the same on splitwise_conv', '≥ 2×', 'routing', 'conv.roundRobinOverCostP99', fixed(2, '×'), (x) => x >= 2),
  all(
    'overload at 3×: admitted over budget / without one outcome / refused without retryAfter',
    '0 / 0 / 0',
    'routing',
    [
      { path: 'overload.admittedOverBudget', ...zero },
      { path: 'overload.withoutOneOutcome', ...zero },
      { path: 'overload.rejectedWithoutRetryAfter', ...zero },
    ],
  ),
  one(
    'continuous vs static throughput at equal p99 TTFT',
    '≥ 3×',
    'batching',
    'throughputRatioContinuousVsStatic',
    fixed(2, '×'),
    (x) => x >= 3,
  ),
  one(
    'chunked vs prefill-first capacity under TTFT p90 ≤ 2 s, TBT p99 ≤ 100 ms',
    '≥ 2×',
    'batching',
    'capacityRatioChunkedVsPrefillFirst',
    fixed(2, '×'),
    (x) => x >= 2,
  ),
  {
    claim: 'large-model worst wait, reserved vs naive switching',
    target: '≤ the bound',
    bench: 'placement',
    shown: (f) => {
      const [r, n, b] = ['largeMaxWaitS.reserved', 'largeMaxWaitS.naive', 'largeWaitBoundS'].map((p) => num(f, p));
      return r === undefined
        ? undefined
        : `${r.toFixed(1)} s vs ${n?.toFixed(1) ?? '–'} s (bound ${b?.toFixed(1) ?? '–'} s)`;
    },
    met: (f) => {
      const r = num(f, 'largeMaxWaitS.reserved');
      const b = num(f, 'largeWaitBoundS');
      return r === undefined || b === undefined ? undefined : r <= b;
    },
  },
  one(
    'live: streamed tokens/s vs a bare ws+msgpack relay',
    '≥ 0.8×',
    'live',
    'relayRatio',
    fixed(2, '×'),
    (x) => x >= 0.8,
  ),
  one(
    'live: completed SSE streams/s vs a bare `node:http` server',
    '≥ 0.8×',
    'live',
    'httpRatio',
    fixed(3, '×'),
    (x) => x >= 0.8,
  ),
  one(
    'live: p99 added TTFT (median of interleaved rounds)',
    '≤ 5 ms',
    'live',
    'p99AddedTtftMs',
    fixed(2, ' ms'),
    (x) => x <= 5,
  ),
  all('live overload at 3×: shed p99 / lost / duplicated / recovery', '≤ 10 ms / 0 / 0 / ≤ 5 s', 'overload', [
    { path: 'shedP99Ms', show: fixed(2, ' ms'), ok: (x) => x <= 10 },
    { path: 'lost', ...zero },
    { path: 'duplicated', ...zero },
    { path: 'recoveryS', show: fixed(1, ' s'), ok: within(0, 5) },
  ]),
  one(
    'llama.cpp served: throughput vs the engine alone',
    '≥ 0.95×',
    'engine',
    'throughputRatio',
    fixed(3, '×'),
    (x) => x >= 0.95,
  ),
  one(
    'llama.cpp served: throughput vs the engine core in process',
    '≥ 0.98×',
    'engine',
    'servedVsInProcess',
    fixed(3, '×'),
    (x) => x >= 0.98,
  ),
  one(
    'llama.cpp served: engine idle while work is runnable, share of wall time',
    '≤ 3 %',
    'engine',
    'engineIdleShare',
    (x) => (x === undefined ? undefined : `${(x * 100).toFixed(1)} %`),
    (x) => x <= 0.03,
  ),
  one(
    'llama.cpp served: CPU outside llama.cpp ÷ llama.cpp’s, minus the engine alone’s',
    '≤ 0.02',
    'engine',
    'overheadOverAlone',
    fixed(3),
    (x) => x <= 0.02,
  ),
  one(
    'decode batching: passes per decode step at 8 sequences',
    '1',
    'engine',
    'passesPerDecodeStep8',
    fixed(2),
    (x) => x <= 1,
  ),
  one(
    'decode batching: one step of 8 decodes ÷ 8 one-decode steps',
    '≤ 0.6',
    'engine',
    'decode8CostRatio',
    fixed(3),
    (x) => x <= 0.6,
  ),
  all(
    'llama.cpp fidelity, calibrated in the run: throughput / TTFT p50, p99 / TPOT p50, p99',
    '±10 % / ±15 %, ±25 % / ±15 %, ±25 %',
    'fidelity',
    [
      { path: 'throughputRatio', show: ratio, ok: within(0.9, 1.1) },
      { path: 'ttftP50Ratio', show: ratio, ok: within(0.85, 1.15) },
      { path: 'ttftP99Ratio', show: ratio, ok: within(0.75, 1.25) },
      { path: 'tpotP50Ratio', show: ratio, ok: within(0.85, 1.15) },
      { path: 'tpotP99Ratio', show: ratio, ok: within(0.75, 1.25) },
    ],
  ),
  one(
    'prefix routing, simulated: TTFT p50 with ÷ without prefixes',
    '≤ 0.5×',
    'prefix',
    'ttftP50Ratio',
    fixed(3, '×'),
    (x) => x <= 0.5,
  ),
  hitRateClaim('prefix routing, simulated: hit rate ÷ the oracle’s', 'hitRate', 'oracleHitRate'),
  one(
    'prefix routing, simulated: p99 TTFT with no shared prefixes, with ÷ without',
    '≤ 1.1×',
    'prefix',
    'noSharedP99Ratio',
    fixed(3, '×'),
    (x) => x <= 1.1,
  ),
  one(
    'prefix routing, live on llama.cpp: TTFT p50 with ÷ without prefixes',
    '≤ 0.5×',
    'prefix',
    'liveTtftP50Ratio',
    fixed(3, '×'),
    (x) => x <= 0.5,
  ),
  hitRateClaim('prefix routing, live on llama.cpp: hit rate ÷ the oracle’s', 'liveHitRate', 'liveOracleHitRate'),
  one(
    'prefix routing, live on llama.cpp: p99 TTFT with no shared prefixes, with ÷ without',
    '≤ 1.1×',
    'prefix',
    'liveNoSharedP99Ratio',
    fixed(3, '×'),
    (x) => x <= 1.1,
  ),
  one(
    '`engine: openai`: throughput through switchyard ÷ direct, llama.cpp upstream',
    '≥ 0.95×',
    'upstream',
    'throughputRatio',
    fixed(3, '×'),
    (x) => x >= 0.95,
  ),
  one(
    '`engine: openai`: p99 TTFT added (median of interleaved rounds)',
    '≤ 5 ms',
    'upstream',
    'p99AddedTtftMs',
    fixed(2, ' ms'),
    (x) => x <= 5,
  ),
];

/** The claims table in Markdown: one row per claim with this run's figure ('not run' when its benchmark did not). */
export function claimsTable(figures: Record<string, Figures | null | undefined>): string[] {
  const lines = ['| claim | target | this run | met | `npm run` |', '|---|---|---|---|---|'];
  for (const c of CLAIMS) {
    const f = figures[c.bench];
    const shown = f ? c.shown(f) : undefined;
    const met = f ? c.met(f) : undefined;
    const verdict = met === undefined ? '–' : met ? 'yes' : '**no**';
    lines.push(
      `| ${c.claim} | ${c.target} | ${shown ?? (f ? 'no figure' : 'not run')} | ${verdict} | bench:${c.bench} |`,
    );
  }
  return lines;
}
