// Counts every message on the node link, per direction, type and replica, while a control plane serves streams on a
// single-GPU and a two-GPU replica through the codec: the wire carries requests, not steps. The control plane sends a
// sequence's submit and cancel and lifecycle messages, none per step; each replica's engine core sends at most one
// progress report per step (never one per rank), and every report names a step of its own.
import { describe, expect, it } from 'vitest';
import { normalizeScenario, type Scenario } from '../../actors/config.ts';
import { startControlPlane } from '../../actors/control-plane.ts';
import { startNodeAgent } from '../../actors/worker/agent.ts';
import type { MessageOf } from '../../machines/messages.ts';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime, type Msg, type Runtime } from '../../runtime/system.ts';
import { connectSimLink } from '../../transport/sim-link.ts';

type Progress = MessageOf<'seq.progress'>;

/** What crossed the link into one side: every message with its destination and time. */
interface Heard {
  t: number;
  to: string;
  msg: Msg;
}

/** `rt` as the link sees it, recording every message the link delivers into it. */
function recording(rt: Runtime, log: Heard[], now: () => number): Runtime {
  return {
    ...rt,
    send: (to: string, msg: Msg) => {
      log.push({ t: now(), to, msg });
      rt.send(to, msg);
    },
  };
}

function scenario(): Scenario {
  return normalizeScenario({
    name: 'wire-count',
    seed: 5,
    node: { gpu: 'H100-SXM', gpus: 8 },
    placement: { policy: 'exclusive' },
    routing: { ejection: { failures: 1000 } },
    models: [
      { name: 'one', profile: 'llama-3-8b', tp: 1, replicas: 1 },
      { name: 'two', profile: 'llama-3-8b', tp: 2, replicas: 1 },
    ],
    traffic: [],
  });
}

/** Serves `n` streams per model (some cancelled mid-stream) and returns what crossed the link after placement. */
function serve(n: number, outputTokens: number, cancelAfterMs = 300) {
  const s = scenario();
  const clock = createVirtualClock();
  const rng = createRng(s.seed);
  const control = createRuntime({ name: 'control', clock, rng: rng.fork('control') });
  const nodeRt = createRuntime({ name: 'node', clock, rng: rng.fork('node') });
  const toNode: Heard[] = [];
  const toControl: Heard[] = [];
  const now = (): number => clock.now();
  connectSimLink(recording(control, toControl, now), recording(nodeRt, toNode, now), clock, rng.fork('link'), {
    latencyMs: 0.05,
    jitterMs: 0.01,
    codec: true,
  });
  const cp = startControlPlane(control, s, { checkInvariants: true });
  startNodeAgent(nodeRt, { gpus: [0, 1, 2, 3, 4, 5, 6, 7], repairMs: s.node.repairMs, heartbeatMs: 1000 });
  let booting = true;
  cp.placement.watch(() => {
    if (booting && cp.placement.settled()) clock.stop();
  });
  clock.run(600_000);
  booting = false;
  expect(cp.placement.settled()).toBe(true);
  const from = clock.now();
  const ids: string[] = [];
  const outcomes: string[] = [];
  for (let i = 0; i < n; i++) {
    for (const model of ['one', 'two']) {
      clock.at(from + i * 37, () => {
        const r = cp.submit(
          { model, promptTokens: 300 + 50 * (i % 5), maxTokens: outputTokens, outputTokens },
          { terminal: (_id, o) => outcomes.push(o.outcome) },
        );
        expect(r.ok).toBe(true);
        ids.push(r.id);
        // Every fifth stream is cancelled while it runs.
        if (i % 5 === 4) clock.at(clock.now() + cancelAfterMs, () => cp.cancel(r.id));
      });
    }
  }
  clock.run(from + 600_000);
  expect(cp.live()).toBe(0);
  expect(cp.violations).toEqual([]);
  const after = (h: Heard): boolean => h.t >= from;
  return { toNode: toNode.filter(after), toControl: toControl.filter(after), outcomes, submitted: ids.length };
}

const count = (hs: readonly Heard[], type: string): number => hs.filter((h) => h.msg.type === type).length;

describe('messages on the node link while replicas stream', () => {
  it('carries no message from the control plane per step, at most one progress report per step back', () => {
    const { toNode, toControl, outcomes, submitted } = serve(20, 120);
    expect(outcomes).toHaveLength(submitted);
    expect(outcomes.filter((o) => o === 'cancelled')).toHaveLength(8);
    // Down: one submit per sequence (no resumes: nothing failed) and one cancel per cancelled stream.
    expect(count(toNode, 'seq.submit')).toBe(submitted);
    expect(count(toNode, 'seq.cancel')).toBe(8);
    const progress = toControl.filter((h) => h.msg.type === 'seq.progress').map((h) => h.msg as unknown as Progress);
    const replicas = [...new Set(progress.map((p) => p.replica))].sort();
    expect(replicas).toHaveLength(2);
    let steps = 0;
    for (const id of replicas) {
      const mine = progress.filter((p) => p.replica === id);
      const last = mine.at(-1)!;
      // At most one report per step: never more reports than the core completed steps, each naming its own step.
      expect(mine.length).toBeLessThanOrEqual(last.load.stepCount);
      expect(new Set(mine.map((p) => p.start)).size).toBe(mine.length);
      // The two-GPU replica's core reports once per step, not once per rank.
      for (const p of mine) expect(p.ranks).toBeUndefined();
      steps += last.load.stepCount;
    }
    // Streams of 120 tokens take well over a hundred steps; everything else the control plane sent is a handful of
    // lifecycle and probe messages, not a message per step.
    expect(steps).toBeGreaterThan(200);
    const other = toNode.filter((h) => h.msg.type !== 'seq.submit' && h.msg.type !== 'seq.cancel');
    expect(other.length).toBeLessThan(steps / 10);
  });

  it('sends the same control-plane messages whether the streams take ten steps or a hundred', () => {
    const short = serve(10, 12, 5);
    const long = serve(10, 240, 5);
    const kinds = (hs: readonly Heard[]): Record<string, number> => {
      const out: Record<string, number> = {};
      for (const h of hs) if (h.msg.type.startsWith('seq.')) out[h.msg.type] = (out[h.msg.type] ?? 0) + 1;
      return out;
    };
    // Twenty times the steps, the same requests: the same submits and cancels down, more progress up.
    expect(kinds(long.toNode)).toEqual(kinds(short.toNode));
    expect(count(long.toControl, 'seq.progress')).toBeGreaterThan(5 * count(short.toControl, 'seq.progress'));
  });
});
