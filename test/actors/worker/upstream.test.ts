// The upstream adapter of `engine: openai` against a fake model server in this process: the SSE and metrics parsers'
// bounds, at most `sequences` requests at the server with the rest in switchyard's queue, tokens and finishes as a
// core reports them, a cancel closing the server's stream, a 4xx failing one request alone, a hang failing the replica.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { createSseParser } from '../../../actors/worker/upstream/sse.ts';
import { parseGauges } from '../../../actors/worker/upstream/gauges.ts';
import { startUpstreamHost, type UpstreamHost } from '../../../actors/worker/upstream/adapter.ts';
import { GAUGE_NAMES } from '../../../actors/engine-config.ts';
import type { CoreLimits, CoreReport, SubmitSeq } from '../../../machines/core-messages.ts';
import type { WireUpstreamSpec } from '../../../machines/messages.ts';
import type { ModelCodec } from '../../../actors/worker/upstream/codec.ts';

describe('the upstream parsers', () => {
  it('parses SSE data events across chunks and refuses an over-long line', () => {
    const got: string[] = [];
    const p = createSseParser((d) => got.push(d), { maxLine: 32, maxEvents: 3 });
    expect(p.push('data: {"a"')).toBeNull();
    expect(p.push(':1}\r\n\r\n: comment\n\ndata: [DONE]\n\n')).toBeNull();
    expect(got).toEqual(['{"a":1}', '[DONE]']);
    expect(p.push('data: ' + 'x'.repeat(40))).toMatch(/longer than 32/);
    const q = createSseParser(() => undefined, { maxLine: 100, maxEvents: 1 });
    expect(q.push('data: 1\n\ndata: 2\n\n')).toMatch(/more than 1 events/);
  });

  it('reads the model-server gauges under each server’s names, a total before labelled series', () => {
    const vllm = [
      '# HELP vllm:num_requests_waiting x',
      'vllm:num_requests_waiting{model_name="m"} 3',
      'vllm:num_requests_running{model_name="m"} 5',
      'vllm:gpu_cache_usage_perc{model_name="m"} 0.25',
    ].join('\n');
    expect(parseGauges(vllm, GAUGE_NAMES.vllm)).toEqual({ waiting: 3, running: 5, kvUsage: 0.25 });
    const sy = [
      'switchyard_num_requests_waiting 2',
      'switchyard_num_requests_waiting{model="a"} 1',
      'switchyard_num_requests_waiting{model="b"} 1',
      'switchyard_kv_cache_usage_perc NaN',
    ].join('\n');
    expect(parseGauges(sy, GAUGE_NAMES.switchyard)).toEqual({ waiting: 2, running: null, kvUsage: null });
    expect(parseGauges('sglang:token_usage 40\nsglang:num_queue_reqs -1', GAUGE_NAMES.sglang)).toEqual({
      waiting: null,
      running: null,
      kvUsage: 0.4,
    });
  });
});

/** A fake OpenAI server: streams `n` one-character chunks per request, one every `gapMs`, unless told otherwise. */
interface Fake {
  server: Server;
  port: number;
  open: number;
  maxOpen: number;
  closed: number;
  bodies: Record<string, unknown>[];
  stall: boolean;
}

async function fakeServer(gapMs: number): Promise<Fake> {
  const f: Fake = { server: null!, port: 0, open: 0, maxOpen: 0, closed: 0, bodies: [], stall: false };
  f.server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.url === '/health') return res.end('ok');
    if (req.url === '/metrics') return res.end('vllm:kv_cache_usage_perc 0.5\n');
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as { prompt: string; max_tokens: number };
      f.bodies.push(body);
      if (String(body.prompt).includes('bad')) {
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: 'no such thing' } }));
      }
      f.open++;
      f.maxOpen = Math.max(f.maxOpen, f.open);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let i = 0;
      const chunk = (text: string, finish: string | null): string =>
        `data: ${JSON.stringify({ choices: [{ index: 0, text, finish_reason: finish }] })}\n\n`;
      const t = setInterval(() => {
        if (f.stall) return;
        if (i < body.max_tokens) res.write(chunk(String.fromCharCode(97 + (i % 26)), null));
        i++;
        if (i >= body.max_tokens) {
          clearInterval(t);
          res.write(chunk('', 'length'));
          res.write(`data: ${JSON.stringify({ choices: [], usage: { completion_tokens: body.max_tokens } })}\n\n`);
          res.end('data: [DONE]\n\n');
        }
      }, gapMs);
      res.on('close', () => {
        clearInterval(t);
        f.open--;
        if (i < body.max_tokens) f.closed++;
      });
    });
  });
  await new Promise<void>((r) => f.server.listen(0, '127.0.0.1', r));
  f.port = (f.server.address() as { port: number }).port;
  return f;
}

const limits: CoreLimits = {
  policy: 'chunked',
  maxRunning: 2,
  tokenBudget: 256,
  blockTokens: 16,
  blocksTotal: 2 * 32,
  maxContext: 512,
  watermarkBlocks: 0,
};

const codec: ModelCodec = {
  bos: 1,
  encode: (text) => [...text].map((c) => c.charCodeAt(0)),
  decode: (ids) => String.fromCharCode(...ids),
};

function spec(port: number, over: Partial<WireUpstreamSpec> = {}): WireUpstreamSpec {
  return {
    model: 'm',
    url: `http://127.0.0.1:${port}`,
    health: '/health',
    metrics: '/metrics',
    gauges: {
      ...GAUGE_NAMES.vllm,
      waiting: [...GAUGE_NAMES.vllm.waiting],
      running: [...GAUGE_NAMES.vllm.running],
      kvUsage: [...GAUGE_NAMES.vllm.kvUsage],
    },
    prompt: 'text',
    tokenIds: false,
    startTimeoutMs: 5_000,
    hangMs: 10_000,
    maxErrors: 3,
    queue: 8,
    sleep: false,
    logLines: 50,
    ...over,
  };
}

const seq = (id: string, prompt: string, maxTokens: number, order: number): SubmitSeq => ({
  id,
  priority: 0,
  order,
  promptTokens: prompt.length + 1,
  outputTokens: maxTokens,
  maxTokens,
  estOutputTokens: maxTokens,
  generated: 0,
  prompt: [1, ...codec.encode(prompt)],
});

describe('the upstream adapter', () => {
  let fake: Fake | null = null;
  let host: UpstreamHost | null = null;
  afterEach(async () => {
    host?.kill();
    await new Promise<void>((r) => (fake ? fake.server.close(() => r()) : r()));
    fake?.server.closeAllConnections();
    fake = host = null;
  });

  const start = async (over: Partial<WireUpstreamSpec> = {}, gapMs = 5): Promise<CoreReport[]> => {
    fake = await fakeServer(gapMs);
    const reports: CoreReport[] = [];
    host = startUpstreamHost({
      id: 'r0',
      epoch: 1,
      engine: {
        kind: 'openai',
        file: 'unused',
        contextTokens: 512,
        sequences: 2,
        threads: 1,
        upstream: spec(fake.port, over),
      },
      gpus: [0],
      limits,
      report: (r) => reports.push(r),
      log: () => undefined,
      codec: () => Promise.resolve(codec),
      scrapeMs: 50,
    });
    await host.ready();
    return reports;
  };
  const events = (reports: CoreReport[], id: string) =>
    reports.flatMap((r) => r.events.filter((e) => 'id' in e && e.id === id));
  const until = async (cond: () => boolean, ms = 5_000): Promise<void> => {
    const end = performance.now() + ms;
    while (!cond()) {
      if (performance.now() > end) throw new Error('not in time');
      await new Promise((r) => setTimeout(r, 10));
    }
  };

  it('keeps at most `sequences` at the server, the rest in its queue, and reports tokens and finishes', async () => {
    const reports = await start();
    host!.submit([seq('a', 'hi', 6, 1), seq('b', 'yo', 6, 2), seq('c', 'ok', 6, 3)]);
    await until(() => reports.some((r) => r.load.waiting === 1 && r.load.running === 2));
    expect(reports.find((r) => r.load.waiting === 1)!.load.saturated).toBe(true);
    await until(() => events(reports, 'c').some((e) => e.k === 'f'));
    expect(fake!.maxOpen).toBe(2);
    for (const id of ['a', 'b', 'c']) {
      const ev = events(reports, id);
      expect(ev[0]).toEqual({ k: 's', id });
      const text = ev.flatMap((e) => (e.k === 't' ? [e.text] : [])).join('');
      expect(text).toBe('abcdef');
      expect(ev.at(-1)).toEqual({ k: 'f', id, reason: 'length' });
    }
    // The prompt goes as its text, without the BOS; the load counts every submit.
    expect(fake!.bodies[0]).toMatchObject({ model: 'm', prompt: 'hi', max_tokens: 6, stream: true });
    expect(reports.at(-1)!.load).toMatchObject({ received: 3, running: 0, waiting: 0 });
    // The server's KV usage (0.5 of the ledger's 64 blocks) is what the load says is used.
    await until(() => host!.gauges.kvUsage === 0.5);
    host!.submit([seq('d', 'x', 2, 4)]);
    await until(() => events(reports, 'd').some((e) => e.k === 'f'));
    expect(reports.some((r) => r.load.blocksUsed === 32)).toBe(true);
  });

  it('reports far fewer messages than tokens (coalesced)', async () => {
    const reports = await start({}, 1);
    host!.submit([seq('a', 'hi', 200, 1), seq('b', 'yo', 200, 2)]);
    await until(() => events(reports, 'b').some((e) => e.k === 'f') && events(reports, 'a').some((e) => e.k === 'f'));
    expect(reports.length).toBeLessThan(200);
  });

  it('closes the server’s stream on a cancel; the request leaves with no event', async () => {
    const reports = await start({}, 20);
    host!.submit([seq('a', 'hi', 100, 1)]);
    await until(() => events(reports, 'a').some((e) => e.k === 't'));
    host!.cancel(['a']);
    await until(() => fake!.closed === 1);
    await new Promise((r) => setTimeout(r, 50));
    expect(events(reports, 'a').some((e) => e.k === 'f')).toBe(false);
    expect(reports.at(-1)!.load).toMatchObject({ cancelled: 1, running: 0 });
  });

  it('fails a request the server refuses (4xx) alone, typed', async () => {
    const reports = await start();
    host!.submit([seq('a', 'bad', 4, 1), seq('b', 'ok', 4, 2)]);
    await until(() => events(reports, 'b').some((e) => e.k === 'f') && events(reports, 'a').some((e) => e.k === 'f'));
    const f = events(reports, 'a').find((e) => e.k === 'f');
    expect(f).toMatchObject({ k: 'f', error: expect.stringMatching(/^invalid_request: .*400.*no such thing/) });
    expect(host!.state).toBe('ready');
  });

  it('fails the replica when a stream makes no progress within hangMs', async () => {
    const reports = await start({ hangMs: 300 }, 10);
    const failed = new Promise<string>((r) => host!.subscribe((e) => e.to === 'failed' && r(e.failure!.message)));
    host!.submit([seq('a', 'hi', 1000, 1)]);
    await until(() => events(reports, 'a').some((e) => e.k === 't'));
    fake!.stall = true;
    const t0 = performance.now();
    expect(await failed).toMatch(/made no progress/);
    expect(performance.now() - t0).toBeLessThan(300 + 400);
  });

  it('refuses a submit beyond its queue with overloaded', async () => {
    const reports = await start({ queue: 1 }, 50);
    host!.submit([seq('a', 'a', 50, 1), seq('b', 'b', 50, 2), seq('c', 'c', 50, 3), seq('d', 'd', 50, 4)]);
    await until(() => events(reports, 'd').length > 0);
    expect(events(reports, 'd')[0]).toMatchObject({ k: 'f', error: expect.stringMatching(/^overloaded/) });
    expect(events(reports, 'c').some((e) => e.k === 'f')).toBe(false);
  });
});
