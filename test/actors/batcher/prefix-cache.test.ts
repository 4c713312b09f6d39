// The engine core's prefix cache and the block hashes it keys on: a prompt that starts as an earlier one did finds
// those blocks; blocks held by a running sequence are never evicted; eviction takes idle blocks least recently used
// first, a chain from its tail; the counts the ledger reads stay exact under random use.
import { describe, expect, it } from 'vitest';
import { segmentBlockHashes, sharedBlocks, tokenBlockHashes } from '../../../actors/batcher/block-hash.ts';
import { createPrefixCache } from '../../../actors/batcher/prefix-cache.ts';
import { createRng } from '../../../runtime/rng.ts';

describe('block hashes', () => {
  it('are equal exactly as far as the tokens are, per full block', () => {
    const a = Array.from({ length: 100 }, (_, i) => i % 7);
    const b = [...a.slice(0, 40), 99, ...a.slice(41)];
    const ha = tokenBlockHashes(a, 16);
    const hb = tokenBlockHashes(b, 16);
    expect(ha).toHaveLength(6);
    expect(sharedBlocks(ha, hb)).toBe(2);
    expect(tokenBlockHashes(a.slice(0, 50), 16)).toEqual(ha.slice(0, 3));
    for (const h of ha) expect(Number.isSafeInteger(h)).toBe(true);
  });

  it('of segments: a conversation that grows keeps its blocks; another system prompt shares none', () => {
    const turn1 = segmentBlockHashes(
      [
        { key: 1, tokens: 300 },
        { key: 10, tokens: 50 },
      ],
      16,
    );
    const turn2 = segmentBlockHashes(
      [
        { key: 1, tokens: 300 },
        { key: 10, tokens: 50 },
        { key: 11, tokens: 80 },
      ],
      16,
    );
    const other = segmentBlockHashes(
      [
        { key: 2, tokens: 300 },
        { key: 10, tokens: 50 },
      ],
      16,
    );
    expect(sharedBlocks(turn1, turn2)).toBe(turn1.length);
    expect(sharedBlocks(turn1, other)).toBe(0);
    // The same tokens cut into other segments are other content: segments name content by key and position.
    const split = segmentBlockHashes(
      [
        { key: 1, tokens: 100 },
        { key: 1, tokens: 200 },
      ],
      16,
    );
    expect(sharedBlocks(segmentBlockHashes([{ key: 1, tokens: 300 }], 16), split)).toBe(6);
  });
});

describe('the prefix cache', () => {
  const h = (n: number, base = 0): number[] => Array.from({ length: n }, (_, i) => base + i * 7 + 1);

  it('keeps a finished sequence’s blocks for the next prompt that starts the same way', () => {
    const c = createPrefixCache();
    const a = h(10);
    expect(c.match(a)).toBe(0);
    expect(c.insert(a, 0, 10, 1)).toBe(10);
    expect(c.idle()).toBe(0);
    c.release(a, 10, 2);
    expect(c.idle()).toBe(10);
    const b = [...a.slice(0, 6), 999, 1000];
    expect(c.match(b)).toBe(6);
    expect(c.acquire(b, 6, 3)).toBe(6);
    expect(c.idle()).toBe(4);
    // Only the idle tail can go, deepest first, and never a block a running sequence holds.
    expect(c.evict(100)).toEqual([a[9], a[8], a[7], a[6]]);
    expect(c.size()).toBe(6);
    expect(c.idle()).toBe(0);
  });

  it('evicts least recently used chains first', () => {
    const c = createPrefixCache();
    const old = h(3, 0);
    const recent = h(3, 1000);
    c.insert(old, 0, 3, 1);
    c.release(old, 3, 1);
    c.insert(recent, 0, 3, 5);
    c.release(recent, 3, 5);
    expect(c.evict(3)).toEqual([old[2], old[1], old[0]]);
    expect(c.match(recent)).toBe(3);
  });

  it('keeps its counts exact under random use (a model of every block’s holders)', () => {
    const rng = createRng(7);
    const c = createPrefixCache();
    const chains = Array.from({ length: 6 }, (_, k) => h(12, k * 10_000));
    // What each live sequence holds: its chain and the blocks it holds from the start.
    const live: { chain: number[]; held: number }[] = [];
    const holders = new Map<number, number>();
    const cached = new Set<number>();
    for (let t = 1; t < 3000; t++) {
      const r = rng.next();
      if (r < 0.45 && live.length < 8) {
        const chain = chains[Math.floor(rng.next() * chains.length)]!;
        const n = c.match(chain);
        c.acquire(chain, n, t);
        const want = Math.min(chain.length, n + Math.floor(rng.next() * 5));
        c.insert(chain, n, want, t);
        for (let i = 0; i < want; i++) {
          holders.set(chain[i]!, (holders.get(chain[i]!) ?? 0) + 1);
          cached.add(chain[i]!);
        }
        live.push({ chain, held: want });
      } else if (r < 0.85 && live.length > 0) {
        const s = live.splice(Math.floor(rng.next() * live.length), 1)[0]!;
        c.release(s.chain, s.held, t);
        for (let i = 0; i < s.held; i++) holders.set(s.chain[i]!, holders.get(s.chain[i]!)! - 1);
      } else {
        for (const gone of c.evict(1 + Math.floor(rng.next() * 4))) {
          expect(holders.get(gone) ?? 0).toBe(0);
          cached.delete(gone);
        }
      }
      expect(c.size()).toBe(cached.size);
      expect(c.idle()).toBe([...cached].filter((x) => (holders.get(x) ?? 0) === 0).length);
    }
  });
});
