// The node's inspection relay: GPU actors' snapshots cross the link only while a watch lease holds, each GPU's
// current state first; the lease lapses by itself, ends at once with a zero lease, and a storm is cut at its bound.
import { describe, expect, it } from 'vitest';
import { startNodeAgent } from '../../../actors/worker/agent.ts';
import { MAX_SNAPSHOTS_PER_S } from '../../../actors/worker/inspect-relay.ts';
import { createVirtualClock } from '../../../runtime/clock.ts';
import { createRng } from '../../../runtime/rng.ts';
import { createRuntime, type Msg } from '../../../runtime/system.ts';

function node() {
  const clock = createVirtualClock();
  const rt = createRuntime({ name: 'node', clock, rng: createRng(1) });
  const out: { t: number; to: string; msg: Msg }[] = [];
  rt.setRemote((to, msg) => out.push({ t: clock.now(), to, msg }));
  const agent = startNodeAgent(rt, { gpus: [0, 1, 2, 3], repairMs: 1000 });
  clock.run(100);
  const snapshots = () => out.filter((o) => o.msg.type === 'inspect.snapshot');
  return { clock, rt, agent, out, snapshots, run: (ms: number) => clock.run(clock.now() + ms) };
}

describe('the inspection relay', () => {
  it('forwards nothing until watched, then each GPU as it is now, then every change while the lease holds', () => {
    const n = node();
    expect(n.snapshots()).toEqual([]);
    n.rt.send('node', { type: 'inspect.watch', leaseMs: 5000 });
    const first = n.snapshots();
    expect(first.map((o) => (o.msg as { id: string }).id).sort()).toEqual(['gpu.0', 'gpu.1', 'gpu.2', 'gpu.3']);
    for (const o of first) expect(o).toMatchObject({ to: 'inspector', msg: { state: 'free', status: 'active' } });
    n.rt.send('node', { type: 'gpu.inject', gpu: 2, fault: 'fault' });
    expect(n.snapshots().at(-1)!.msg).toMatchObject({ id: 'gpu.2', state: 'failed', faultCode: 'xid_79' });
  });

  it('lapses by itself unless renewed, and ends at once on a zero lease', () => {
    const n = node();
    n.rt.send('node', { type: 'inspect.watch', leaseMs: 1000 });
    n.run(600);
    n.rt.send('node', { type: 'inspect.watch', leaseMs: 1000 });
    n.run(800);
    // Renewed at 600 ms: still on at 1,400 ms.
    const before = n.snapshots().length;
    n.rt.send('node', { type: 'gpu.inject', gpu: 1, fault: 'fault' });
    expect(n.snapshots().length).toBeGreaterThan(before);
    n.run(1000);
    const lapsed = n.snapshots().length;
    n.rt.send('node', { type: 'gpu.inject', gpu: 0, fault: 'fault' });
    expect(n.snapshots()).toHaveLength(lapsed);
    n.rt.send('node', { type: 'inspect.watch', leaseMs: 1000 });
    n.rt.send('node', { type: 'inspect.watch', leaseMs: 0 });
    const ended = n.snapshots().length;
    n.rt.send('node', { type: 'gpu.inject', gpu: 3, fault: 'fault' });
    expect(n.snapshots()).toHaveLength(ended);
  });

  it('cuts a storm of snapshots at its bound per second', () => {
    const n = node();
    n.rt.send('node', { type: 'inspect.watch', leaseMs: 60_000 });
    for (let i = 0; i < 2 * MAX_SNAPSHOTS_PER_S; i++) {
      n.rt.send('node', { type: 'gpu.inject', gpu: i % 4, fault: 'hang' });
      n.rt.send('node', { type: 'gpu.inject', gpu: i % 4, fault: 'repair' });
    }
    expect(n.snapshots().length).toBeLessThanOrEqual(MAX_SNAPSHOTS_PER_S);
    n.run(1000);
    n.rt.send('node', { type: 'gpu.inject', gpu: 0, fault: 'fault' });
    expect(n.snapshots().at(-1)!.msg).toMatchObject({ id: 'gpu.0', state: 'failed' });
  });
});
