// A streaming completion's status and headers leave with its first event (one write, not two), or after
// SSE_HEAD_WAIT_MS when none came, so a client whose request waits in a queue still hears it was accepted.
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { SSE_HEAD_WAIT_MS, handleCompletion } from '../../../api/http/openai.ts';
import type { StreamSink } from '../../../api/serving.ts';
import type { Clock } from '../../../runtime/clock.ts';
import { manualClock, servingTo } from './sse-fakes.ts';

const done = { finishReason: 'length' as const, usage: { promptTokens: 2, completionTokens: 1 } };
const timings = { queueMs: 0, ttftMs: 0, e2eMs: 0 };
const tick = (ms = 20): Promise<void> => new Promise((r) => setTimeout(r, ms));

let server: Server | null = null;
afterEach(() => {
  server?.close();
  server = null;
});

async function start(clock: Clock, sinks: StreamSink[], flushed: ServerResponse[]): Promise<string> {
  server = createServer((req, res) => {
    const flush = res.flushHeaders.bind(res);
    res.flushHeaders = () => (flushed.push(res), flush());
    void handleCompletion(servingTo(sinks), req, res, false, undefined, clock);
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/completions`;
}

const post = (url: string): Promise<Response> =>
  fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hi', stream: true }),
  });

describe('SSE status and headers', () => {
  it('leave with the first event when it comes before the wait is over', async () => {
    const clock = manualClock();
    const sinks: StreamSink[] = [];
    const flushed: ServerResponse[] = [];
    const url = await start(clock, sinks, flushed);
    const pending = post(url);
    while (sinks.length === 0) await tick(5);
    expect(clock.waits).toEqual([SSE_HEAD_WAIT_MS]);
    sinks[0]!.tokens(0, 1, 'hello');
    const r = await pending;
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toBe('text/event-stream');
    expect(r.headers.get('x-request-id')).toBe('r1');
    // The first event took the headers with it: the wait was cancelled, nothing was flushed on its own.
    expect(clock.waits).toEqual([]);
    expect(flushed).toHaveLength(0);
    sinks[0]!.done({ ...done, timings });
    expect(await r.text()).toContain('data: [DONE]');
  });

  it('leave on their own once the wait is over without an event', async () => {
    const clock = manualClock();
    const sinks: StreamSink[] = [];
    const flushed: ServerResponse[] = [];
    const url = await start(clock, sinks, flushed);
    let answered = false;
    const pending = post(url).then((r) => ((answered = true), r));
    while (sinks.length === 0) await tick(5);
    await tick(50);
    expect(answered).toBe(false);
    clock.fire();
    const r = await pending;
    expect(r.status).toBe(200);
    expect(flushed).toHaveLength(1);
    sinks[0]!.failed({ code: 'expired', message: 'waited too long', retryable: true, outcome: 'expired' });
    const text = await r.text();
    expect(text).toContain('"expired"');
  });
});
