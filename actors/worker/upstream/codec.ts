// The served model's vocabulary in the worker (a vocab-only load of the configured GGUF): token ids to the text a
// server takes (`prompt: text`), and a server's streamed text to ids when it does not return them.
import type { TextCodec } from './completion.ts';

/** A codec and the model's BOS id (null when it has none). */
export type ModelCodec = TextCodec & { bos: number | null };

const loaded = new Map<string, Promise<ModelCodec>>();

/** Most texts whose ids a codec remembers, and the longest text remembered. */
const MEMO_ENTRIES = 8192;
const MEMO_CHARS = 64;

/** `encode` remembering the ids of short texts: a server streams the same token texts again and again, and each
 * tokenization is a call into llama.cpp. Bounded: the oldest text goes when it is full. */
export function memoEncode(encode: (text: string) => number[]): (text: string) => number[] {
  const memo = new Map<string, number[]>();
  return (text) => {
    if (text.length > MEMO_CHARS) return encode(text);
    const hit = memo.get(text);
    if (hit) return hit.slice();
    const ids = encode(text);
    if (memo.size >= MEMO_ENTRIES) memo.delete(memo.keys().next().value!);
    memo.set(text, ids.slice());
    return ids;
  };
}

/** The codec of a GGUF file, loaded once per worker. */
export function loadCodec(file: string): Promise<ModelCodec> {
  let p = loaded.get(file);
  if (!p) {
    p = (async () => {
      const { loadTokenizer } = await import('../../engine/tokenizer.ts');
      const t = await loadTokenizer(file);
      const empty = t.tokenize('');
      const bos = empty.length === 1 ? empty[0]! : null;
      return {
        bos,
        encode: memoEncode((text) => {
          const ids = t.tokenize(text);
          return bos !== null && ids[0] === bos ? ids.slice(1) : ids;
        }),
        decode: (ids) => t.detokenize(ids),
      };
    })();
    p.catch(() => loaded.delete(file));
    loaded.set(file, p);
  }
  return p;
}
