// One conformance suite for every node link (link.ts over a WebSocket peer, over the simulated wire): what a tick
// sends leaves as frames of at most MAX_ENVELOPES_PER_FRAME envelopes and arrives in order; nothing reaches the
// receiver that the codec or the schema refuses, that exceeds the one frame cap, or that is addressed where the
// sender may not send; what is sent on a closed link is counted as dropped.
import { describe, expect, it } from 'vitest';
import { encode } from '../../transport/codec.ts';
import { MAX_ENVELOPES_PER_FRAME, type Link } from '../../transport/link.ts';

/** A sending link and a receiving link joined by one carrier (WebSocket or simulated wire). */
export interface LinkPair {
  tx: Link;
  rx: Link;
  /** What rx delivered, as `to:type:gpu`. */
  got: string[];
  /** Reasons rx gave for refused frames. */
  refusals: string[];
  /** Puts raw data on the carrier towards rx, as a misbehaving peer would. */
  raw(data: Uint8Array | string): void;
  /** Lets (wall or virtual) time pass until `done()` holds, or fails. */
  until(done: () => boolean): Promise<void>;
  /** Closes the carrier and waits until the sending side knows it. */
  close(): Promise<void>;
}

/** Makes a connected pair whose receiver accepts the destinations `accepts` allows. */
export type MakeLinkPair = (accepts: (to: string) => boolean) => Promise<LinkPair>;

const release = (g: number) => ({ type: 'gpu.release', gpu: g, replica: 'r', epoch: 1 }) as const;
const all = (): boolean => true;

/** Runs the conformance suite against one kind of link. */
export function describeLinkConformance(name: string, makePair: MakeLinkPair): void {
  describe(`${name} link conformance`, () => {
    it('sends everything queued in one tick as one frame and delivers it in order', async () => {
      const p = await makePair(all);
      for (let g = 0; g < 5; g++) p.tx.send(`gpu.${g}`, release(g));
      await p.until(() => p.got.length >= 5);
      expect(p.got).toEqual([0, 1, 2, 3, 4].map((g) => `gpu.${g}:gpu.release:${g}`));
      expect(p.tx.stats.framesOut).toBe(1);
      expect(p.tx.stats.messagesOut).toBe(5);
      expect(p.rx.stats.framesIn).toBe(1);
      expect(p.rx.stats.messagesIn).toBe(5);
      expect(p.rx.stats.bytesIn).toBe(p.tx.stats.bytesOut);
    });

    it('splits a tick busier than the frame cap over several frames, in order', async () => {
      const p = await makePair(all);
      const n = 2 * MAX_ENVELOPES_PER_FRAME + 1;
      for (let i = 0; i < n; i++) p.tx.send(`gpu.${i % 8}`, release(i % 8));
      await p.until(() => p.got.length >= n);
      expect(p.got).toEqual(Array.from({ length: n }, (_, i) => `gpu.${i % 8}:gpu.release:${i % 8}`));
      expect(p.tx.stats.framesOut).toBe(3);
      expect(p.rx.stats.framesIn).toBe(3);
      expect(p.rx.stats.refused).toBe(0);
    });

    it('keeps order across ticks', async () => {
      const p = await makePair(all);
      p.tx.send('gpu.1', release(1));
      p.tx.flush();
      p.tx.send('gpu.2', release(2));
      await p.until(() => p.got.length >= 2);
      expect(p.got).toEqual(['gpu.1:gpu.release:1', 'gpu.2:gpu.release:2']);
      expect(p.tx.stats.framesOut).toBe(2);
    });

    it('refuses frames the codec, the schema or the frame cap rejects, and stays usable', async () => {
      const p = await makePair(all);
      const over = Array.from({ length: MAX_ENVELOPES_PER_FRAME + 1 }, () => ({ to: 'gpu.0', msg: release(0) }));
      p.raw(new Uint8Array([0xc1]));
      p.raw(encode([{ to: 'gpu.1', msg: { ...release(1), gpu: -1 } }]));
      p.raw(encode([{ to: 'gpu.1', msg: { type: 'no.such.message' } }]));
      p.raw('text is not a node frame');
      p.raw(encode(over));
      p.raw(encode([{ to: 'gpu.1', msg: { type: 'gpu.ready', gpu: 1 } }]));
      await p.until(() => p.got.length >= 1);
      expect(p.got).toEqual(['gpu.1:gpu.ready:1']);
      expect(p.rx.stats.refused).toBe(5);
      expect(p.refusals[0]).toMatch(/malformed/);
      expect(p.refusals[1]).toMatch(/invalid_message/);
      expect(p.refusals[3]).toMatch(/text frame/);
      expect(p.refusals[4]).toMatch(/invalid_message/);
    });

    it('drops envelopes addressed where the peer may not send', async () => {
      const p = await makePair((to) => to.startsWith('gpu.'));
      p.tx.send('router', { type: 'gpu.ready', gpu: 0 });
      p.tx.send('gpu.2', { type: 'gpu.ready', gpu: 2 });
      await p.until(() => p.got.length >= 1);
      expect(p.got).toEqual(['gpu.2:gpu.ready:2']);
      expect(p.rx.stats.misaddressed).toBe(1);
      expect(p.rx.stats.messagesIn).toBe(1);
    });

    it('counts messages sent while the link is closed as dropped, and delivers none of them', async () => {
      const p = await makePair(all);
      await p.close();
      p.tx.send('gpu.0', { type: 'gpu.ready', gpu: 0 });
      p.tx.send('gpu.1', { type: 'gpu.ready', gpu: 1 });
      p.tx.flush();
      expect(p.tx.stats.dropped).toBe(2);
      expect(p.tx.stats.messagesOut).toBe(0);
      expect(p.got).toEqual([]);
    });
  });
}
