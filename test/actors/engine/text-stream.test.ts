// Tests of the incremental detokenizer: whole characters only, stop strings cut and withheld.
import { describe, expect, it } from 'vitest';
import { createTextStream } from '../../../actors/engine/text-stream.ts';

// A byte-level tokenizer: token id = byte, decoded as UTF-8 with U+FFFD for incomplete or invalid bytes.
const decoder = new TextDecoder();
const detokenize = (tokens: readonly number[]): string => decoder.decode(Uint8Array.from(tokens));
const bytes = (s: string): number[] => [...new TextEncoder().encode(s)];

const pushAll = (stream: ReturnType<typeof createTextStream>, tokens: number[]): string[] =>
  tokens.map((t) => stream.push(t).text);

describe('text stream', () => {
  it('emits a multi-byte character once, whole, when its last byte arrives', () => {
    const stream = createTextStream(detokenize);
    const pieces = pushAll(stream, bytes('aé✓'));
    expect(pieces).toEqual(['a', '', 'é', '', '', '✓']);
    expect(stream.flush()).toBe('');
  });

  it('emits an invalid byte as a replacement character instead of holding it forever', () => {
    const stream = createTextStream(detokenize);
    const pieces = pushAll(stream, [0xff, 0xff, 0xff, 0xff, 0x41]);
    expect(pieces.join('') + stream.flush()).toBe('\uFFFD'.repeat(4) + 'A');
  });

  it('flushes an unfinished character at the end', () => {
    const stream = createTextStream(detokenize);
    expect(pushAll(stream, [0x61, 0xe2, 0x9c])).toEqual(['a', '', '']);
    expect(stream.flush()).toBe('\uFFFD');
  });

  it('stops before a stop string split across tokens and never emits it', () => {
    const stream = createTextStream(detokenize, ['END']);
    const results = bytes('okEN').map((t) => stream.push(t));
    expect(results.map((r) => r.text).join('')).toBe('ok'); // "EN" is held: it may begin "END"
    const last = stream.push(bytes('D')[0]!);
    expect(last).toEqual({ text: '', stopped: true });
    expect(stream.stopped).toBe(true);
    expect(stream.flush()).toBe('');
    expect(stream.push(0x61)).toEqual({ text: '', stopped: true });
  });

  it('releases held text once it can no longer begin a stop string', () => {
    const stream = createTextStream(detokenize, ['END']);
    expect(pushAll(stream, bytes('aEN'))).toEqual(['a', '', '']);
    expect(stream.push(bytes('x')[0]!).text).toBe('ENx');
  });
});
