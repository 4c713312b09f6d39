// `npm run bench:routing`: routing policies side by side at 80 % of the node's capacity, then sustained overload
// at 3x capacity. Eight Llama-3-8B replicas (TP 1) on H100, heavy-tailed lengths from the Splitwise traces, Poisson
// arrivals, one seed. Prints tables and ends with one JSON line of figures.
// Run with: npm run bench:routing [-- --quick] [--seed N]
import { normalizeScenario, type Scenario } from '../actors/config.ts';
import { simulate, type SimReport } from '../actors/sim/simulate.ts';
import type { ControlPlane } from '../actors/control-plane.ts';
import { ROUTING_POLICIES, type RoutingPolicy } from '../actors/router/router.ts';
import { summarize } from '../actors/metrics/histogram.ts';
import { printFigures, quick, writeChartData } from './lib/data.ts';

type Trace = 'splitwise_code' | 'splitwise_conv';

const seedArg = process.argv.indexOf('--seed');
const SEED = seedArg >= 0 ? Number(process.argv[seedArg + 1]) : 1;
const REPLICAS = 8;
const LOAD = 0.8;
const OVERLOAD = 3;
const POLICY_REQUESTS = quick ? 1500 : 6000;
const CAPACITY_REQUESTS = quick ? 1500 : 2400;
const OVERLOAD_SECONDS = quick ? 10 : 30;
const MAX_TOTAL_TOKENS = 8192;
const KEY: Record<RoutingPolicy, string> = {
  cost: 'cost',
  'round-robin': 'roundRobin',
  'least-requests': 'leastRequests',
  'power-of-two': 'powerOfTwo',
};

/** A scenario of `replicas` Llama-3-8B replicas on H100 with the given classes and traffic. */
function scenario(opts: {
  replicas: number;
  policy: RoutingPolicy;
  classes: Record<string, object>;
  traffic: object[];
}): Scenario {
  return normalizeScenario({
    name: 'routing-bench',
    seed: SEED,
    node: { gpu: 'H100-SXM', gpus: 8 },
    routing: { policy: opts.policy },
    models: [
      {
        name: 'llama-3-8b',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: opts.replicas,
        batching: { policy: 'chunked', maxRunning: 256, tokenBudget: 2048, blockTokens: 16 },
        classes: opts.classes,
      },
    ],
    traffic: opts.traffic,
    sim: { checkInvariants: false },
  });
}

const lengths = (trace: Trace): object => ({ trace, maxTotalTokens: MAX_TOTAL_TOKENS });

/** Per-replica capacity: one replica kept saturated (arrivals far above what it serves, no queue bound, and the
 * round-robin policy, which admits on queue budget alone, so every request is queued); the rate at which requests
 * complete between the 10th and 90th percentile of completions, so the ramp and the tail are left out. */
function measureCapacity(trace: Trace): { perReplica: number; node: number; tokensPerS: number; note: string } {
  const audit = newAudit();
  simulate(
    scenario({
      replicas: 1,
      policy: 'round-robin',
      classes: { interactive: { maxQueueMs: 1e9, maxQueued: 1_000_000, maxQueuedTokens: 1e12 } },
      traffic: [
        {
          model: 'llama-3-8b',
          priority: 'interactive',
          requests: CAPACITY_REQUESTS,
          lengths: lengths(trace),
          arrival: { process: 'poisson', rate: 100 },
        },
      ],
    }),
    { onStart: audited(audit) },
  );
  const cp = audit.cp;
  const rejected = cp!.collector.records.filter((r) => r.outcome !== 'done').length;
  if (rejected > 0) throw new Error(`capacity run: ${rejected} requests did not complete`);
  const f = cp!.collector.records
    .filter((r) => r.outcome === 'done')
    .map((r) => r.finishedAt)
    .sort((a, b) => a - b);
  const a = Math.floor(0.1 * f.length);
  const b = Math.floor(0.9 * f.length);
  const perReplica = ((b - a) / (f[b]! - f[a]!)) * 1000;
  return {
    perReplica,
    node: perReplica * REPLICAS,
    tokensPerS: rateIn(audit, f[a]!, f[b]!).tokensPerS * REPLICAS,
    note: `1 replica saturated by ${CAPACITY_REQUESTS} requests at 100 req/s: ${b - a} completions in ${((f[b]! - f[a]!) / 1000).toFixed(1)} s (10th-90th percentile of completions) = ${perReplica.toFixed(2)} req/s (${Math.round(rateIn(audit, f[a]!, f[b]!).tokensPerS)} prompt + output tok/s); x ${REPLICAS} replicas`,
  };
}

/** Outcome accounting around a run: what each submit answered, and whether every request ended exactly once. */
interface Audit {
  submitted: Set<string>;
  /** Prompt tokens of each submitted request (the collector keeps only output tokens). */
  prompts: Map<string, number>;
  rejectedWithoutRetryAfter: number;
  cp?: ControlPlane;
}

const newAudit = (): Audit => ({ submitted: new Set(), prompts: new Map(), rejectedWithoutRetryAfter: 0 });

/** Requests done between `from` and `to` (ms), per second, and their prompt + output tokens per second. */
function rateIn(a: Audit, from: number, to: number): { perS: number; tokensPerS: number } {
  let n = 0;
  let tokens = 0;
  for (const r of a.cp!.collector.records) {
    if (r.outcome !== 'done' || r.finishedAt < from || r.finishedAt >= to) continue;
    n++;
    tokens += r.tokens + (a.prompts.get(r.id) ?? 0);
  }
  return { perS: (n / (to - from)) * 1000, tokensPerS: (tokens / (to - from)) * 1000 };
}

function audited(a: Audit): (cp: ControlPlane) => void {
  return (cp) => {
    a.cp = cp;
    const submit = cp.submit;
    cp.submit = (spec, listener) => {
      const res = submit(spec, listener);
      a.submitted.add(res.id);
      a.prompts.set(res.id, spec.promptTokens);
      if (
        !res.ok &&
        res.failure?.code === 'overloaded' &&
        !(typeof res.failure.retryAfterMs === 'number' && res.failure.retryAfterMs > 0)
      ) {
        a.rejectedWithoutRetryAfter++;
      }
      return res;
    };
  };
}

/** Requests submitted that do not have exactly one terminal record, plus any still live. */
function withoutOneOutcome(a: Audit): number {
  const seen = new Map<string, number>();
  for (const r of a.cp!.collector.records) seen.set(r.id, (seen.get(r.id) ?? 0) + 1);
  let bad = 0;
  for (const id of a.submitted) if (seen.get(id) !== 1) bad++;
  for (const id of seen.keys()) if (!a.submitted.has(id)) bad++;
  return bad;
}

interface PolicyRow {
  policy: RoutingPolicy;
  report: SimReport;
  ttft: { p50: number; p90: number; p99: number };
  queueP99: number;
  admittedOverBudget: number;
  withoutOneOutcome: number;
  rejectedWithoutRetryAfter: number;
}

function runPolicy(trace: Trace, policy: RoutingPolicy, rate: number): PolicyRow {
  const audit = newAudit();
  const report = simulate(
    scenario({
      replicas: REPLICAS,
      policy,
      classes: { interactive: {} },
      traffic: [
        {
          model: 'llama-3-8b',
          priority: 'interactive',
          requests: POLICY_REQUESTS,
          lengths: lengths(trace),
          arrival: { process: 'poisson', rate },
        },
      ],
    }),
    { onStart: audited(audit) },
  );
  return {
    policy,
    report,
    ttft: { p50: report.ttftMs.p50, p90: report.ttftMs.p90, p99: report.ttftMs.p99 },
    queueP99: report.queueWaitMs.p99,
    admittedOverBudget: report.invariants.overBudget,
    withoutOneOutcome: withoutOneOutcome(audit),
    rejectedWithoutRetryAfter: audit.rejectedWithoutRetryAfter,
  };
}

const fmt = (x: number, d = 1): string => (Number.isFinite(x) ? x.toFixed(d) : '-');
const pad = (s: string, n: number): string => s.padStart(n);

function policyTable(trace: Trace, rate: number, cap: { node: number; note: string }, rows: PolicyRow[]): string {
  const lines = [
    `== ${trace}: ${REPLICAS} x llama-3-8b (TP 1) on H100, Poisson ${fmt(rate)} req/s = ${Math.round(LOAD * 100)} % of capacity ${fmt(cap.node)} req/s, ${POLICY_REQUESTS} requests, seed ${SEED}`,
    `   capacity: ${cap.note}`,
    `${'policy'.padEnd(16)}${pad('TTFT p50', 10)}${pad('TTFT p90', 10)}${pad('TTFT p99', 10)}${pad('queue p99', 11)}${pad('done', 7)}${pad('rejected', 10)}${pad('expired', 9)}${pad('GPU util', 10)}`,
  ];
  for (const r of rows) {
    const q = r.report.requests;
    const rejected = (q['overloaded'] ?? 0) + (q['model_unavailable'] ?? 0) + (q['invalid_request'] ?? 0);
    lines.push(
      `${r.policy.padEnd(16)}${pad(fmt(r.ttft.p50), 10)}${pad(fmt(r.ttft.p90), 10)}${pad(fmt(r.ttft.p99), 10)}${pad(fmt(r.queueP99), 11)}${pad(String(q['done'] ?? 0), 7)}${pad(String(rejected), 10)}${pad(String(q['expired'] ?? 0), 9)}${pad(`${Math.round(r.report.gpus.meanUtilisation * 100)} %`, 10)}`,
    );
  }
  const cost = rows.find((r) => r.policy === 'cost')!;
  const rr = rows.find((r) => r.policy === 'round-robin')!;
  const ratio = rr.ttft.p99 / cost.ttft.p99;
  lines.push(
    `   p99 TTFT round-robin / cost = ${fmt(ratio, 2)}x (target >= 2x: ${ratio >= 2 ? 'met' : 'NOT met'}); times in ms`,
  );
  return `${lines.join('\n')}\n`;
}

function p99Of(rows: PolicyRow[], p: RoutingPolicy): number {
  return rows.find((r) => r.policy === p)!.ttft.p99;
}

function byPolicy<T>(rows: PolicyRow[], f: (r: PolicyRow) => T): Record<string, T> {
  return Object.fromEntries(rows.map((r) => [KEY[r.policy], f(r)]));
}

/** Sustained overload: 3x capacity for OVERLOAD_SECONDS, three quarters interactive and one quarter batch. */
function runOverload(trace: Trace, cap: { node: number; tokensPerS: number }) {
  const rate = OVERLOAD * cap.node;
  const perClass = { interactive: 0.75, batch: 0.25 };
  const audit = newAudit();
  const report = simulate(
    scenario({
      replicas: REPLICAS,
      policy: 'cost',
      classes: { interactive: {}, batch: {} },
      traffic: Object.entries(perClass).map(([priority, share]) => ({
        model: 'llama-3-8b',
        priority,
        requests: Math.round(rate * share * OVERLOAD_SECONDS),
        lengths: lengths(trace),
        arrival: { process: 'poisson', rate: rate * share },
      })),
    }),
    { onStart: audited(audit) },
  );
  const recs = audit.cp!.collector.records;
  const t0 = Math.min(...recs.map((r) => r.receivedAt));
  // Goodput in the steady part of the overload: completions between 10 s and the end of arrivals.
  const from = t0 + Math.min(10_000, OVERLOAD_SECONDS * 250);
  const to = t0 + OVERLOAD_SECONDS * 1000;
  const good = rateIn(audit, from, to);
  const goodput = good.perS;
  let waitOver = 0;
  let maxWaitOverBudget = -Infinity;
  const byClass: Record<
    string,
    {
      offered: number;
      admitted: number;
      rejected: number;
      expired: number;
      done: number;
      queueP99Ms: number;
      ttftP99Ms: number;
    }
  > = {};
  for (const cls of Object.keys(perClass)) {
    const rs = recs.filter((r) => r.priority === cls);
    const rejected = rs.filter((r) => r.outcome === 'rejected').length;
    byClass[cls] = {
      offered: rs.length,
      admitted: rs.length - rejected,
      rejected,
      expired: rs.filter((r) => r.outcome === 'expired').length,
      done: rs.filter((r) => r.outcome === 'done').length,
      queueP99Ms: summarize(rs.filter((r) => r.firstScheduledAt >= 0).map((r) => r.firstScheduledAt - r.receivedAt))
        .p99,
      ttftP99Ms: summarize(rs.filter((r) => r.outcome === 'done').map((r) => r.firstTokenAt - r.receivedAt)).p99,
    };
  }
  for (const r of recs) {
    if (r.firstScheduledAt < 0) continue;
    const over = r.firstScheduledAt - r.receivedAt - r.budgetMs;
    maxWaitOverBudget = Math.max(maxWaitOverBudget, over);
    if (over > 1e-6) waitOver++;
  }
  const rejectedNotOverloaded = recs.filter((r) => r.outcome === 'rejected' && r.code !== 'overloaded').length;
  return {
    report,
    figures: {
      offeredPerS: Math.round(rate * 10) / 10,
      capacityPerS: Math.round(cap.node * 10) / 10,
      seconds: OVERLOAD_SECONDS,
      requests: recs.length,
      admittedOverBudget: Math.max(waitOver, report.invariants.overBudget),
      withoutOneOutcome: withoutOneOutcome(audit),
      rejectedWithoutRetryAfter: audit.rejectedWithoutRetryAfter,
      rejectedNotOverloaded,
      goodputPerS: Math.round(goodput * 10) / 10,
      goodputOfCapacity: Math.round((goodput / cap.node) * 1000) / 1000,
      goodputTokensPerS: Math.round(good.tokensPerS),
      capacityTokensPerS: Math.round(cap.tokensPerS),
      goodputTokensOfCapacity: Math.round((good.tokensPerS / cap.tokensPerS) * 1000) / 1000,
      maxQueueWaitMinusBudgetMs: Math.round(maxWaitOverBudget * 1000) / 1000,
      byClass,
    },
  };
}

function overloadTable(trace: Trace, o: ReturnType<typeof runOverload>['figures']): string {
  const lines = [
    `== overload (${trace}, cost policy): ${fmt(o.offeredPerS)} req/s offered = ${OVERLOAD}x capacity ${fmt(o.capacityPerS)} req/s for ${o.seconds} s (75 % interactive, 25 % batch)`,
    `${'class'.padEnd(13)}${pad('offered', 9)}${pad('admitted', 10)}${pad('rejected', 10)}${pad('expired', 9)}${pad('done', 7)}${pad('queue p99', 11)}${pad('TTFT p99', 10)}`,
  ];
  for (const [cls, c] of Object.entries(o.byClass)) {
    lines.push(
      `${cls.padEnd(13)}${pad(String(c.offered), 9)}${pad(String(c.admitted), 10)}${pad(String(c.rejected), 10)}${pad(String(c.expired), 9)}${pad(String(c.done), 7)}${pad(fmt(c.queueP99Ms), 11)}${pad(fmt(c.ttftP99Ms), 10)}`,
    );
  }
  lines.push(
    `   admitted goodput ${fmt(o.goodputPerS)} req/s next to capacity ${fmt(o.capacityPerS)} req/s (${Math.round(o.goodputOfCapacity * 100)} %);`,
  );
  lines.push(
    `   in tokens (prompt + output) ${o.goodputTokensPerS} tok/s next to ${o.capacityTokensPerS} tok/s (${Math.round(o.goodputTokensOfCapacity * 100)} %), which weighs long and short requests alike`,
  );
  lines.push(
    `   admitted over budget ${o.admittedOverBudget} (max queue wait - budget ${fmt(o.maxQueueWaitMinusBudgetMs, 3)} ms), without exactly one outcome ${o.withoutOneOutcome}, overloaded without retryAfterMs ${o.rejectedWithoutRetryAfter}, rejected with another code ${o.rejectedNotOverloaded}`,
  );
  return `${lines.join('\n')}\n`;
}

function main(): void {
  const started = performance.now();
  const traces: Trace[] = ['splitwise_code', 'splitwise_conv'];
  const perTrace: Record<string, { capacity: ReturnType<typeof measureCapacity>; rate: number; rows: PolicyRow[] }> =
    {};
  for (const trace of traces) {
    const capacity = measureCapacity(trace);
    const rate = LOAD * capacity.node;
    const rows = ROUTING_POLICIES.map((p) => runPolicy(trace, p, rate));
    perTrace[trace] = { capacity, rate, rows };
    process.stdout.write(policyTable(trace, rate, capacity, rows));
    process.stdout.write('\n');
  }
  const primary = perTrace['splitwise_code']!;
  const overload = runOverload('splitwise_code', primary.capacity);
  process.stdout.write(overloadTable('splitwise_code', overload.figures));
  process.stderr.write(`bench:routing finished in ${((performance.now() - started) / 1000).toFixed(1)} s wall\n`);

  const summary = (t: (typeof perTrace)[string]) => ({
    capacityPerS: Math.round(t.capacity.node * 10) / 10,
    ratePerS: Math.round(t.rate * 10) / 10,
    p50TtftMs: byPolicy(t.rows, (r) => r.ttft.p50),
    p99TtftMs: byPolicy(t.rows, (r) => r.ttft.p99),
    p99QueueWaitMs: byPolicy(t.rows, (r) => r.queueP99),
    roundRobinOverCostP99: Math.round((p99Of(t.rows, 'round-robin') / p99Of(t.rows, 'cost')) * 100) / 100,
    admittedOverBudget: t.rows.reduce((s, r) => s + r.admittedOverBudget, 0),
    withoutOneOutcome: t.rows.reduce((s, r) => s + r.withoutOneOutcome, 0),
  });
  writeChartData({
    ttft: primary.rows.map((r) => ({ series: r.policy, p50: r.ttft.p50, p90: r.ttft.p90, p99: r.ttft.p99 })),
  });
  const code = summary(primary);
  printFigures({
    trace: 'splitwise_code',
    seed: SEED,
    requestsPerPolicy: POLICY_REQUESTS,
    ...code,
    target2x: code.roundRobinOverCostP99 >= 2,
    conv: summary(perTrace['splitwise_conv']!),
    overload: overload.figures,
  });
}

main();
