// Prometheus metrics of a serving control plane (prom-client, a registry of its own): gauges read the live state on
// each scrape; counters and histograms are fed by request outcomes and steps.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { ControlPlane, TerminalOutcome } from '../actors/control-plane.ts';
import type { NodeLink } from '../actors/node-link.ts';

/** The metrics of one server. */
export interface ServerMetrics {
  readonly registry: Registry;
  /** Records a request's terminal outcome. */
  outcome(model: string, o: TerminalOutcome): void;
  /** Records a refusal that never reached the control plane (auth, bad frame, bad body). */
  refused(code: string): void;
  /** Records one executed step's batch size. */
  step(model: string, size: number): void;
  /** The exposition text. */
  text(): Promise<string>;
}

const LATENCY_BUCKETS = [1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 120_000];

/** Creates the metrics of a control plane and its node link. */
export function createServerMetrics(cp: ControlPlane, node: NodeLink): ServerMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const registers = [registry];
  const models = cp.scenario.models.map((m) => m.name);

  new Gauge({
    name: 'switchyard_queue_depth',
    help: 'Requests waiting for a first schedule, per model (replica queues plus requests held for a replica)',
    labelNames: ['model'],
    registers,
    collect() {
      const depth = new Map(models.map((m) => [m, 0]));
      for (const r of cp.placement.replicas.values())
        depth.set(r.model, (depth.get(r.model) ?? 0) + r.batcher.stats().waiting);
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
        running.set(r.model, (running.get(r.model) ?? 0) + r.batcher.stats().running);
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
        const st = r.batcher.stats();
        this.set({ replica: r.id, model: r.model }, st.blocksTotal > 0 ? st.blocksUsed / st.blocksTotal : 0);
      }
    },
  });
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
  const histogram = (name: string, help: string): Histogram<'model'> =>
    new Histogram({ name, help, labelNames: ['model'], buckets: LATENCY_BUCKETS, registers });
  const ttft = histogram('switchyard_ttft_ms', 'Time to first token of completed requests (ms)');
  const tpot = histogram('switchyard_tpot_ms', 'Time per output token after the first, of completed requests (ms)');
  const e2e = histogram('switchyard_e2e_ms', 'End-to-end latency of completed requests (ms)');
  const batch = new Histogram({
    name: 'switchyard_batch_size',
    help: 'Sequences per executed step',
    labelNames: ['model'],
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384],
    registers,
  });

  return {
    registry,
    outcome: (model, o) => {
      requests.inc({ model, outcome: o.outcome, code: o.code ?? '' });
      if (o.outcome === 'rejected') rejections.inc({ model, code: o.code ?? 'rejected' });
      if (o.tokens > 0) tokens.inc({ model }, o.tokens);
      if (o.outcome !== 'done') return;
      const { receivedAt, firstTokenAt, finishedAt } = o.timings;
      if (firstTokenAt >= 0) ttft.observe({ model }, firstTokenAt - receivedAt);
      if (firstTokenAt >= 0 && o.tokens > 1) tpot.observe({ model }, (finishedAt - firstTokenAt) / (o.tokens - 1));
      e2e.observe({ model }, finishedAt - receivedAt);
    },
    refused: (code) => edgeRefusals.inc({ code }),
    step: (model, size) => batch.observe({ model }, size),
    text: () => registry.metrics(),
  };
}
