// A streaming completion writes its first tokens at once; later ones wait until TOKEN_FLUSH_MS after the response's
// previous write and leave together; its end takes whatever waits. The stream's events are unchanged, in order.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { handleCompletion } from '../../../api/http/openai.ts';
import { TOKEN_FLUSH_MS, type StreamSink } from '../../../api/serving.ts';
import type { Clock } from '../../../runtime/clock.ts';
import { manualClock, servingTo } from './sse-fakes.ts';

const done = {
  finishReason: 'length' as const,
  usage: { promptTokens: 2, completionTokens: 5 },
  timings: { queueMs: 0, ttftMs: 0, e2eMs: 0 },
};
const tick = (ms = 5): Promise<void> => new Promise((r) => setTimeout(r, ms));

let server: Server | null = null;
afterEach(() => {
  server?.close();
  server = null;
});

/** Starts a server answering one streaming completion with `flushMs`; the writes its response makes, counted in
 * events (`write n` / `end n`), the sinks serving was handed, and the response. */
async function start(clock: Clock, flushMs?: number) {
  const sinks: StreamSink[] = [];
  const writes: string[] = [];
  const events = (chunk: unknown): number => String(chunk ?? '').split('data: ').length - 1;
  server = createServer((req, res) => {
    const write = res.write.bind(res) as (chunk: string) => boolean;
    const end = res.end.bind(res) as (chunk?: string) => typeof res;
    res.write = ((chunk: string) => (writes.push(`write ${events(chunk)}`), write(chunk))) as typeof res.write;
    res.end = ((chunk?: string) => (writes.push(`end ${events(chunk)}`), end(chunk))) as typeof res.end;
    void handleCompletion(servingTo(sinks), req, res, false, undefined, clock, flushMs);
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server!.address() as AddressInfo).port}/v1/completions`;
  const pending = fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hi', stream: true }),
  });
  while (sinks.length === 0) await tick();
  return { sink: sinks[0]!, writes, pending };
}

describe('SSE token writes', () => {
  it('write first tokens at once and merge later ones into one write per interval', async () => {
    const clock = manualClock();
    const { sink, writes, pending } = await start(clock);
    clock.fire(); // the head's timer: status and headers leave on their own, so every write below is the body's
    sink.tokens(0, 1, 'a');
    expect(writes).toEqual(['write 1']);
    clock.t = 1;
    sink.tokens(1, 1, 'b');
    sink.tokens(2, 1, 'c');
    // Both wait for one timer, due TOKEN_FLUSH_MS after the first write.
    expect(writes).toEqual(['write 1']);
    expect(clock.waits).toEqual([TOKEN_FLUSH_MS - 1]);
    clock.t = TOKEN_FLUSH_MS;
    clock.fire();
    expect(writes).toEqual(['write 1', 'write 2']);
    // Long after the last write, a later token is written at once; the next waits and leaves with the end.
    clock.t = 50;
    sink.tokens(3, 1, 'd');
    sink.tokens(4, 1, 'e');
    expect(writes).toEqual(['write 1', 'write 2', 'write 1']);
    sink.done(done);
    // The end: token e, the last chunk and [DONE].
    expect(writes).toEqual(['write 1', 'write 2', 'write 1', 'end 3']);
    expect(clock.waits).toEqual([]);
    const text = await (await pending).text();
    const events = text
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => (JSON.parse(e.slice(6)) as { choices: { text: string }[] }).choices[0]!.text);
    expect(events).toEqual(['a', 'b', 'c', 'd', 'e', '']);
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
  });

  it('write every token at once at an interval of 0', async () => {
    const clock = manualClock();
    const { sink, writes, pending } = await start(clock, 0);
    clock.fire();
    for (let k = 0; k < 3; k++) {
      clock.t = 0.1 * k;
      sink.tokens(k, 1, 't');
    }
    expect(writes).toEqual(['write 1', 'write 1', 'write 1']);
    expect(clock.waits).toEqual([]);
    sink.done(done);
    expect(await (await pending).text()).toContain('data: [DONE]');
  });
});
