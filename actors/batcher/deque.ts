// A double-ended queue of sequences: FIFO admission, with preempted sequences put back at the head.
import type { Sequence } from './sequence.ts';

/** A deque with O(1) amortised push, shift and unshift. */
export interface Deque {
  readonly length: number;
  push(s: Sequence): void;
  unshift(s: Sequence): void;
  peek(): Sequence | undefined;
  shift(): Sequence | undefined;
  remove(s: Sequence): boolean;
  toArray(): Sequence[];
}

/** Creates an empty deque. */
export function createDeque(): Deque {
  let items: (Sequence | undefined)[] = [];
  let head = 0;
  const compact = (): void => {
    if (head > 1024 && head * 2 > items.length) {
      items = items.slice(head);
      head = 0;
    }
  };
  return {
    get length() {
      return items.length - head;
    },
    push: (s) => {
      items.push(s);
    },
    unshift: (s) => {
      if (head > 0) items[--head] = s;
      else items.unshift(s);
    },
    peek: () => items[head],
    shift: () => {
      if (head >= items.length) return undefined;
      const s = items[head];
      items[head++] = undefined;
      compact();
      return s;
    },
    remove: (s) => {
      const i = items.indexOf(s, head);
      if (i < 0) return false;
      items.splice(i, 1);
      return true;
    },
    toArray: () => items.slice(head) as Sequence[],
  };
}
