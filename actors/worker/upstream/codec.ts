// The served model's vocabulary in the worker (a vocab-only load of the configured GGUF): token ids to the text a
// server takes (`prompt: text`), and a server's streamed text to ids when it does not return them.
import type { TextCodec } from './completion.ts';

/** A codec and the model's BOS id (null when it has none). */
export type ModelCodec = TextCodec & { bos: number | null };

const loaded = new Map<string, Promise<ModelCodec>>();

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
        encode: (text) => {
          const ids = t.tokenize(text);
          return bos !== null && ids[0] === bos ? ids.slice(1) : ids;
        },
        decode: (ids) => t.detokenize(ids),
      };
    })();
    p.catch(() => loaded.delete(file));
    loaded.set(file, p);
  }
  return p;
}
