// Forwarding a peer's encoded map without decoding it: the pre-scan that lets it through, the frame written around it
// (the forwarder's fields win), its frame of its own on a link, and its fields for anyone in the process who reads it.
import { describe, expect, it } from 'vitest';
import { decodeMessage, encode, scanMap, type ScannedMap } from '../../transport/codec.ts';
import { writeForwardedFrame } from '../../transport/frame-writer.ts';
import { forwardedMessage, forwardedOf } from '../../transport/forward.ts';
import { createLink, nodeFrameSchema, type FrameCarrier } from '../../transport/link.ts';
import { idleLoad, type CoreReport } from '../../machines/core-messages.ts';
import type { Msg } from '../../runtime/system.ts';

const report: CoreReport = {
  at: 12.5,
  start: 10,
  events: [
    { k: 't', id: 'a', n: 1, ids: [7], text: 'x' },
    { k: 'f', id: 'a', reason: 'length' },
  ],
  load: idleLoad({ running: 1, received: 1 }),
};
const own = { type: 'seq.progress', replica: 'replica.m#0', epoch: 3 } as const;

const scanned = (x: unknown): ScannedMap => {
  const r = scanMap(encode(x));
  if (!r.ok) throw new Error(r.error.message);
  return r.value;
};

describe('scanMap', () => {
  it('finds the entries of a map, small or large, without decoding it', () => {
    expect(scanned({ a: 1, b: 'x' })).toMatchObject({ entries: 2, offset: 1 });
    const big = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i]));
    expect(scanned(big)).toMatchObject({ entries: 20, offset: 3 });
  });

  it.each([
    ['a value that is not a map', encode([1, 2]), 'invalid_message'],
    ['a map cut short', Uint8Array.from([0x82, 0xa1, 0x61]), 'malformed'],
    ['a map with bytes after it', Uint8Array.from([0x80, 0xc0]), 'malformed'],
    // { __proto__: 1 }, as a peer could write it (this side's encoder refuses to)
    ['a map with a __proto__ key', Uint8Array.from([0x81, 0xa9, ...Buffer.from('__proto__'), 0x01]), 'forbidden_key'],
  ])('refuses %s', (_what, bytes, code) => {
    const r = scanMap(bytes);
    expect(r.ok ? undefined : r.error.code).toBe(code);
  });

  it('refuses a map nested deeper than its limits allow', () => {
    const deep = { a: { b: { c: { d: 1 } } } };
    const r = scanMap(encode(deep), {
      maxBytes: 1024,
      maxDepth: 3,
      maxArrayLength: 8,
      maxMapSize: 8,
      maxStringBytes: 64,
    });
    expect(r.ok ? undefined : r.error.code).toBe('too_deep');
  });
});

describe('a forwarded frame', () => {
  it("is one envelope whose message is the map's fields and the forwarder's, valid on the node link", () => {
    const bytes = writeForwardedFrame('replica.m#0', { map: scanned(report), own });
    const d = decodeMessage(bytes, nodeFrameSchema);
    expect(d.ok && d.value).toEqual([{ to: 'replica.m#0', msg: { ...report, ...own } }]);
  });

  it("gives the forwarder's fields the last word over the same fields in the map", () => {
    const lying = { ...report, replica: 'replica.other#0', epoch: 99, type: 'gpu.fault' };
    const bytes = writeForwardedFrame('replica.m#0', { map: scanned(lying), own });
    const d = decodeMessage(bytes, nodeFrameSchema);
    expect(d.ok && d.value[0]!.msg).toMatchObject(own);
  });
});

describe('a forwarded message', () => {
  it('reads as the message it stands for, decoding the map once', () => {
    let decodes = 0;
    const m = forwardedMessage<Record<string, unknown>>(own, scanned(report), () => {
      decodes++;
      return report;
    });
    expect(m.type).toBe('seq.progress');
    expect(decodes).toBe(0);
    expect(m.events).toEqual(report.events);
    expect({ ...m }).toEqual({ ...report, ...own });
    expect(decodes).toBe(1);
    expect(forwardedOf(m)?.own).toEqual(own);
    expect(forwardedOf({ ...own })).toBeUndefined();
  });

  it('travels in a frame of its own on a link, in order with the messages around it', () => {
    const frames: Uint8Array[] = [];
    const carrier: FrameCarrier = {
      isOpen: () => true,
      send: (d) => frames.push(d as Uint8Array) > 0,
      onMessage: () => undefined,
      close: () => undefined,
    };
    const link = createLink(carrier, { accepts: () => true, deliver: () => undefined });
    const beat = { type: 'node.heartbeat', node: 'n', epoch: 0, t: 1, gpus: [0] } as Msg;
    const fwd = forwardedMessage<Msg>(own, scanned(report), () => report);
    link.send('placement', beat);
    link.send('replica.m#0', fwd);
    link.send('placement', beat);
    link.flush();
    const decoded = frames.map((f) => {
      const d = decodeMessage(f, nodeFrameSchema);
      if (!d.ok) throw new Error(d.error.message);
      return d.value.map((e) => e.msg.type);
    });
    expect(decoded).toEqual([['node.heartbeat'], ['seq.progress'], ['node.heartbeat']]);
    expect(link.stats).toMatchObject({ framesOut: 3, messagesOut: 3 });
  });
});
