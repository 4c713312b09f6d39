// The control plane's prefix index: a replica holds what its core reported kept and not evicted, from the start of a
// request's blocks; it is bounded per replica (oldest reports out first) and a dropped replica holds nothing.
import { describe, expect, it } from 'vitest';
import { createPrefixIndex } from '../../../actors/router/prefix-index.ts';

describe('the prefix index', () => {
  it('answers the blocks a replica holds from the start of a request, per replica', () => {
    const x = createPrefixIndex();
    x.add('r1', [1, 2, 3, 4]);
    x.add('r2', [1, 2]);
    expect(x.cachedBlocks('r1', [1, 2, 3, 9, 4])).toBe(3);
    expect(x.cachedBlocks('r2', [1, 2, 3])).toBe(2);
    expect(x.cachedBlocks('r3', [1])).toBe(0);
    x.remove('r1', [2]);
    expect(x.cachedBlocks('r1', [1, 2, 3])).toBe(1);
    x.drop('r1');
    expect(x.cachedBlocks('r1', [1])).toBe(0);
    expect(x.size('r1')).toBe(0);
  });

  it('is bounded per replica, forgetting the least recently reported blocks first', () => {
    const x = createPrefixIndex(4);
    x.add('r', [1, 2, 3, 4]);
    x.add('r', [1]);
    x.add('r', [5, 6]);
    expect(x.size('r')).toBe(4);
    expect(x.cachedBlocks('r', [1])).toBe(1);
    expect(x.cachedBlocks('r', [2])).toBe(0);
    expect(x.cachedBlocks('r', [3])).toBe(0);
    expect(x.cachedBlocks('r', [4, 5, 6])).toBe(3);
  });

  it('takes any replica name, prototype names included', () => {
    const x = createPrefixIndex();
    for (const name of ['constructor', '__proto__', 'toString']) {
      x.add(name, [7]);
      expect(x.cachedBlocks(name, [7])).toBe(1);
    }
  });
});
