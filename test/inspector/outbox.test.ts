import { describe, expect, it } from 'vitest';
import { createOutbox } from '../../inspector/outbox.ts';
import type { Frame } from '../../inspector/protocol.ts';

const place = (i: number): Frame => ({ k: 'place', t: i, ev: { i } });

describe('the inspector outbox', () => {
  it('hands frames over oldest first, at most `max` at a time', () => {
    const box = createOutbox(10);
    for (let i = 0; i < 5; i++) box.push(place(i));
    expect(box.take(3, 0).map((f) => f.t)).toEqual([0, 1, 2]);
    expect(box.take(3, 0).map((f) => f.t)).toEqual([3, 4]);
    expect(box.take(3, 0)).toEqual([]);
  });

  it('drops the oldest frames when full and says how many before the next batch', () => {
    const box = createOutbox(4);
    for (let i = 0; i < 10; i++) box.push(place(i));
    expect(box.size()).toBe(4);
    const batch = box.take(100, 42);
    expect(batch[0]).toEqual({ k: 'dropped', t: 42, n: 6 });
    expect(batch.slice(1).map((f) => f.t)).toEqual([6, 7, 8, 9]);
    expect(box.take(100, 43)).toEqual([]);
    expect(box.droppedTotal).toBe(6);
  });

  it('refuses a capacity that is not a positive integer', () => {
    expect(() => createOutbox(0)).toThrow(RangeError);
    expect(() => createOutbox(1.5)).toThrow(RangeError);
  });
});
