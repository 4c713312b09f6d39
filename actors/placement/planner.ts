// The capacity planner: simulates candidate placements for a scenario's traffic and targets, scores each model's SLO
// attainment, and when no candidate meets every target says what must change — more GPUs, a variant that fits, or
// how far the targets must relax — with numbers from further simulations.
import type { ModelConfig, Scenario } from '../config.ts';
import type { RequestRecord } from '../metrics/collector.ts';
import { simulate } from '../sim/simulate.ts';
import { rolesOf } from './layout.ts';

/** One placement the planner tries. */
export interface Candidate {
  name: string;
  describe: string;
  scenario: Scenario;
}

/** How one model fared under a candidate. */
export interface ModelOutcome {
  model: string;
  requests: number;
  /** Fraction of requests that finished within their class's TTFT and TPOT targets (refused ones count as misses). */
  attainment: number;
  /** Requests per second that met their targets. */
  goodputRps: number;
  p99TtftMs: number | null;
  p99TpotMs: number | null;
  /** Longest wait before first being scheduled, or before being refused/expiring (s). */
  worstWaitS: number;
  meets: boolean;
  /** Per request, how much its class's targets would need to stretch for it to count (Infinity: never finished). */
  stretch: number[];
}

/** The result of simulating one candidate. */
export interface CandidateResult {
  candidate: Candidate;
  models: ModelOutcome[];
  feasible: boolean;
  simulatedS: number;
}

/** Progress of a plan: which simulation runs and how far it is. */
export interface PlanProgress {
  label: string;
  index: number;
  total: number;
  fraction: number;
}

/** The planner's answer. */
export interface PlanResult {
  attainment: number;
  results: CandidateResult[];
  best: CandidateResult | null;
  feasible: boolean;
  /** When infeasible: what must change, one finding per line, with numbers. */
  advice: string[];
}

const r2 = (x: number): number => Math.round(x * 100) / 100;

/** A copy of the scenario with some models' replica counts, profiles or tp changed and a placement policy. */
function variant(
  base: Scenario,
  policy: Scenario['placement'],
  models: (m: ModelConfig) => ModelConfig,
  gpus = base.node.gpus,
): Scenario {
  return { ...base, node: { ...base.node, gpus }, placement: policy, models: base.models.map(models), faults: [] };
}

/** Splits `gpus` single-GPU slots among the small models (equal shares, the first ones get the remainder). */
function smallReplicas(small: ModelConfig[], gpus: number): Map<string, number> {
  const out = new Map<string, number>();
  const per = small.length > 0 ? Math.floor(gpus / small.length) : 0;
  small.forEach((m, i) => out.set(m.name, Math.floor((per + (i < gpus - per * small.length ? 1 : 0)) / m.tp)));
  return out;
}

/** The candidates for a scenario: all-large, all-small, switch at several residencies, share, configured variants. */
export function candidatesOf(base: Scenario): Candidate[] {
  const { large, small } = rolesOf(base.models);
  const n = base.node.gpus;
  const pc = base.placement;
  const out: Candidate[] = [];
  const smallAll = smallReplicas(small, n);
  const excl = { ...pc, policy: 'exclusive' as const };
  if (large) {
    out.push({
      name: 'all-large',
      describe: `exclusive: ${large.name} TP-${large.tp} on ${large.tp} GPUs, ${small.map((m) => m.name).join(', ')} on ${n - large.tp}`,
      scenario: variant(base, excl, (m) =>
        m === large ? { ...m, replicas: 1 } : { ...m, replicas: smallReplicas(small, n - large.tp).get(m.name) ?? 0 },
      ),
    });
  }
  out.push({
    name: 'all-small',
    describe: `exclusive: ${small.map((m) => `${m.name} x${smallAll.get(m.name)}`).join(', ')}${large ? `, no ${large.name}` : ''}`,
    scenario: variant(base, excl, (m) =>
      m === large ? { ...m, replicas: 0 } : { ...m, replicas: smallAll.get(m.name) ?? 0 },
    ),
  });
  if (large) {
    for (const r of base.planner.residenciesMs) {
      out.push({
        name: `switch r=${r / 1000}s`,
        describe: `switch: residency ${r / 1000} s, drain deadline ${Math.max(pc.drainDeadlineMs, r) / 1000} s`,
        scenario: variant(
          base,
          {
            ...pc,
            policy: 'switch',
            minResidencyMs: r,
            drainDeadlineMs: Math.max(pc.drainDeadlineMs, r),
            largeWaitReservation: true,
          },
          (m) => (m === large ? { ...m, replicas: 1 } : { ...m, replicas: smallAll.get(m.name) ?? 0 }),
        ),
      });
    }
    out.push({
      name: 'share',
      describe: `share: ${large.name} TP-${large.tp} with ${small.map((m) => m.name).join(', ')} beside its shards, interference x${pc.interference}`,
      scenario: variant(base, { ...pc, policy: 'share' }, (m) =>
        m === large ? { ...m, replicas: 1 } : { ...m, replicas: smallAll.get(m.name) ?? 0 },
      ),
    });
  }
  for (const v of base.planner.variants) {
    const rest = n - v.tp;
    if (rest < 0) continue;
    const split = smallReplicas(
      small.filter((m) => m.name !== v.model),
      rest,
    );
    out.push({
      name: `variant ${v.name}`,
      describe: `exclusive: ${v.model} as ${v.profile} TP-${v.tp} on ${v.tp} GPUs, small models on ${rest}`,
      scenario: variant(base, excl, (m) =>
        m.name === v.model
          ? { ...m, profile: v.profile, tp: v.tp, replicas: 1 }
          : { ...m, replicas: split.get(m.name) ?? 0 },
      ),
    });
  }
  return out;
}

/** Scores each model of a finished run against its classes' targets. */
export function scoreModels(
  scenario: Scenario,
  records: readonly RequestRecord[],
  simulatedS: number,
  attainment: number,
): ModelOutcome[] {
  const out: ModelOutcome[] = [];
  for (const m of scenario.models) {
    if (!scenario.traffic.some((t) => t.model === m.name)) continue;
    const rs = records.filter((r) => r.model === m.name);
    const cls = new Map(m.classes.map((c) => [c.name, c]));
    const stretch: number[] = [];
    const ttft: number[] = [];
    const tpot: number[] = [];
    let worst = 0;
    for (const r of rs) {
      const c = cls.get(r.priority) ?? m.classes[0]!;
      const waited = (r.firstScheduledAt >= 0 ? r.firstScheduledAt : r.finishedAt) - r.receivedAt;
      worst = Math.max(worst, waited);
      if (r.outcome !== 'done' || r.firstTokenAt < 0) {
        stretch.push(Infinity);
        continue;
      }
      const t1 = r.firstTokenAt - r.receivedAt;
      const tp = r.tokens > 1 ? (r.finishedAt - r.firstTokenAt) / (r.tokens - 1) : 0;
      ttft.push(t1);
      if (r.tokens > 1) tpot.push(tp);
      stretch.push(Math.max(t1 / c.ttftMs, tp / c.tpotMs));
    }
    const met = stretch.filter((s) => s <= 1).length;
    const att = rs.length > 0 ? met / rs.length : 1;
    out.push({
      model: m.name,
      requests: rs.length,
      attainment: r2(att * 100) / 100,
      goodputRps: simulatedS > 0 ? r2(met / simulatedS) : 0,
      p99TtftMs: ttft.length > 0 ? r2(quantile(ttft, 0.99)) : null,
      p99TpotMs: tpot.length > 0 ? r2(quantile(tpot, 0.99)) : null,
      worstWaitS: r2(worst / 1000),
      meets: att >= attainment,
      stretch,
    });
  }
  return out;
}

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}

/** Simulates one candidate; `onFraction` hears the share of its requests submitted so far. */
export function evaluate(c: Candidate, attainment: number, onFraction?: (f: number) => void): CandidateResult {
  const total = c.scenario.traffic.reduce((a, t) => a + t.requests, 0);
  let records: readonly RequestRecord[] = [];
  const report = simulate(c.scenario, {
    onStart: (cp) => {
      records = cp.collector.records;
      let submitted = 0;
      let shown = -1;
      const submit = cp.submit;
      cp.submit = (spec, listener) => {
        submitted++;
        const pct = Math.floor((100 * submitted) / Math.max(1, total));
        if (pct !== shown) {
          shown = pct;
          onFraction?.(Math.min(0.99, pct / 100));
        }
        return submit(spec, listener);
      };
    },
  });
  const models = scoreModels(c.scenario, records, report.sim.simulatedSeconds, attainment);
  return { candidate: c, models, feasible: models.every((m) => m.meets), simulatedS: report.sim.simulatedSeconds };
}

/** The smallest count in [1, hi] for which `ok` holds (assumed monotone), or null: doubling from `start`, then bisection. */
export function smallest(start: number, hi: number, ok: (k: number) => boolean): number | null {
  let prev = 0;
  let k = Math.max(1, Math.min(start, hi));
  while (!ok(k)) {
    if (k >= hi) return null;
    prev = k;
    k = Math.min(hi, k * 2);
  }
  let a = prev + 1;
  let b = k;
  while (a < b) {
    const mid = Math.floor((a + b) / 2);
    if (ok(mid)) b = mid;
    else a = mid + 1;
  }
  return b;
}

/** Runs the planner over every candidate, then (if none fits) the searches behind its advice. */
export function plan(base: Scenario, onProgress?: (p: PlanProgress) => void): PlanResult {
  const attainment = base.planner.attainment;
  const cands = candidatesOf(base);
  let index = 0;
  let total = cands.length;
  const run = (c: Candidate): CandidateResult => {
    index++;
    onProgress?.({ label: c.name, index, total, fraction: 0 });
    const r = evaluate(c, attainment, (f) => onProgress?.({ label: c.name, index, total, fraction: f }));
    onProgress?.({ label: c.name, index, total, fraction: 1 });
    return r;
  };
  const results = cands.map(run);
  const score = (r: CandidateResult): number => Math.min(...r.models.map((m) => m.attainment / attainment));
  const feasibleOnes = results.filter((r) => r.feasible);
  const ranked = [...(feasibleOnes.length > 0 ? feasibleOnes : results)].sort(
    (a, b) =>
      score(b) - score(a) ||
      b.models.reduce((s, m) => s + m.goodputRps, 0) - a.models.reduce((s, m) => s + m.goodputRps, 0),
  );
  const best = ranked[0] ?? null;
  if (feasibleOnes.length > 0) return { attainment, results, best, feasible: true, advice: [] };

  const advice: string[] = [];
  const { large, small } = rolesOf(base.models);
  const n = base.node.gpus;
  const maxGpus = n + base.planner.maxExtraGpus;
  // Each model alone on dedicated GPUs: how many replicas it needs to meet its target (candidates already tell some).
  const known = new Map<string, boolean>();
  // In an exclusive split each model runs on its own replicas, so its result there is its result alone.
  for (const r of results) {
    if (r.candidate.name !== 'all-large' && r.candidate.name !== 'all-small') continue;
    for (const o of r.models) {
      const m = r.candidate.scenario.models.find((x) => x.name === o.model)!;
      if (m.replicas > 0) known.set(`${m.name}#${m.replicas}`, o.meets);
    }
  }
  const alone = (m: ModelConfig, replicas: number): boolean => {
    const hit = known.get(`${m.name}#${replicas}`);
    if (hit !== undefined) return hit;
    const sc: Scenario = {
      ...base,
      node: { ...base.node, gpus: Math.max(n, replicas * m.tp) },
      placement: { ...base.placement, policy: 'exclusive' },
      models: base.models.map((x) => (x === m ? { ...x, replicas } : { ...x, replicas: 0 })),
      traffic: base.traffic.filter((t) => t.model === m.name),
      faults: [],
    };
    total++;
    const r = run({ name: `search: ${m.name} x${replicas}`, describe: '', scenario: sc });
    const ok = r.models.every((x) => x.meets);
    known.set(`${m.name}#${replicas}`, ok);
    return ok;
  };
  const need = new Map<string, number | null>();
  for (const m of [...(large ? [large] : []), ...small]) {
    if (!base.traffic.some((t) => t.model === m.name)) continue;
    const tried = [...known.keys()]
      .filter((key) => key.startsWith(`${m.name}#`))
      .map((key) => Number(key.slice(m.name.length + 1)));
    need.set(
      m.name,
      smallest(Math.max(1, ...tried), Math.floor(maxGpus / m.tp), (k) => alone(m, k)),
    );
  }
  const unmet = [...need.entries()].filter(([, k]) => k === null).map(([name]) => name);
  if (unmet.length > 0) {
    advice.push(
      `${unmet.join(', ')} cannot meet ${attainment * 100}% attainment even alone on ${maxGpus} GPUs: the targets must relax (below)`,
    );
  } else {
    const gpus = [...need.entries()].reduce((s, [name, k]) => s + k! * base.models.find((m) => m.name === name)!.tp, 0);
    const parts = [...need.entries()].map(
      ([name, k]) => `${name} ${k} x ${base.models.find((m) => m.name === name)!.tp} GPU`,
    );
    advice.push(
      `more GPUs: served side by side the demand needs ${gpus} GPUs (${parts.join(' + ')}), ${gpus - n} more than the node's ${n}`,
    );
    for (const v of base.planner.variants) {
      const smallGpus = [...need.entries()]
        .filter(([name]) => name !== v.model)
        .reduce((s, [name, k]) => s + k! * base.models.find((m) => m.name === name)!.tp, 0);
      const vr = results.find((r) => r.candidate.name === `variant ${v.name}`);
      const vMeets = vr?.models.find((x) => x.model === v.model)?.meets ?? false;
      const totalV = v.tp + smallGpus;
      advice.push(
        `variant ${v.name} (${v.profile} on ${v.tp} GPUs): ${v.model} ${vMeets ? 'meets' : 'misses'} its target on it; with it the demand needs ${totalV} GPUs (${totalV <= n ? 'fits' : `${totalV - n} more than the node has`})`,
      );
    }
  }
  if (best) {
    for (const m of best.models) {
      if (m.meets) continue;
      const s = [...m.stretch].sort((a, b) => a - b);
      const k = s[Math.max(0, Math.ceil(attainment * s.length) - 1)] ?? Infinity;
      const cls = base.models.find((x) => x.name === m.model)!.classes[0]!;
      if (Number.isFinite(k)) {
        advice.push(
          `relax targets: with ${best.candidate.name}, ${m.model} reaches ${attainment * 100}% only if its targets stretch x${r2(k)} (TTFT ${Math.round(cls.ttftMs * k)} ms, TPOT ${Math.round(cls.tpotMs * k)} ms for ${cls.name})`,
        );
      } else {
        advice.push(
          `relax targets: with ${best.candidate.name}, ${m.model} finishes only ${r2((100 * s.filter(Number.isFinite).length) / Math.max(1, s.length))}% of its requests: its attainment target must drop to that, whatever the latency targets`,
        );
      }
    }
  }
  return { attainment, results, best, feasible: false, advice };
}
