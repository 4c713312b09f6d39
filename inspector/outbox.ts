// A bounded frame buffer between the inspection stream and one reader: when full it drops the oldest frame, counts
// it, and the next batch the reader takes starts with a `dropped` frame saying how many were lost.
import type { Frame } from './protocol.ts';

/** A bounded buffer of frames for one reader. */
export interface Outbox {
  push(frame: Frame): void;
  /** Takes up to `max` frames, oldest first, led by a `dropped` frame if any were lost since the last take. */
  take(max: number, now: number): Frame[];
  size(): number;
  /** Frames dropped over the outbox's life. */
  readonly droppedTotal: number;
}

/** Creates an outbox holding at most `capacity` frames. */
export function createOutbox(capacity: number): Outbox {
  if (!Number.isInteger(capacity) || capacity < 1)
    throw new RangeError(`outbox capacity must be a positive integer, got ${capacity}`);
  const ring: (Frame | undefined)[] = new Array<Frame | undefined>(capacity);
  let head = 0;
  let count = 0;
  let dropped = 0;
  let droppedTotal = 0;
  return {
    push: (frame) => {
      if (count === capacity) {
        ring[head] = undefined;
        head = (head + 1) % capacity;
        count--;
        dropped++;
        droppedTotal++;
      }
      ring[(head + count) % capacity] = frame;
      count++;
    },
    take: (max, now) => {
      const out: Frame[] = [];
      if (dropped > 0) {
        out.push({ k: 'dropped', t: now, n: dropped });
        dropped = 0;
      }
      while (count > 0 && out.length < max) {
        out.push(ring[head]!);
        ring[head] = undefined;
        head = (head + 1) % capacity;
        count--;
      }
      return out;
    },
    size: () => count,
    get droppedTotal() {
      return droppedTotal;
    },
  };
}
