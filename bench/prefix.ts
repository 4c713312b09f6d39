// `npm run bench:prefix`: prefix reuse and routing on multi-turn chat. Two replicas keep a prefix cache; a seeded
// conversation workload (system prompts, turns resending every earlier turn, think time) runs at about 70 % of
// what the two serve, through three routers: `cost` pricing each candidate's cached prompt tokens, `cost` without
// prefixes, and `round-robin`. Then a workload with no shared prefixes (one turn each, prompts of their own) through
// `cost` with and without prefixes: routing on prefixes must not cost where there are none.
//
// The oracle's hit rate: at each decision, the most prompt tokens any candidate replica held cached (by the index
// its core's reports feed, as of the decision), over all prompt tokens: what a router that always chose the longest
// cached prefix would have found, in the same run. hitRate ÷ oracleHitRate is the share of available reuse the cost
// router took while it also balanced load.
//
// Simulated: the cost model on Llama-3-8B at H100 speed. Live (skipped with --sim-only): the same comparison served
// by `switchyard serve` on two llama.cpp replicas of the bench model (bench/lib/prefix-live.ts), its keys `live…`.
// Ends with one JSON line: {"ttftP50Ratio", "ttftP99Ratio", "hitRate", "oracleHitRate", "noSharedP99Ratio",
// "prefillTokensSaved", …, "liveTtftP50Ratio", "liveHitRate", …}.
// Run with: npm run bench:prefix [-- --quick] [--seed N] [--sim-only]
import { normalizeScenario, type Scenario } from '../actors/config.ts';
import { simulate, type SimReport } from '../actors/sim/simulate.ts';
import type { ControlPlane } from '../actors/control-plane.ts';
import type { RoutingPolicy } from '../actors/router/router.ts';
import { createConversationStream, type ConversationSpec } from '../actors/sim/conversations.ts';
import { createRng } from '../runtime/rng.ts';
import { printFigures, quick } from './lib/data.ts';
import { prefixLive } from './lib/prefix-live.ts';

const seedArg = process.argv.indexOf('--seed');
const SEED = seedArg >= 0 ? Number(process.argv[seedArg + 1]) : 1;
const LOAD = 0.7;
const REQUESTS = quick ? 1200 : 4000;

const KV_BLOCKS = 10_000;

/** The conversations: each with a system prompt of its own or one of a few shared ones, several turns. */
const CONVERSATION: ConversationSpec = {
  systemPrompts: 4,
  systemTokens: 2500,
  shared: 0.25,
  turns: { mean: 6, max: 16 },
  userTokens: { mean: 200, cv: 0.6, max: 1000 },
  thinkMs: 5000,
};

/** One turn each, a prompt of its own: nothing to reuse. */
const NO_SHARED: ConversationSpec = { ...CONVERSATION, systemPrompts: 1, shared: 0, turns: { mean: 1, max: 1 } };

/** Routers compared: the policy and whether it routes on prefixes. */
const ROUTERS: { name: string; policy: RoutingPolicy; prefix: boolean }[] = [
  { name: 'cost with prefixes', policy: 'cost', prefix: true },
  { name: 'cost without prefixes', policy: 'cost', prefix: false },
  { name: 'round-robin', policy: 'round-robin', prefix: false },
];

function scenario(o: {
  policy: RoutingPolicy;
  prefix: boolean;
  rate: number;
  conversation: ConversationSpec;
}): Scenario {
  return normalizeScenario({
    name: 'prefix-bench',
    seed: SEED,
    node: { gpu: 'H100-SXM', gpus: 2 },
    placement: { policy: 'exclusive' },
    routing: { policy: o.policy, prefix: o.prefix },
    models: [
      {
        name: 'llama-3-8b',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: 2,
        // A cache that holds about half the conversations alive at once: where a turn goes decides whether it hits.
        batching: {
          policy: 'chunked',
          maxRunning: 128,
          tokenBudget: 2048,
          blockTokens: 16,
          prefixCache: true,
          kvBlocks: KV_BLOCKS,
        },
        classes: { interactive: { ttftMs: 5000, tpotMs: 200, maxQueueMs: 20_000 } },
      },
    ],
    traffic: [
      {
        model: 'llama-3-8b',
        requests: REQUESTS,
        lengths: { output: { mean: 120, cv: 0.8, max: 600 } },
        arrival: { process: 'poisson', rate: o.rate },
        conversation: o.conversation,
      },
    ],
    sim: { checkInvariants: false },
  });
}

/** Runs a scenario, and the oracle's cached tokens from its decisions (the best candidate's expected cache). */
function run(s: Scenario): { report: SimReport; oracleTokens: number } {
  let cp: ControlPlane | null = null;
  const report = simulate(s, { keepTraces: true, onStart: (c) => (cp = c) });
  const plane = cp as unknown as ControlPlane;
  let oracleTokens = 0;
  for (const rec of plane.collector.records) {
    if (rec.firstScheduledAt < 0) continue;
    const first = (plane.explain(rec.id) ?? []).find((t) => t.kind === 'admit');
    let best = 0;
    for (const c of first?.candidates ?? []) best = Math.max(best, c.cachedTokens ?? 0);
    oracleTokens += best;
  }
  return { report, oracleTokens };
}

/** Mean turns per conversation of a spec, counted over a long seeded stream. */
function turnsPerConversation(spec: ConversationSpec): number {
  const rng = createRng(SEED).fork('turns');
  const stream = createConversationStream({
    spec,
    requests: 20_000,
    start: 0,
    startGapMs: () => 100,
    outputTokens: () => 100,
    rng,
  });
  let turns = 0;
  let conversations = 0;
  for (let t = stream.next(); t; t = stream.next()) {
    turns++;
    conversations = Math.max(conversations, t.conversation + 1);
  }
  return turns / Math.max(1, conversations);
}

/** Requests per second the two replicas complete when offered far more (cost without prefixes: the plain case). */
function capacity(conversation: ConversationSpec): number {
  const probe = (20 * (quick ? 1 : 2)) / turnsPerConversation(conversation);
  const r = simulate(scenario({ policy: 'cost', prefix: false, rate: probe * 4, conversation }));
  // Completed over the span requests were arriving and being served.
  return (r.requests['done'] ?? 0) / r.sim.simulatedSeconds;
}

const fmt = (x: number, d = 1): string => x.toFixed(d);

function table(name: string, rows: { name: string; r: SimReport }[]): void {
  process.stdout.write(`\n${name}\n`);
  process.stdout.write('router                    TTFT p50   TTFT p99   hit rate   prefill saved   done/total\n');
  for (const { name: n, r } of rows)
    process.stdout.write(
      `${n.padEnd(24)} ${fmt(r.ttftMs.p50).padStart(9)} ${fmt(r.ttftMs.p99).padStart(10)} ${fmt((r.prefix?.hitRate ?? 0) * 100).padStart(9)}% ${String(r.prefix?.cachedTokens ?? 0).padStart(15)}   ${r.requests['done'] ?? 0}/${r.requests.total}\n`,
    );
}

function simulated(): Record<string, number> {
  const cap = capacity(CONVERSATION);
  const turns = turnsPerConversation(CONVERSATION);
  const rate = (LOAD * cap) / turns;
  process.stdout.write(
    `simulated: two Llama-3-8B replicas (H100, ${KV_BLOCKS} KV blocks of 16 tokens each); capacity ${fmt(cap)} req/s on this workload; conversations (${fmt(turns)} turns each) start at ${fmt(rate, 2)}/s (~${Math.round(LOAD * 100)} %)\n`,
  );
  const runs = ROUTERS.map((x) => ({ ...x, ...run(scenario({ ...x, rate, conversation: CONVERSATION })) }));
  table(
    'multi-turn conversations',
    runs.map((x) => ({ name: x.name, r: x.report })),
  );
  const [withP, without] = runs as [(typeof runs)[0], (typeof runs)[0]];
  const prompt = withP.report.prefix?.promptTokens ?? 1;
  const oracleHitRate = withP.oracleTokens / prompt;
  process.stdout.write(
    `oracle (longest cached prefix at every decision): hit rate ${fmt(oracleHitRate * 100)}%; cost with prefixes took ${fmt(((withP.report.prefix?.hitRate ?? 0) / Math.max(1e-9, oracleHitRate)) * 100)}% of it\n`,
  );

  const nrate = LOAD * capacity(NO_SHARED);
  const none = ROUTERS.slice(0, 2).map((x) => ({
    ...x,
    report: simulate(scenario({ ...x, rate: nrate, conversation: NO_SHARED })),
  }));
  table(
    `no shared prefixes (one turn each, ${fmt(nrate, 1)} req/s, ~${Math.round(LOAD * 100)} %)`,
    none.map((x) => ({ name: x.name, r: x.report })),
  );
  return {
    ttftP50Ratio: withP.report.ttftMs.p50 / without.report.ttftMs.p50,
    ttftP99Ratio: withP.report.ttftMs.p99 / without.report.ttftMs.p99,
    hitRate: withP.report.prefix?.hitRate ?? 0,
    withoutHitRate: without.report.prefix?.hitRate ?? 0,
    roundRobinHitRate: runs[2]!.report.prefix?.hitRate ?? 0,
    oracleHitRate,
    noSharedP99Ratio: none[0]!.report.ttftMs.p99 / none[1]!.report.ttftMs.p99,
    prefillTokensSaved: withP.report.prefix?.cachedTokens ?? 0,
  };
}

const round = (x: number | boolean): number | boolean => (typeof x === 'number' ? Math.round(x * 1000) / 1000 : x);
const sim = simulated();
const live = process.argv.includes('--sim-only') ? {} : await prefixLive({ seed: SEED, quick });
printFigures(Object.fromEntries(Object.entries({ ...sim, ...live }).map(([k, v]) => [k, round(v)])));
