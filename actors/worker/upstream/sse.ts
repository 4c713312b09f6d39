// The server-sent events of an upstream model server, parsed with bounds: the bytes are untrusted. Only `data:` lines
// matter (OpenAI's streaming); an over-long line or too many events is an error of that stream alone.

/** Bounds of one stream's parse. */
export interface SseBounds {
  /** Longest line, in characters. */
  maxLine: number;
  /** Most events of one stream. */
  maxEvents: number;
}

export const DEFAULT_SSE_BOUNDS: SseBounds = { maxLine: 1 << 20, maxEvents: 1 << 20 };

/** A streaming parser: feed it chunks; it calls `data` with each event's data (lines joined by \n). */
export interface SseParser {
  /** Parses a chunk; answers an error message when a bound is broken (the stream must end). */
  push(chunk: string): string | null;
}

/** Creates a parser calling `data` for every complete event. */
export function createSseParser(data: (payload: string) => void, bounds: SseBounds = DEFAULT_SSE_BOUNDS): SseParser {
  let rest = '';
  let lines: string[] = [];
  let events = 0;
  const line = (l: string): string | null => {
    if (l === '') {
      if (lines.length === 0) return null;
      if (++events > bounds.maxEvents) return `more than ${bounds.maxEvents} events`;
      const payload = lines.join('\n');
      lines = [];
      data(payload);
      return null;
    }
    if (l.startsWith('data:')) {
      lines.push(l.charCodeAt(5) === 32 ? l.slice(6) : l.slice(5));
      if (lines.length > 1024) return 'an event of more than 1024 lines';
    }
    // Comments (`:`), `event:`, `id:` and `retry:` carry nothing an OpenAI stream needs.
    return null;
  };
  return {
    push: (chunk) => {
      let text = rest + chunk;
      let start = 0;
      for (;;) {
        const nl = text.indexOf('\n', start);
        if (nl < 0) break;
        const end = nl > start && text.charCodeAt(nl - 1) === 13 ? nl - 1 : nl;
        const bad = line(text.slice(start, end));
        if (bad) return bad;
        start = nl + 1;
      }
      text = text.slice(start);
      if (text.length > bounds.maxLine) return `a line longer than ${bounds.maxLine} characters`;
      rest = text;
      return null;
    },
  };
}
