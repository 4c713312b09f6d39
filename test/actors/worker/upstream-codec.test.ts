// The worker's codec remembers the ids of the short texts a server streams (one llama.cpp call per distinct text),
// answers what the tokenizer would, hands out copies, and stays bounded.
import { describe, expect, it } from 'vitest';
import { memoEncode } from '../../../actors/worker/upstream/codec.ts';

describe('memoEncode', () => {
  it('tokenizes each short text once and answers the same ids after', () => {
    let calls = 0;
    const encode = memoEncode((text) => {
      calls++;
      return [...text].map((c) => c.charCodeAt(0));
    });
    expect(encode(' the')).toEqual([32, 116, 104, 101]);
    const again = encode(' the');
    expect(again).toEqual([32, 116, 104, 101]);
    expect(calls).toBe(1);
    again.push(0); // a caller's change does not reach the memo
    expect(encode(' the')).toEqual([32, 116, 104, 101]);
  });

  it('does not remember long texts, and forgets the oldest beyond its bound', () => {
    let calls = 0;
    const encode = memoEncode((text) => {
      calls++;
      return [text.length];
    });
    const long = 'x'.repeat(65);
    encode(long);
    encode(long);
    expect(calls).toBe(2);
    for (let i = 0; i <= 8192; i++) encode(`t${i}`);
    calls = 0;
    encode('t0'); // the oldest went when the 8193rd came
    expect(calls).toBe(1);
    encode('t8192');
    expect(calls).toBe(1);
  });
});
