// HTTP fuzzing of a real `switchyard serve` (its own process, with its worker): seeded cases over paths, methods,
// headers, bodies, encodings, slow senders, half-closed sockets and many idle connections. Each case must get a status
// of its expected class (or a closed socket where node itself refuses), the server must never exit, and a bystander
// stream opened at the start must finish intact. `npx tsx test/fuzz/http-fuzz.ts --cases 1000000` ends with one JSON
// line {"cases","crashes","bystanderBroken","maxRssMb"}; test/api/http/fuzz.test.ts runs a bounded budget in npm test.
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { connectClient } from '../../api/client.ts';
import { serve, type Served } from '../e2e/harness.ts';

/** The fuzz run's result. */
export interface FuzzResult {
  cases: number;
  crashes: number;
  bystanderBroken: number;
  maxRssMb: number;
  /** Cases whose answer was outside the expected class, with what came back (at most 20 kept). */
  unexpected: string[];
}

const MODEL = 'llama-3-8b';

/** A small seeded generator (xorshift32): the same seed gives the same cases. */
function rng(seed: number): { int(n: number): number; pick<T>(xs: readonly T[]): T } {
  let x = seed >>> 0 || 1;
  const next = (): number => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
  return { int: (n) => next() % n, pick: (xs) => xs[next() % xs.length]! };
}

type Rng = ReturnType<typeof rng>;

/** One case: raw bytes to send, how to send them, and the statuses that are acceptable (0: the socket closed). */
interface Case {
  kind: string;
  bytes: string;
  ok: (status: number) => boolean;
  /** Send the bytes then half-close (FIN) the socket. */
  halfClose?: boolean;
  /** Send only this many bytes, then wait without sending more (a slow sender). */
  stallAfter?: number;
}

const PATHS = [
  '/',
  '//',
  '///',
  '//inspector',
  '/inspector/',
  '/inspector/../../etc/passwd',
  '/v1/models',
  '/v1/ws',
  '/v1/completions',
  '/v1/chat/completions',
  '/admin/status',
  '/admin/replicas/%zz/drain',
  '/admin/gpus/99/fail',
  '/metrics',
  '/healthz',
  '/readyz',
  '/%',
  '/%00',
  '/a?b=%',
  '/\u00e9',
  '*',
  'http://x/',
  '/v1/../admin/status',
];
const METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'HEAD', 'OPTIONS', 'PATCH', 'TRACE', 'CONNECT', 'FOO', 'G ET'];
const BODIES = [
  '',
  '{',
  '[]',
  'null',
  '"x"',
  '{"model":1}',
  `{"model":"${MODEL}","prompt":"hi","max_tokens":2}`,
  `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
  '{"__proto__":{"x":1}}',
  `{"model":"x","prompt":${'['.repeat(5000)}`,
  '{"model":"m","max_tokens":1e309}',
  '\u0000\u0001\u00ff',
];
const TYPES = [
  'application/json',
  'text/plain',
  'application/x-www-form-urlencoded',
  'multipart/form-data',
  '',
  'application/json; charset=utf-16',
  'application/vnd.api+json',
];

// 100 is the interim answer to `Expect: 100-continue`.
const anyStatus = (s: number): boolean => s === 0 || s === 100 || (s >= 200 && s < 500) || s === 503;

/** Draws one case. Every case allows 503 only where the server may legitimately be unready or overloaded. */
function drawCase(r: Rng): Case {
  const path = r.pick(PATHS) + (r.int(4) === 0 ? `?${'q'.repeat(r.int(3000))}` : '');
  const host = r.pick(['127.0.0.1', 'localhost', 'evil.example', '', '[::1]']);
  const hostLine = host === '' ? '' : `Host: ${host}\r\n`;
  switch (r.int(6)) {
    case 0:
      return { kind: 'path', bytes: `GET ${path} HTTP/1.1\r\n${hostLine}Connection: close\r\n\r\n`, ok: anyStatus };
    case 1:
      return {
        kind: 'method',
        bytes: `${r.pick(METHODS)} ${path} HTTP/1.1\r\n${hostLine}Connection: close\r\n\r\n`,
        ok: anyStatus,
      };
    case 2: {
      const extra = r.pick([
        `X-Big: ${'a'.repeat(20_000)}\r\n`,
        'Authorization: Bearer \r\n',
        'Authorization: Basic Zm9vOmJhcg==\r\n',
        'Origin: https://evil.example\r\n',
        'Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: x\r\n',
        'Content-Length: -1\r\n',
        'Content-Length: 5\r\nTransfer-Encoding: chunked\r\n',
        'Expect: 100-continue\r\n',
      ]);
      return {
        kind: 'header',
        bytes: `GET ${path} HTTP/1.1\r\n${hostLine}${extra}Connection: close\r\n\r\n`,
        ok: anyStatus,
      };
    }
    case 3: {
      const body = r.pick(BODIES);
      const type = r.pick(TYPES);
      const target = r.pick(['/v1/completions', '/v1/chat/completions', '/admin/routing', '/admin/placement']);
      const head = `POST ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\n${type ? `Content-Type: ${type}\r\n` : ''}`;
      const enc = r.int(5) === 0 ? `Content-Encoding: ${r.pick(['gzip', 'br', 'x-bogus'])}\r\n` : '';
      const bytes = `${head}${enc}Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
      // A valid completion may be served (200) or refused for load (429); nothing may answer 500.
      return { kind: 'body', bytes, ok: (s) => s === 0 || (s >= 200 && s < 500) || s === 503 };
    }
    case 4: {
      const chunked = `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${r.pick(['zz\r\n', '5\r\n{"a"\r\n', 'ffffffffff\r\n', '0\r\n\r\n'])}`;
      return { kind: 'encoding', bytes: chunked, ok: anyStatus, halfClose: true };
    }
    default:
      return {
        kind: 'half-closed',
        bytes: `GET ${path} HTTP/1.1\r\n${hostLine}`,
        ok: anyStatus,
        halfClose: true,
      };
  }
}

/** Sends one case over a raw socket; resolves with the status line's code (0 when none came before close). */
function send(port: number, c: Case, timeoutMs: number): Promise<number> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let got = '';
    const t = setTimeout(() => s.destroy(), timeoutMs);
    s.on('data', (d) => {
      got += d.toString('latin1');
      if (/^HTTP\/1\.1 \d{3}/.test(got)) s.destroy();
    });
    s.on('close', () => {
      clearTimeout(t);
      resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0));
    });
    s.on('error', () => {});
    s.on('connect', () => {
      s.write(c.stallAfter !== undefined ? c.bytes.slice(0, c.stallAfter) : c.bytes);
      if (c.halfClose) s.end();
    });
  });
}

/** Opens `n` idle connections (nothing sent) and one slow sender per ten; resolves with a closer. */
function idle(port: number, n: number): () => void {
  const sockets = Array.from({ length: n }, (_, i) => {
    const s = connect(port, '127.0.0.1');
    s.on('error', () => {});
    if (i % 10 === 0)
      s.on('connect', () =>
        s.write(
          'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{',
        ),
      );
    return s;
  });
  return () => sockets.forEach((s) => s.destroy());
}

/** Runs `cases` cases against a fresh `serve` process; `concurrency` at a time. */
export async function runHttpFuzz(opts: {
  cases: number;
  seed?: number;
  concurrency?: number;
  /** Stop drawing cases after this long (ms); `cases` in the result is the exact count run. */
  maxMs?: number;
}): Promise<FuzzResult> {
  const served: Served = await serve(['--time-scale', '0.05', '--request-timeout-ms', '2000', '--drain-ms', '0']);
  const port = Number(new URL(served.url).port);
  let crashes = 0;
  served.proc.once('exit', () => crashes++);
  const result: FuzzResult = { cases: 0, crashes: 0, bystanderBroken: 0, maxRssMb: 0, unexpected: [] };
  try {
    await served.waitReady(MODEL);
    const client = await connectClient(served.wsUrl, {});
    // Bystanders stream one after another for the whole run; each must end done with every token it asked for.
    let stopBystanders = false;
    let bystanders = 0;
    const bystanding = (async () => {
      while (!stopBystanders) {
        const s = client.stream({ model: MODEL, prompt: `bystander ${bystanders}`, maxTokens: 200 });
        let n = 0;
        try {
          for await (const c of s) n += c.n;
          const end = await s.result;
          if (!end.ok || end.usage.completionTokens !== 200 || n !== 200) result.bystanderBroken++;
        } catch (e) {
          result.bystanderBroken++;
          if (result.unexpected.length < 20) result.unexpected.push(`bystander: ${(e as Error).message}`);
        }
        bystanders++;
      }
    })();
    const r = rng(opts.seed ?? 1);
    const closeIdle = idle(port, 200);
    const concurrency = opts.concurrency ?? 32;
    let next = 0;
    const stopAt = performance.now() + (opts.maxMs ?? Infinity);
    const lane = async (): Promise<void> => {
      while (next < opts.cases && crashes === 0 && performance.now() < stopAt) {
        next++;
        const c = drawCase(r);
        const status = await send(port, c, 5_000);
        result.cases++;
        if (!c.ok(status) && result.unexpected.length < 20)
          result.unexpected.push(`${c.kind} -> ${status}: ${JSON.stringify(c.bytes.slice(0, 120))}`);
      }
    };
    const rss = setInterval(() => {
      result.maxRssMb = Math.max(result.maxRssMb, rssOf(served.proc.pid));
    }, 500);
    await Promise.all(Array.from({ length: concurrency }, lane));
    clearInterval(rss);
    closeIdle();
    const health = await fetch(`${served.url}/healthz`)
      .then((x) => x.status)
      .catch(() => 0);
    if (health !== 200) crashes++;
    stopBystanders = true;
    await bystanding;
    if (bystanders === 0) result.bystanderBroken++;
    client.close();
  } finally {
    result.crashes = crashes;
    await served.stop();
  }
  return result;
}

/** Resident set of a process in MiB (Linux /proc), 0 when unknown. */
function rssOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return Math.round(Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024);
  } catch {
    return 0;
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: {
      cases: { type: 'string', default: '1000000' },
      seed: { type: 'string', default: '1' },
      'max-seconds': { type: 'string', default: '10800' },
    },
    strict: true,
  });
  const cases = Number(values.cases);
  const maxSeconds = Number(values['max-seconds']);
  if (!Number.isSafeInteger(cases) || cases < 1 || !(maxSeconds > 0)) {
    process.stderr.write('usage: npx tsx test/fuzz/http-fuzz.ts [--cases N] [--seed S] [--max-seconds 10800]\n');
    process.exit(2);
  }
  runHttpFuzz({ cases, seed: Number(values.seed), maxMs: maxSeconds * 1000 }).then(
    (r) => {
      for (const u of r.unexpected) process.stderr.write(`unexpected: ${u}\n`);
      const { unexpected, ...line } = r;
      process.stdout.write(`${JSON.stringify({ ...line, unexpected: unexpected.length })}\n`);
      process.exitCode = r.crashes > 0 || r.bystanderBroken > 0 || unexpected.length > 0 ? 1 : 0;
    },
    (e: unknown) => {
      process.stderr.write(`http-fuzz: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exitCode = 1;
    },
  );
}
