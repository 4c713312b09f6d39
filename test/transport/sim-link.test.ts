// The simulator's node link passes the link conformance suite on the virtual clock, and its own promises: a cut
// direction loses what is sent until healed, and frames arrive after the latency, FIFO per direction.
import { describe, expect, it } from 'vitest';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime } from '../../runtime/system.ts';
import { createLink } from '../../transport/link.ts';
import { connectSimLink, createSimWire } from '../../transport/sim-link.ts';
import { describeLinkConformance, type LinkPair } from './link-conformance.ts';

describeLinkConformance('simulated', async (accepts): Promise<LinkPair> => {
  const clock = createVirtualClock();
  const wire = createSimWire(clock, createRng(7), { latencyMs: 0.05, jitterMs: 0.02 });
  const got: string[] = [];
  const refusals: string[] = [];
  const defer = (flush: () => void): void => void clock.at(clock.now(), flush);
  const rx = createLink(wire.ba, {
    accepts,
    deliver: (to, m) => got.push(`${to}:${m.type}:${'gpu' in m ? m.gpu : ''}`),
    onRefused: (r) => refusals.push(r),
    defer,
  });
  const tx = createLink(wire.ab, { accepts: () => true, deliver: () => {}, defer });
  return {
    tx,
    rx,
    got,
    refusals,
    raw: (data) => void wire.ab.send(data),
    until: async (done) => {
      clock.run();
      if (!done()) throw new Error('the link delivered nothing once the clock ran out of events');
    },
    close: async () => wire.ab.close(),
  };
});

describe('connectSimLink', () => {
  const setup = (codec = true) => {
    const clock = createVirtualClock();
    const rng = createRng(3);
    const a = createRuntime({ name: 'control', clock, rng: rng.fork('a') });
    const b = createRuntime({ name: 'node', clock, rng: rng.fork('b') });
    const got: { t: number; gpu: number }[] = [];
    for (let g = 0; g < 8; g++)
      b.register(`gpu.${g}`, (m) => got.push({ t: clock.now(), gpu: 'gpu' in m ? m.gpu : -1 }));
    const link = connectSimLink(a, b, clock, rng.fork('link'), { latencyMs: 2, jitterMs: 1, codec });
    return { clock, a, link, got };
  };

  it('delivers after the latency, FIFO, and counts what it carried', () => {
    const { clock, a, link, got } = setup();
    for (let g = 0; g < 8; g++) a.send(`gpu.${g}`, { type: 'gpu.ready', gpu: g });
    clock.run();
    expect(got.map((x) => x.gpu)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(got.every((x) => x.t >= 2 && x.t <= 3)).toBe(true);
    expect(link.stats.messages).toBe(8);
    expect(link.stats.frames).toBe(1);
    expect(link.a.stats.messagesOut).toBe(8);
  });

  it('loses what is sent over a cut direction until it is healed', () => {
    const { clock, a, link, got } = setup();
    link.cut('aToB');
    a.send('gpu.1', { type: 'gpu.ready', gpu: 1 });
    clock.run();
    expect(got).toEqual([]);
    link.heal();
    a.send('gpu.2', { type: 'gpu.ready', gpu: 2 });
    clock.run();
    expect(got.map((x) => x.gpu)).toEqual([2]);
    expect(link.stats.messages).toBe(1);
  });

  it('carries frames as envelope arrays without the codec at the same times, in the same order, with the same counts', () => {
    const run = (codec: boolean) => {
      const { clock, a, link, got } = setup(codec);
      for (let g = 0; g < 8; g++) a.send(`gpu.${g}`, { type: 'gpu.ready', gpu: g });
      clock.run();
      a.send('gpu.3', { type: 'gpu.ready', gpu: 3 });
      clock.run();
      const { messages, frames, bytes } = link.stats;
      return {
        got,
        messages,
        frames,
        bytes,
        messagesOut: link.a.stats.messagesOut,
        messagesIn: link.b.stats.messagesIn,
      };
    };
    const bytes = run(true);
    const objects = run(false);
    expect(objects.got).toEqual(bytes.got);
    expect(objects.got.length).toBe(9);
    expect({ ...objects, bytes: 0 }).toEqual({ ...bytes, bytes: 0 });
    expect(objects.frames).toBe(2);
    expect(objects.bytes).toBe(0);
    expect(bytes.bytes).toBeGreaterThan(0);
  });
});
