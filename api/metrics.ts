// Prometheus metrics of a serving control plane (prom-client, a registry of its own): gauges read the live state on
// each scrape; counters and histograms are fed by request outcomes and steps.
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { SeriesHistogram, type HistogramSeries } from './series-histogram.ts';
import type { ControlPlane, TerminalOutcome } from '../actors/control-plane.ts';
import type { NodeLink } from '../actors/node-link.ts';
import { OUTCOME_CODES } from '../machines/outcomes.ts';
import type { PrefixReport } from '../actors/metrics/collector.ts';

/** The metrics of one server. */
export interface ServerMetrics {
  readonly registry: Registry;
  /** Records a request's terminal outcome. */
  outcome(model: string, o: TerminalOutcome): void;
  /** Records a refusal that never reached the control plane (auth, bad frame, bad body). */
  refused(code: string): void;
  /** Records one executed step's batch size. */
  step(model: string, size: number): void;
  /** Records `n` executed steps of mean batch size `size` (one progress report of a core). */
  steps(model: string, size: number, n: number): void;
  /** Records a handler that failed on one request (answered 500 on that request alone). */
  handlerFailed(): void;
  /** The exposition text. */
  text(): Promise<string>;
}

/** Latency buckets in seconds (Prometheus base units). */
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

/** The label a value gets: itself when it is one of the known values, else `unknown` (label sets stay bounded). */
const bounded =
  (known: ReadonlySet<string>) =>
  (v: string | null | undefined): string =>
    typeof v === 'string' && known.has(v) ? v : 'unknown';

/** Refusal codes of the edge itself, besides the outcome codes. */
export const EDGE_REFUSALS = [
  'slow_consumer',
  'unsupported_media_type',
  'forbidden_origin',
  'forbidden_host',
  'too_many_connections',
  'draining',
  'tenant_limit',
  'inbound_budget',
] as const;

/** Per-model sums over the replicas, for the queue, running and KV gauges. */
interface Load {
  waiting: number;
  running: number;
  blocksUsed: number;
  blocksTotal: number;
}

/** What the control plane knows now, per model and in total: waiting and running sequences, KV blocks. */
export function loadByModel(cp: ControlPlane): { total: Load; models: Map<string, Load> } {
  const zero = (): Load => ({ waiting: 0, running: 0, blocksUsed: 0, blocksTotal: 0 });
  const models = new Map(cp.scenario.models.map((m) => [m.name, zero()]));
  const total = zero();
  for (const r of cp.placement.replicas.values()) {
    const st = r.work.stats();
    for (const l of [models.get(r.model), total]) {
      if (!l) continue;
      l.waiting += st.waiting;
      l.running += st.running;
      l.blocksUsed += st.blocksUsed;
      l.blocksTotal += st.blocksTotal;
    }
  }
  return { total, models };
}

/** The Gateway API Inference Extension's model-server gauges: a pod total (no labels) and one series per model. */
function inferenceExtensionGauges(cp: ControlPlane, registers: Registry[]): void {
  const gauge = (name: string, help: string, pick: (l: Load) => number): void =>
    void new Gauge({
      name,
      help,
      labelNames: ['model'],
      registers,
      collect() {
        const { total, models } = loadByModel(cp);
        this.set({}, pick(total));
        for (const [m, l] of models) this.set({ model: m }, pick(l));
      },
    });
  gauge(
    'switchyard_num_requests_waiting',
    'Requests waiting for a first schedule (pod total; per model)',
    (l) => l.waiting,
  );
  gauge('switchyard_num_requests_running', 'Sequences in running batches (pod total; per model)', (l) => l.running);
  gauge('switchyard_kv_cache_usage_perc', 'Fraction (0..1) of KV cache blocks in use (pod total; per model)', (l) =>
    l.blocksTotal > 0 ? l.blocksUsed / l.blocksTotal : 0,
  );
}

/** Creates the metrics of a control plane and its node link. */
export function createServerMetrics(cp: ControlPlane, node: NodeLink): ServerMetrics {
  const registry = new Registry();
  // The event-loop delay histogram samples every 100 ms, not prom-client's default 10 ms: at 10 ms its timer alone
  // woke an idle control plane 100 times a second (~9 ms of CPU a second, several % of a real engine's step time).
  collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: 100 });
  const registers = [registry];
  const models = cp.scenario.models.map((m) => m.name);
  inferenceExtensionGauges(cp, registers);

  new Gauge({
    name: 'switchyard_queue_depth',
    help: 'Requests waiting for a first schedule, per model (replica queues plus requests held for a replica)',
    labelNames: ['model'],
    registers,
    collect() {
      const depth = new Map(models.map((m) => [m, 0]));
      for (const r of cp.placement.replicas.values())
        depth.set(r.model, (depth.get(r.model) ?? 0) + r.work.stats().waiting);
      for (const [m, v] of depth) this.set({ model: m }, v);
    },
  });
  new Gauge({
    name: 'switchyard_running_requests',
    help: 'Sequences in the running batch, per model',
    labelNames: ['model'],
    registers,
    collect() {
      const running = new Map(models.map((m) => [m, 0]));
      for (const r of cp.placement.replicas.values())
        running.set(r.model, (running.get(r.model) ?? 0) + r.work.stats().running);
      for (const [m, v] of running) this.set({ model: m }, v);
    },
  });
  new Gauge({
    name: 'switchyard_live_requests',
    help: 'Requests not yet terminal (queued, running, held or resuming)',
    registers,
    collect() {
      this.set(cp.live());
    },
  });
  new Gauge({
    name: 'switchyard_kv_usage_ratio',
    help: 'Fraction of a replica’s KV blocks in use',
    labelNames: ['replica', 'model'],
    registers,
    collect() {
      this.reset();
      for (const r of cp.placement.replicas.values()) {
        const st = r.work.stats();
        this.set({ replica: r.id, model: r.model }, st.blocksTotal > 0 ? st.blocksUsed / st.blocksTotal : 0);
      }
    },
  });
  new Gauge({
    name: 'switchyard_profile_fit_ratio',
    help:
      "A real engine's calibrated profile: predicted ÷ measured step time over its first steps, per model (absent " +
      'until judged; outside 0.75..1.25 the profile does not fit this machine)',
    labelNames: ['model'],
    registers,
    collect() {
      this.reset();
      for (const [model, f] of cp.profileFits.all()) if (f.ratio !== null) this.set({ model }, f.ratio);
    },
  });
  prefixMetrics(cp, registers, models);
  new Gauge({
    name: 'switchyard_replica_state',
    help: 'Replicas by machine state (1 for the current state)',
    labelNames: ['replica', 'model', 'state'],
    registers,
    collect() {
      this.reset();
      for (const r of cp.placement.replicas.values()) this.set({ replica: r.id, model: r.model, state: r.state() }, 1);
    },
  });
  new Gauge({
    name: 'switchyard_gpu_state',
    help: 'GPUs by state as placement sees them: offline, free, allocated, failed (1 for the current state)',
    labelNames: ['gpu', 'state'],
    registers,
    collect() {
      this.reset();
      for (const g of cp.placement.gpus.values()) {
        const state = !g.healthy ? 'failed' : !g.up ? 'offline' : g.owner ? 'allocated' : 'free';
        for (const s of ['offline', 'free', 'allocated', 'failed'])
          this.set({ gpu: String(g.index), state: s }, s === state ? 1 : 0);
      }
    },
  });
  new Gauge({
    name: 'switchyard_model_ready',
    help: 'Whether a ready replica of the model exists (1) or not (0)',
    labelNames: ['model'],
    registers,
    collect() {
      for (const m of models) {
        let ready = 0;
        for (const r of cp.placement.replicas.values()) if (r.model === m && r.accepting()) ready = 1;
        this.set({ model: m }, ready);
      }
    },
  });
  // Placement events are counted from the placement timeline so that every kind (including mode switches) shows up.
  let seenEvents = 0;
  const placementEvents = new Counter({
    name: 'switchyard_placement_events_total',
    help: 'Placement timeline events by kind',
    labelNames: ['kind'],
    registers,
    collect() {
      const evs = cp.placement.events;
      for (; seenEvents < evs.length; seenEvents++) placementEvents.inc({ kind: evs[seenEvents]!.kind });
    },
  });
  let seenSwitchEvents = 0;
  const switches = new Counter({
    name: 'switchyard_placement_switches_total',
    help: 'Placement mode switches (timeline events whose kind names a switch)',
    registers,
    collect() {
      const evs = cp.placement.events;
      for (; seenSwitchEvents < evs.length; seenSwitchEvents++)
        if (/switch/i.test(evs[seenSwitchEvents]!.kind)) switches.inc();
    },
  });
  new Gauge({
    name: 'switchyard_node_connected',
    help: 'Whether the worker is registered (1) or not (0)',
    registers,
    collect() {
      this.set(node.connected() ? 1 : 0);
    },
  });
  new Gauge({
    name: 'switchyard_node_registrations',
    help: 'Worker registrations since start (each with a new epoch)',
    registers,
    collect() {
      this.set(node.status().registrations);
    },
  });
  return { registry, ...outcomeMetrics(registers, models), text: () => registry.metrics() };
}

/** Prefix reuse of models with a prefix cache: prompt tokens of requests that were scheduled, and the tokens their
 * replica held cached when each was first scheduled (so cached ÷ prompt is the hit rate), counted as each ends. */
function prefixMetrics(cp: ControlPlane, registers: Registry[], models: readonly string[]): void {
  const cached = new Set(cp.scenario.models.filter((m) => m.batching.prefixCache).map((m) => m.name));
  const counter = (name: string, help: string, of: (p: PrefixReport) => number): void => {
    // Counters read the collector's running totals on each scrape and add what came since the last one.
    const seen = new Map<string, number>();
    const c: Counter<'model'> = new Counter({
      name,
      help,
      labelNames: ['model'],
      registers,
      collect() {
        for (const model of models) {
          if (!cached.has(model)) continue;
          const p = cp.collector.prefix(model);
          const total = p ? of(p) : 0;
          const d = total - (seen.get(model) ?? 0);
          seen.set(model, total);
          c.inc({ model }, Math.max(0, d));
        }
      },
    });
  };
  counter(
    'switchyard_prefix_prompt_tokens_total',
    'Prompt tokens of scheduled requests of models with a prefix cache (counted when each request ends)',
    (p) => p.promptTokens,
  );
  counter(
    'switchyard_prefix_cached_tokens_total',
    "Of those, the tokens the request's replica held cached when it was first scheduled (prefill saved)",
    (p) => p.cachedTokens,
  );
}

/** The counters and histograms fed by outcomes, steps and refusals; every label value is bounded. */
function outcomeMetrics(registers: Registry[], models: readonly string[]): Omit<ServerMetrics, 'registry' | 'text'> {
  const modelLabel = bounded(new Set(models));
  const codeLabel = bounded(new Set(Object.keys(OUTCOME_CODES)));
  const refusalLabel = bounded(new Set([...Object.keys(OUTCOME_CODES), ...EDGE_REFUSALS]));
  const requests = new Counter({
    name: 'switchyard_requests_total',
    help: 'Requests by terminal outcome',
    labelNames: ['model', 'outcome', 'code'],
    registers,
  });
  const rejections = new Counter({
    name: 'switchyard_rejections_total',
    help: 'Rejected requests by code',
    labelNames: ['model', 'code'],
    registers,
  });
  const edgeRefusals = new Counter({
    name: 'switchyard_edge_refusals_total',
    help: 'Refusals at the edge (auth, bad frames, bad bodies)',
    labelNames: ['code'],
    registers,
  });
  const tokens = new Counter({
    name: 'switchyard_output_tokens_total',
    help: 'Tokens streamed to clients',
    labelNames: ['model'],
    registers,
  });
  const histogram = (name: string, help: string, buckets = LATENCY_BUCKETS): SeriesHistogram<'model'> =>
    new SeriesHistogram({ name, help, label: 'model', buckets, registers });
  const ttft = histogram('switchyard_ttft_seconds', 'Time to first token of completed requests');
  const tpot = histogram('switchyard_tpot_seconds', 'Time per output token after the first, of completed requests');
  const e2e = histogram('switchyard_e2e_seconds', 'End-to-end latency of completed requests');
  const handlerFailures = new Counter({
    name: 'switchyard_http_handler_failures_total',
    help: 'HTTP requests whose handler failed (answered 500 on that request alone)',
    registers,
  });
  const batch = histogram(
    'switchyard_batch_size',
    'Sequences per executed step',
    [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384],
  );

  // The series of each bounded label set, looked up once: every request and every step records into them (the
  // histograms without hashing their labels; prom-client's counters still validate and hash on each call).
  const perModel = new Map<
    string,
    {
      tokens: Counter.Internal;
      ttft: HistogramSeries;
      tpot: HistogramSeries;
      e2e: HistogramSeries;
      batch: HistogramSeries;
    }
  >();
  const seriesOf = (model: string) => {
    let m = perModel.get(model);
    if (!m) {
      m = {
        tokens: tokens.labels({ model }),
        ttft: ttft.seriesOf(model),
        tpot: tpot.seriesOf(model),
        e2e: e2e.seriesOf(model),
        batch: batch.seriesOf(model),
      };
      perModel.set(model, m);
    }
    return m;
  };
  const outcomeSeries = new Map<string, Counter.Internal>();
  const outcomeOf = (model: string, outcome: string, code: string): Counter.Internal => {
    const k = `${model}\u0000${outcome}\u0000${code}`;
    let c = outcomeSeries.get(k);
    if (!c) {
      c = requests.labels({ model, outcome, code });
      outcomeSeries.set(k, c);
    }
    return c;
  };

  return {
    outcome: (name, o) => {
      // A client chooses the model string: only configured names become labels, so series stay bounded.
      const model = modelLabel(name);
      const code = o.code === undefined ? '' : codeLabel(o.code);
      const m = seriesOf(model);
      outcomeOf(model, o.outcome, code).inc();
      if (o.outcome === 'rejected') rejections.inc({ model, code: code || 'rejected' });
      if (o.tokens > 0) m.tokens.inc(o.tokens);
      if (o.outcome !== 'done') return;
      const { receivedAt, firstTokenAt, finishedAt } = o.timings;
      if (firstTokenAt >= 0) ttft.record(m.ttft, (firstTokenAt - receivedAt) / 1000);
      if (firstTokenAt >= 0 && o.tokens > 1) tpot.record(m.tpot, (finishedAt - firstTokenAt) / (o.tokens - 1) / 1000);
      e2e.record(m.e2e, (finishedAt - receivedAt) / 1000);
    },
    refused: (code) => edgeRefusals.inc({ code: refusalLabel(code) }),
    step: (model, size) => batch.record(seriesOf(modelLabel(model)).batch, size),
    steps: (model, size, n) => {
      const series = seriesOf(modelLabel(model)).batch;
      for (let i = 0; i < n; i++) batch.record(series, size);
    },
    handlerFailed: () => handlerFailures.inc(),
  };
}
