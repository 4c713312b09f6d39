// Turns one sequence's sampled tokens into streamable text: whole UTF-8 characters only, stop strings cut and withheld.

/** Incremental text of one sequence; push each sampled token in order, flush what is held when it ends. */
export interface TextStream {
  /** Adds a sampled token; returns the text now safe to stream and whether a stop string has just been reached. */
  push(token: number): { text: string; stopped: boolean };
  /** Returns the text still held back (an incomplete character, a possible stop-string prefix); empty once stopped. */
  flush(): string;
  /** Whether a stop string was reached: later pushes return no text. */
  readonly stopped: boolean;
}

/** A UTF-8 character is at most 4 bytes: past that many held tokens, an unfinished tail is emitted as U+FFFD. */
const MAX_HELD_TOKENS = 4;
const REPLACEMENT = '\uFFFD';

/** Length of the longest suffix of `text` that is a proper prefix of one of the stop strings. */
const stopPrefixLength = (text: string, stop: readonly string[]): number => {
  let best = 0;
  for (const s of stop) {
    for (let n = Math.min(s.length - 1, text.length); n > best; n--) {
      if (text.endsWith(s.slice(0, n))) {
        best = n;
        break;
      }
    }
  }
  return best;
};

/**
 * Creates a text stream over a tokenizer's detokenize. Decoding follows vLLM's incremental detokenizer: decode a
 * short window of tokens with and without the newest ones and emit the difference only when it does not end in an
 * incomplete character (a trailing U+FFFD), so a character split across byte tokens is emitted once, whole.
 */
export function createTextStream(
  detokenize: (tokens: readonly number[]) => string,
  stop: readonly string[] = [],
): TextStream {
  const stops = stop.filter((s) => s.length > 0);
  const tokens: number[] = [];
  let prefixOffset = 0;
  let readOffset = 0;
  let held = '';
  let stopped = false;

  const decodeNew = (force: boolean): string => {
    const prefixText = detokenize(tokens.slice(prefixOffset, readOffset));
    const full = detokenize(tokens.slice(prefixOffset));
    if (full.length <= prefixText.length) return '';
    if (!force && full.endsWith(REPLACEMENT) && tokens.length - readOffset < MAX_HELD_TOKENS) return '';
    prefixOffset = readOffset;
    readOffset = tokens.length;
    return full.slice(prefixText.length);
  };

  const release = (text: string): { text: string; stopped: boolean } => {
    held += text;
    let at = -1;
    for (const s of stops) {
      const i = held.indexOf(s);
      if (i >= 0 && (at < 0 || i < at)) at = i;
    }
    if (at >= 0) {
      const out = held.slice(0, at);
      held = '';
      stopped = true;
      return { text: out, stopped: true };
    }
    const keep = stopPrefixLength(held, stops);
    const out = held.slice(0, held.length - keep);
    held = held.slice(held.length - keep);
    return { text: out, stopped: false };
  };

  return {
    push(token) {
      if (stopped) return { text: '', stopped: true };
      tokens.push(token);
      return release(decodeNew(false));
    },
    flush() {
      if (stopped) return '';
      const rest = held + decodeNew(true);
      held = '';
      return rest;
    },
    get stopped() {
      return stopped;
    },
  };
}
