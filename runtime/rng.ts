// Seeded randomness: the only source of randomness in switchyard, so a seed reproduces a run.

/** A seeded pseudo-random generator (sfc32) with the distributions the simulator needs. */
export interface Rng {
  /** Uniform in [0, 1). */
  next(): number;
  /** Uniform integer in [0, n). */
  int(n: number): number;
  /** Exponential with the given mean. */
  exponential(mean: number): number;
  /** Gamma with the given mean and coefficient of variation (CV = 1 is exponential). */
  gamma(mean: number, cv: number): number;
  /** Standard normal. */
  normal(): number;
  /** A new independent generator derived from this one and a label. */
  fork(label: string): Rng;
  /** The seed this generator was made from. */
  readonly seed: number;
}

function hashString(s: string, h = 2166136261): number {
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

/** Creates a generator from an integer seed; equal seeds give equal sequences. */
export function createRng(seed: number): Rng {
  let a = 0x9e3779b9 ^ seed;
  let b = 0x243f6a88 ^ Math.imul(seed, 0x85ebca6b);
  let c = 0xb7e15162;
  let d = 0xdeadbeef ^ (seed >>> 7);
  const next = (): number => {
    a |= 0;
    b |= 0;
    c |= 0;
    d |= 0;
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return (t >>> 0) / 4294967296;
  };
  for (let i = 0; i < 16; i++) next();
  const normal = (): number => {
    let u = next();
    while (u === 0) u = next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * next());
  };
  const gammaShape = (k: number): number => {
    // Marsaglia–Tsang; for k < 1 boost with U^(1/k).
    if (k < 1) return gammaShape(k + 1) * Math.pow(next() || 1e-300, 1 / k);
    const dd = k - 1 / 3;
    const cc = 1 / Math.sqrt(9 * dd);
    for (;;) {
      let x: number;
      let v: number;
      do {
        x = normal();
        v = 1 + cc * x;
      } while (v <= 0);
      v = v * v * v;
      const u = next();
      if (u < 1 - 0.0331 * x * x * x * x) return dd * v;
      if (Math.log(u) < 0.5 * x * x + dd * (1 - v + Math.log(v))) return dd * v;
    }
  };
  return {
    seed,
    next,
    int: (n) => Math.floor(next() * n),
    exponential: (mean) => -mean * Math.log(1 - next()),
    gamma: (mean, cv) => {
      if (cv <= 0) return mean;
      const k = 1 / (cv * cv);
      return gammaShape(k) * (mean / k);
    },
    normal,
    fork: (label) => createRng(hashString(label, (seed ^ 0x5bd1e995) >>> 0)),
  };
}
