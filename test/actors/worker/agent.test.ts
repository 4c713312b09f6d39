// The node agent hosts each cost-model replica's engine core: the control plane submits sequences and hears one
// progress report per step, over the simulated link on the virtual clock, as a worker process would over a socket.
import { describe, expect, it } from 'vitest';
import { startNodeAgent, type NodeAgent } from '../../../actors/worker/agent.ts';
import { costModelFor } from '../../../actors/gpu/profile-cost-model.ts';
import { createVirtualClock, type VirtualClock } from '../../../runtime/clock.ts';
import { createRng } from '../../../runtime/rng.ts';
import { createRuntime, type Msg, type Runtime } from '../../../runtime/system.ts';
import { connectSimLink } from '../../../transport/sim-link.ts';
import type { MessageOf, WireCoreSpec } from '../../../machines/messages.ts';
import type { SubmitSeq } from '../../../machines/core-messages.ts';

const R = 'replica.m@v#0';
type Progress = MessageOf<'seq.progress'>;

/** A control plane's side of one node: what each replica and placement heard, and a way to send. */
interface World {
  clock: VirtualClock;
  control: Runtime;
  nodeRt: Runtime;
  agent: NodeAgent;
  /** Every message a replica heard, by replica id. */
  heard(replica?: string): Msg[];
  progress(replica?: string): Progress[];
  placement: Msg[];
  send(to: string, msg: Msg): void;
  /** Runs the clock until nothing is pending, or until `ms` from now. */
  run(ms?: number): void;
}

function world(gpus = [0, 1, 2, 3], codec = true): World {
  const clock = createVirtualClock();
  const rng = createRng(11);
  const control = createRuntime({ name: 'control', clock, rng: rng.fork('control') });
  const nodeRt = createRuntime({ name: 'node', clock, rng: rng.fork('node') });
  connectSimLink(control, nodeRt, clock, rng.fork('link'), { latencyMs: 0.05, jitterMs: 0.01, codec });
  const inboxes = new Map<string, Msg[]>();
  const inbox = (id: string): Msg[] => {
    let box = inboxes.get(id);
    if (!box) {
      box = [];
      inboxes.set(id, box);
      control.register(id, (m) => box!.push(m));
    }
    return box;
  };
  const placement = inbox('placement');
  inbox(R);
  const agent = startNodeAgent(nodeRt, { gpus, repairMs: 1_000 });
  const w: World = {
    clock,
    control,
    nodeRt,
    agent,
    heard: (replica = R) => inbox(replica),
    progress: (replica = R) => inbox(replica).filter((m): m is Progress => m.type === 'seq.progress'),
    placement,
    send: (to, msg) => control.send(to, msg),
    run: (ms) => void clock.run(ms === undefined ? undefined : clock.now() + ms),
  };
  w.run();
  return w;
}

const limits: WireCoreSpec['limits'] = {
  policy: 'chunked',
  maxRunning: 16,
  tokenBudget: 512,
  blockTokens: 16,
  blocksTotal: 2_000,
  maxContext: 4_096,
  watermarkBlocks: 0,
};

/** Assigns `replica` at `epoch` on `gpus` (a core over all of them), and lets the ranks load. */
function assign(w: World, gpus: number[], o: { replica?: string; epoch?: number; only?: number[] } = {}): void {
  const replica = o.replica ?? R;
  for (const g of o.only ?? gpus) {
    w.send(`gpu.${g}`, {
      type: 'gpu.assign',
      gpu: g,
      replica,
      epoch: o.epoch ?? 1,
      model: 'llama-3-8b',
      gpuType: 'H100-SXM',
      tp: gpus.length,
      loadMs: 1_000,
      unloadMs: 100,
      core: { gpus, owner: 'm@v', limits, check: true },
    });
  }
  w.run();
}

const seq = (id: string, outputTokens: number, promptTokens = 100): SubmitSeq => ({
  id,
  priority: 0,
  order: Number(id.replace(/\D/g, '')) || 0,
  promptTokens,
  outputTokens,
  maxTokens: outputTokens,
  estOutputTokens: outputTokens,
  generated: 0,
});

const submit = (w: World, seqs: SubmitSeq[], epoch = 1, replica = R): void =>
  w.send('node', { type: 'seq.submit', replica, epoch, seqs });

/** Tokens per sequence and finishes per sequence, from progress events (a `g` is one token for each of the last
 * decode set named). */
function streams(reports: readonly Progress[]): { tokens: Map<string, number>; finished: Map<string, number> } {
  const tokens = new Map<string, number>();
  const finished = new Map<string, number>();
  let decoding: readonly string[] = [];
  const add = (id: string, n: number): void => void tokens.set(id, (tokens.get(id) ?? 0) + n);
  for (const r of reports) {
    for (const e of r.events) {
      if (e.k === 't') add(e.id, e.n);
      else if (e.k === 'g') {
        if (e.ids) decoding = e.ids;
        for (const id of decoding) add(id, 1);
      } else if (e.k === 'f') finished.set(e.id, (finished.get(e.id) ?? 0) + 1);
    }
  }
  return { tokens, finished };
}

describe('node agent', () => {
  describe('with a cost-model replica assigned with its core', () => {
    it('streams every submitted sequence to its end, one progress report per step', () => {
      const w = world();
      assign(w, [0, 1]);
      expect(w.heard().filter((m) => m.type === 'gpu.loaded')).toHaveLength(2);
      submit(w, [seq('req.1', 5), seq('req.2', 9), seq('req.3', 1)]);
      w.run();
      const reports = w.progress();
      const { tokens, finished } = streams(reports);
      expect(Object.fromEntries(tokens)).toEqual({ 'req.1': 5, 'req.2': 9, 'req.3': 1 });
      expect(Object.fromEntries(finished)).toEqual({ 'req.1': 1, 'req.2': 1, 'req.3': 1 });
      const last = reports.at(-1)!;
      expect(last.load).toMatchObject({ waiting: 0, running: 0, received: 3, inflightMs: 0 });
      // One report per step, none in between: the core reports after each step it completes.
      expect(reports).toHaveLength(last.load.stepCount);
      for (const r of reports) expect(r).toMatchObject({ replica: R, epoch: 1 });
      for (const r of reports) expect(r.ranks).toBeUndefined();
      // Both ranks ran every step and are credited with it; nothing is left in flight.
      expect(w.agent.busyMs(0)).toBeCloseTo(last.load.stepBusyMs, 6);
      expect(w.agent.busyMs(1)).toBeCloseTo(last.load.stepBusyMs, 6);
      expect(w.agent.inflight(0)).toBeNull();
    });

    it('takes a step as long as the roofline predicts, times its slowest rank', () => {
      const w = world();
      assign(w, [0, 1]);
      w.send('node', { type: 'gpu.inject', gpu: 1, fault: 'straggle', factor: 3 });
      submit(w, [seq('req.1', 2, 512)]);
      w.run();
      const [first] = w.progress();
      const cost = costModelFor('llama-3-8b', 'H100-SXM', 2);
      const prefillMs = cost.stepS({ prefill: [{ tokens: 512, cached: 0 }], decodeBatch: 0, decodeContext: 0 }) * 1000;
      expect(first!.at - first!.start).toBeCloseTo(3 * prefillMs, 6);
      expect(first!.load.stepPredictedMs).toBeCloseTo(prefillMs, 6);
      expect(w.agent.busyMs(1)).toBeCloseTo(3 * w.agent.busyMs(0), 6);
    });

    it('starts the core only once every rank it names serves the epoch', () => {
      const w = world();
      assign(w, [0, 1], { only: [0] });
      submit(w, [seq('req.1', 3)]);
      w.run();
      expect(w.progress()).toEqual([]);
      expect(w.nodeRt.dropped.get('seq.submit')).toBe(1);
      assign(w, [0, 1], { only: [1] });
      submit(w, [seq('req.2', 3)]);
      w.run();
      expect(Object.fromEntries(streams(w.progress()).finished)).toEqual({ 'req.2': 1 });
    });

    it('stops progress on a hung rank, with one partial report naming the ranks that finished the step', () => {
      const w = world();
      assign(w, [0, 1, 2, 3]);
      w.send('node', { type: 'gpu.inject', gpu: 1, fault: 'hang' });
      submit(w, [seq('req.1', 50)]);
      w.run();
      const reports = w.progress();
      expect(reports).toHaveLength(1);
      expect(reports[0]).toMatchObject({ ranks: [0, 2, 3], events: [] });
      expect(reports[0]!.load.inflightPredictedMs).toBeGreaterThan(0);
      // The hung rank is still in the step; the others finished it and were credited.
      expect(w.agent.inflight(1)).toMatchObject({ replica: R, epoch: 1, since: reports[0]!.start });
      expect(w.agent.inflight(0)).toBeNull();
      expect(w.agent.busyMs(0)).toBeGreaterThan(0);
      expect(w.agent.busyMs(1)).toBe(0);
    });

    it('stops the core when a rank fails: no more progress, later submits dropped and counted', () => {
      const w = world();
      assign(w, [0, 1]);
      submit(w, [seq('req.1', 2_000)]);
      w.run(200);
      const before = w.progress().length;
      expect(before).toBeGreaterThan(0);
      w.send('node', { type: 'gpu.inject', gpu: 0, fault: 'fault' });
      w.run();
      expect(w.progress().length - before).toBeLessThanOrEqual(1);
      expect(streams(w.progress()).finished.size).toBe(0);
      expect(w.placement).toContainEqual({ type: 'gpu.failed', gpu: 0, code: 'xid_79', replica: R, epoch: 1 });
      expect(w.agent.inflight(1)).toBeNull();
      submit(w, [seq('req.2', 3)]);
      w.send('node', { type: 'seq.cancel', replica: R, epoch: 1, ids: ['req.1'] });
      w.run();
      expect(w.nodeRt.dropped.get('seq.submit')).toBe(1);
      expect(w.nodeRt.dropped.get('seq.cancel')).toBe(1);
    });

    it('stops the core when its replica is released or fenced', () => {
      for (const leave of ['release', 'fence', 'silent'] as const) {
        const w = world();
        assign(w, [0, 1]);
        submit(w, [seq('req.1', 2_000)]);
        w.run(100);
        if (leave === 'release')
          for (const g of [0, 1]) w.send(`gpu.${g}`, { type: 'gpu.release', gpu: g, replica: R, epoch: 1 });
        else if (leave === 'fence') w.send('node', { type: 'gpu.fence', gpu: 1, code: 'missed_heartbeats', fence: 1 });
        else w.send('node', { type: 'gpu.inject', gpu: 1, fault: 'silent' });
        w.run(1);
        const n = w.progress().length;
        w.run();
        expect(w.progress().length, leave).toBe(n);
        submit(w, [seq('req.2', 3)]);
        w.run();
        expect(w.nodeRt.dropped.get('seq.submit'), leave).toBe(1);
      }
    });

    it('runs a new core for a newer epoch of the replica, and drops what names the old one', () => {
      const w = world();
      assign(w, [0]);
      w.send('node', { type: 'gpu.fence', gpu: 0, code: 'missed_heartbeats' });
      w.run();
      assign(w, [0], { epoch: 2 });
      submit(w, [seq('req.1', 3)], 1);
      submit(w, [seq('req.2', 3)], 2);
      w.run();
      expect(w.nodeRt.dropped.get('seq.submit')).toBe(1);
      const reports = w.progress();
      expect(reports.every((r) => r.epoch === 2)).toBe(true);
      expect(Object.fromEntries(streams(reports).finished)).toEqual({ 'req.2': 1 });
    });

    it('drops every sequence when orphaned, and serves the next control plane with the replica still loaded', () => {
      const w = world();
      assign(w, [0, 1]);
      submit(w, [seq('req.1', 1_000), seq('req.2', 1_000), seq('req.3', 1_000)]);
      w.run(50);
      expect(w.agent.orphan()).toBe(3);
      const n = w.progress().length;
      w.run();
      expect(w.progress()).toHaveLength(n);
      expect(w.agent.inventory().devices.slice(0, 2)).toEqual([
        { gpu: 0, state: 'serving', replica: R, epoch: 1 },
        { gpu: 1, state: 'serving', replica: R, epoch: 1 },
      ]);
      submit(w, [seq('req.4', 4)]);
      w.run();
      const after = w.progress().slice(n);
      expect(Object.fromEntries(streams(after).tokens)).toEqual({ 'req.4': 4 });
      expect(after.at(-1)!.load.received).toBe(1);
    });

    it('cancels a sequence at once: it leaves with no event', () => {
      const w = world();
      assign(w, [0]);
      submit(w, [seq('req.1', 1_000), seq('req.2', 20)]);
      w.run(20);
      w.send('node', { type: 'seq.cancel', replica: R, epoch: 1, ids: ['req.1'] });
      w.run();
      const { finished } = streams(w.progress());
      expect(Object.fromEntries(finished)).toEqual({ 'req.2': 1 });
      expect(w.progress().at(-1)!.load).toMatchObject({ waiting: 0, running: 0 });
    });

    it('answers stateless items with their batch results', () => {
      const w = world();
      w.send('gpu.0', {
        type: 'gpu.assign',
        gpu: 0,
        replica: R,
        epoch: 1,
        model: 'llama-3-8b',
        gpuType: 'H100-SXM',
        tp: 1,
        loadMs: 10,
        unloadMs: 10,
        core: {
          gpus: [0],
          owner: 'm@v',
          limits,
          stateless: {
            maxSize: 4,
            maxTokens: 4_096,
            maxMemoryBytes: 1e9,
            maxDelayMs: 2,
            buckets: [64, 128],
            bytesPerToken: 1_000,
            maxQueued: 100,
          },
        },
      });
      w.run();
      const items = ['a.1', 'a.2', 'a.3'].map((id) => ({ id, tokens: 50, dtype: 'bf16', adapter: null, options: {} }));
      w.send('node', { type: 'seq.submit', replica: R, epoch: 1, items });
      w.run();
      const fs = w
        .progress()
        .flatMap((r) => r.events)
        .filter((e) => e.k === 'f');
      expect(fs.map((e) => e.id).sort()).toEqual(['a.1', 'a.2', 'a.3']);
      for (const f of fs) expect(f).toMatchObject({ reason: 'done', size: 3 });
      for (const f of fs) expect(f).not.toHaveProperty('error');
    });

    it('takes replica and sequence ids named like Object.prototype members as plain names, over the codec', () => {
      const w = world([0, 1], true);
      for (const name of ['constructor', '__proto__', 'toString']) {
        submit(w, [seq(name, 2)], 1, name);
        w.send('node', { type: 'seq.cancel', replica: name, epoch: 1, ids: [name] });
      }
      w.run();
      expect(w.nodeRt.dropped.get('seq.submit')).toBe(3);
      expect(w.nodeRt.dropped.get('seq.cancel')).toBe(3);
      // The replica's inbox on the control plane (an id no runtime has would bounce between the two).
      w.heard('constructor');
      assign(w, [0], { replica: 'constructor' });
      submit(w, [seq('__proto__', 2), seq('constructor', 2)], 1, 'constructor');
      w.run();
      const { finished } = streams(w.progress('constructor'));
      expect([...finished.keys()].sort()).toEqual(['__proto__', 'constructor']);
      expect(w.nodeRt.faults).toEqual([]);
    });
  });
});
