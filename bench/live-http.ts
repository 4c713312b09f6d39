// The HTTP half of `npm run bench:live`: a bare `node:http` server that streams the same 16 tokens per request as
// OpenAI-style SSE (the baseline), and one closed-loop load generator for both it and switchyard's
// POST /v1/completions with `stream: true`. Run as `http-bare` and `http-loadgen` processes by bench/live.ts.
import { Agent, createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createWallClock, unixTimeMs } from '../runtime/clock.ts';
import { textRange, textSeed } from '../api/pseudo-text.ts';

/** What the HTTP load generator is asked to do. */
export interface HttpLoadSpec {
  /** Base URL (`http://127.0.0.1:port`). */
  url: string;
  model: string;
  /** Requests in flight at once, each on its own keep-alive connection. */
  conns: number;
  maxTokens: number;
  warmupMs: number;
  windowMs: number;
}

const MAX_BODY = 64 * 1024;

/**
 * Runs the bare SSE server; prints `{"url": ...}` once listening. Each POST's JSON body is read and parsed, then
 * `max_tokens` tokens (16 unless asked) leave as `text_completion` chunks like switchyard's, one chunk per turn of the
 * event loop (a model that produces a token per step), then the finishing chunk and `data: [DONE]`.
 */
export async function runHttpBare(): Promise<void> {
  const clock = createWallClock();
  let n = 0;
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    let size = 0;
    req.on('data', (d: Buffer) => {
      size += d.length;
      if (size > MAX_BODY) req.destroy();
      else parts.push(d);
    });
    req.on('end', () => {
      let body: { model?: unknown; max_tokens?: unknown; prompt?: unknown };
      try {
        body = JSON.parse(Buffer.concat(parts).toString('utf8')) as typeof body;
      } catch {
        res.writeHead(400).end();
        return;
      }
      const model = typeof body.model === 'string' ? body.model : 'bare';
      const max = typeof body.max_tokens === 'number' ? Math.max(1, Math.min(4096, body.max_tokens)) : 16;
      const seed = textSeed(`${model}\u0000${typeof body.prompt === 'string' ? body.prompt : ''}`);
      const id = `cmpl-bare-${++n}`;
      const created = Math.floor(unixTimeMs() / 1000);
      const chunk = (text: string, finish: string | null): string =>
        `data: ${JSON.stringify({ id, object: 'text_completion', created, model, choices: [{ index: 0, text, finish_reason: finish, logprobs: null }] })}\n\n`;
      res.writeHead(200, {
        'Content-Type': 'text/event-stream',
        'Cache-Control': 'no-cache',
        Connection: 'keep-alive',
      });
      let k = 0;
      const next = (): void => {
        if (res.destroyed) return;
        if (k < max) {
          res.write(chunk(textRange(seed, k, 1), null));
          k++;
          clock.setTimeout(next, 0);
          return;
        }
        res.write(chunk('', 'length'));
        res.end('data: [DONE]\n\n');
      };
      clock.setTimeout(next, 0);
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })}\n`);
  process.once('SIGTERM', () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}

/**
 * Closed loop: `conns` streaming requests in flight, each replaced as soon as its stream ends with `data: [DONE]`;
 * counts completed streams and their token chunks over a window after a warm-up. Prints one JSON line.
 */
export async function runHttpLoadgen(s: HttpLoadSpec): Promise<void> {
  const clock = createWallClock();
  const agent = new Agent({ keepAlive: true, maxSockets: s.conns, maxFreeSockets: s.conns });
  const target = new URL('/v1/completions', s.url);
  const payload = JSON.stringify({ model: s.model, prompt: 'hello', max_tokens: s.maxTokens, stream: true });
  let completed = 0;
  let tokens = 0;
  let failed = 0;
  let short = 0;
  // Connections opened: with keep-alive, `conns` of them unless the server closed some.
  let sockets = 0;
  let firstFailure = '';
  let running = true;
  const fail = (why: string): void => {
    failed++;
    firstFailure ||= why;
  };
  const one = (): void => {
    if (!running) return;
    const req = request(
      target,
      {
        method: 'POST',
        agent,
        headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) },
      },
      (res) => {
        if (res.statusCode !== 200) {
          fail(`HTTP ${res.statusCode}`);
          res.resume();
          res.on('end', () => clock.setTimeout(one, 0));
          return;
        }
        res.setEncoding('utf8');
        // SSE events end with a blank line; one "\n" may end a chunk and the next may start with the other.
        let events = 0;
        let carry = '';
        let end = '';
        res.on('data', (d: string) => {
          const text = carry + d;
          for (let i = text.indexOf('\n\n'); i >= 0; i = text.indexOf('\n\n', i + 2)) events++;
          carry = text.endsWith('\n') && !text.endsWith('\n\n') ? '\n' : '';
          end = (end + d).slice(-32);
        });
        res.on('end', () => {
          // Token chunks, then the finishing chunk and [DONE].
          const tok = events - 2;
          if (!end.endsWith('data: [DONE]\n\n')) fail('stream ended without [DONE]');
          else {
            if (tok !== s.maxTokens) short++;
            completed++;
            tokens += tok;
          }
          // On the next turn: the socket goes back to the agent's pool after 'end', to be reused (keep-alive).
          clock.setTimeout(one, 0);
        });
      },
    );
    req.once('socket', () => {
      if (!req.reusedSocket) sockets++;
    });
    req.on('error', (e) => {
      fail(e.message);
      if (running) clock.setTimeout(one, 10);
    });
    req.end(payload);
  };
  for (let i = 0; i < s.conns; i++) one();
  await new Promise<void>((r) => clock.setTimeout(r, s.warmupMs));
  const t0 = performance.now();
  const c0 = completed;
  const k0 = tokens;
  await new Promise<void>((r) => clock.setTimeout(r, s.windowMs));
  const secs = (performance.now() - t0) / 1000;
  running = false;
  const result = {
    requestsPerS: Math.round((completed - c0) / secs),
    tokensPerS: Math.round((tokens - k0) / secs),
    completed,
    failed,
    short,
    sockets,
    firstFailure,
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
  agent.destroy();
}
