// Latency summaries: exact percentiles for per-request samples, a log-bucketed histogram for per-token ones.

/** p50/p90/p99 (and mean, max) of a set of samples, in the samples' unit. */
export interface Summary {
  count: number;
  mean: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

const round = (x: number): number => Math.round(x * 100) / 100;

/** Summarises samples exactly (nearest-rank percentiles); sorts a copy. */
export function summarize(samples: readonly number[]): Summary {
  const n = samples.length;
  if (n === 0) return { count: 0, mean: 0, p50: 0, p90: 0, p99: 0, max: 0 };
  const s = Float64Array.from(samples).sort();
  let sum = 0;
  for (let i = 0; i < n; i++) sum += s[i]!;
  const at = (q: number): number => s[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))]!;
  return {
    count: n,
    mean: round(sum / n),
    p50: round(at(0.5)),
    p90: round(at(0.9)),
    p99: round(at(0.99)),
    max: round(s[n - 1]!),
  };
}

/** A histogram with 1 % relative precision for many samples (time between tokens). */
export interface LogHistogram {
  add(x: number): void;
  /** Adds `n` samples of `x`: the same as `n` calls of add(x), sum included (added one by one, in order). */
  addN(x: number, n: number): void;
  summary(): Summary;
  readonly count: number;
}

const GROWTH = Math.log(1.01);

// Buckets from -1000 (samples at or below 1e-3) up to 1e6 (1e6 ms and a bit above) are counted in a typed array:
// adding a sample is then one log and one store, with no map lookup. Larger samples fall back to a map.
const LOW = -1000;
const DENSE = 2400;

/** Creates an empty log histogram; samples at or below 1e-3 land in the first bucket. */
export function createLogHistogram(): LogHistogram {
  const dense = new Float64Array(DENSE);
  const sparse = new Map<number, number>();
  let count = 0;
  // The doubles that change on every add (sum, max, the last sample) live in a typed array: a closure's double
  // variable is a boxed number, and each assignment to it allocates one.
  const f = new Float64Array(3);
  const SUM = 0;
  const MAX = 1;
  const LAST = 2;
  f[LAST] = NaN;
  const bucketOf = (x: number): number => (x <= 1e-3 ? LOW : Math.floor(Math.log(x) / GROWTH));
  const valueOf = (b: number): number => (b === LOW ? 0 : Math.exp((b + 0.5) * GROWTH));
  /** Occupied buckets in ascending order, with their counts. */
  const occupied = (): [number, number][] => {
    const out: [number, number][] = [];
    for (let i = 0; i < DENSE; i++) if (dense[i]! > 0) out.push([i + LOW, dense[i]!]);
    for (const k of [...sparse.keys()].sort((a, b) => a - b)) out.push([k, sparse.get(k)!]);
    return out;
  };
  // Samples repeat (every sequence of a step that decoded in the one before has the same time between tokens): the
  // last sample's bucket is kept, so a repeat costs no log.
  let lastI = 0;
  const addN = (x: number, n: number): void => {
    if (x !== f[LAST]) {
      f[LAST] = x;
      lastI = bucketOf(x) - LOW;
    }
    const i = lastI;
    if (i < DENSE) dense[i]! += n;
    else sparse.set(i + LOW, (sparse.get(i + LOW) ?? 0) + n);
    count += n;
    // One add per sample, in order: the same rounding as n calls of add.
    let acc = f[SUM]!;
    for (let k = 0; k < n; k++) acc += x;
    f[SUM] = acc;
    if (x > f[MAX]!) f[MAX] = x;
  };
  return {
    add: (x) => addN(x, 1),
    addN,
    get count() {
      return count;
    },
    summary: () => {
      if (count === 0) return { count: 0, mean: 0, p50: 0, p90: 0, p99: 0, max: 0 };
      const buckets = occupied();
      const at = (q: number): number => {
        const rank = Math.max(1, Math.ceil(q * count));
        let seen = 0;
        for (const [k, n] of buckets) {
          seen += n;
          if (seen >= rank) return Math.min(f[MAX]!, valueOf(k));
        }
        return f[MAX]!;
      };
      return {
        count,
        mean: round(f[SUM]! / count),
        p50: round(at(0.5)),
        p90: round(at(0.9)),
        p99: round(at(0.99)),
        max: round(f[MAX]!),
      };
    },
  };
}
