// A worker paused as a whole (SIGSTOP then SIGCONT, a long GC pause) is one stall of the worker, not a fault of each
// GPU: its GPUs come back without the repair time, its streams continue without a repeated token, and a pause shorter
// than the node-loss bound fails nothing at all.
import { describe, expect, it } from 'vitest';
import { smallNode, stallWorld, type Stream } from './stall-world.ts';

const REPAIR_MS = 60_000;

describe('a worker paused for 5 s while eight replicas stream', () => {
  it('fails nothing when the pause is shorter than the node-loss bound, and every stream completes once', () => {
    // Node heartbeats every second, five missed make a lost node (6 s): the serving default.
    const w = stallWorld(smallNode({ heartbeatMs: 1000, missedHeartbeats: 5 }, REPAIR_MS));
    const streams: Stream[] = Array.from({ length: 16 }, () => w.submit('small', 200, 1500));
    w.run(2_000);
    const pausedAt = w.clock.now();
    w.pause(5_000);
    w.run(120_000);
    const events = w.cp.placement.events.filter((e) => e.t >= pausedAt);
    expect(events.filter((e) => e.kind === 'gpu.failed')).toEqual([]);
    expect(events.filter((e) => e.kind === 'replica.failed')).toEqual([]);
    expect(events.filter((e) => e.kind === 'node.stalled')).toHaveLength(1);
    for (const s of streams) expect(s).toMatchObject({ outcome: 'done', gaps: 0, terminals: 1, tokens: 1500 });
    expect(w.cp.violations).toEqual([]);
  });

  it('fences and resumes past the bound, then brings every GPU back without the repair time', () => {
    // Heartbeats every 500 ms, three missed: the worker is lost after 2 s of the 5 s pause.
    const w = stallWorld(smallNode({ heartbeatMs: 500, missedHeartbeats: 3 }, REPAIR_MS));
    const streams: Stream[] = Array.from({ length: 16 }, () => w.submit('small', 200, 3000));
    w.run(2_000);
    const pausedAt = w.clock.now();
    w.pause(5_000);
    const backAt = pausedAt + 5_000;
    w.run(180_000);
    const events = w.cp.placement.events.filter((e) => e.t >= pausedAt);
    const failed = events.filter((e) => e.kind === 'gpu.failed');
    expect(failed).toHaveLength(8);
    for (const e of failed) expect(e).toMatchObject({ path: 'heartbeat', detail: 'node_lost' });
    // Every GPU is probed and free again within a second of the worker's return, not after the 60 s repair.
    const ready = events.filter((e) => e.kind === 'gpu.ready');
    expect(new Set(ready.map((e) => e.gpu)).size).toBe(8);
    for (const e of ready) expect(e.t - backAt).toBeLessThan(1_000);
    // Full capacity again after one reload of the 8B model (about 13 s), far from the repair time.
    const replicasReady = events.filter((e) => e.kind === 'replica.ready');
    expect(replicasReady).toHaveLength(8);
    expect(Math.max(...replicasReady.map((e) => e.t)) - backAt).toBeLessThan(20_000);
    for (const g of w.cp.placement.gpus.values()) expect(g.healthy).toBe(true);
    // The interrupted streams resumed (re-prefilled) and completed: no token twice, none missing, one ending each.
    for (const s of streams) expect(s).toMatchObject({ outcome: 'done', gaps: 0, terminals: 1, tokens: 3000 });
    expect(w.cp.violations).toEqual([]);
  });
});
