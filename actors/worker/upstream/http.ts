// HTTP to an upstream model server: short bounded GETs (health, metrics), bounded POSTs (sleep, wake), and one
// streaming completion per request. Node's own http/https with a keep-alive agent per server; every read is bounded.
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage, type ClientRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';

/** The agents of one upstream server (its connections are reused across requests). */
export interface UpstreamHttp {
  readonly base: string;
  /** GET or POST `path`: the status and up to `maxBytes` of the body (more is an error), or an error message. */
  call(
    method: 'GET' | 'POST',
    path: string,
    opts: { timeoutMs: number; maxBytes: number; body?: string },
  ): Promise<{ status: number; text: string } | { error: string }>;
  /** POSTs a JSON body and hands the response's chunks on; answers a function that closes the stream. */
  stream(path: string, body: string, h: StreamHandlers): () => void;
  close(): void;
}

/** What a streaming request hears: the response head, its text chunks, and one end (`error` set when it failed). */
export interface StreamHandlers {
  head(status: number): void;
  chunk(text: string): void;
  end(error: string | null): void;
}

/** Creates the HTTP side of an upstream at `base` (`http://127.0.0.1:8000`), with `sockets` connections at most. */
export function createUpstreamHttp(base: string, sockets: number, headers: Record<string, string> = {}): UpstreamHttp {
  const tls = base.startsWith('https:');
  const agent = tls
    ? new HttpsAgent({ keepAlive: true, maxSockets: sockets, maxFreeSockets: sockets })
    : new HttpAgent({ keepAlive: true, maxSockets: sockets, maxFreeSockets: sockets });
  const send = tls ? httpsRequest : httpRequest;
  const open = (
    method: string,
    path: string,
    body: string | undefined,
    res: (r: IncomingMessage) => void,
  ): ClientRequest => {
    const req = send(`${base}${path}`, {
      method,
      agent,
      headers: {
        ...headers,
        ...(body !== undefined
          ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }
          : {}),
      },
    });
    req.on('response', res);
    if (body !== undefined) req.end(body);
    else req.end();
    return req;
  };

  return {
    base,
    call: (method, path, opts) =>
      new Promise((resolve) => {
        let done = false;
        const finish = (v: { status: number; text: string } | { error: string }): void => {
          if (done) return;
          done = true;
          resolve(v);
        };
        const req = open(method, path, opts.body, (res) => {
          const parts: Buffer[] = [];
          let n = 0;
          res.on('data', (d: Buffer) => {
            n += d.length;
            if (n > opts.maxBytes) {
              finish({ error: `${path}: more than ${opts.maxBytes} bytes` });
              req.destroy();
              return;
            }
            parts.push(d);
          });
          res.on('end', () => finish({ status: res.statusCode ?? 0, text: Buffer.concat(parts).toString('utf8') }));
          res.on('error', (e) => finish({ error: `${path}: ${e.message}` }));
        });
        req.setTimeout(opts.timeoutMs, () => {
          finish({ error: `${path}: no answer within ${opts.timeoutMs} ms` });
          req.destroy();
        });
        req.on('error', (e) => finish({ error: `${path}: ${e.message}` }));
      }),
    stream: (path, body, h) => {
      let ended = false;
      const end = (error: string | null): void => {
        if (ended) return;
        ended = true;
        h.end(error);
      };
      const req = open('POST', path, body, (res) => {
        h.head(res.statusCode ?? 0);
        res.setEncoding('utf8');
        res.on('data', (d: string) => {
          if (!ended) h.chunk(d);
        });
        res.on('end', () => end(null));
        res.on('error', (e) => end(e.message));
        res.on('aborted', () => end('the server closed the stream'));
      });
      req.on('error', (e) => end(e.message));
      req.on('close', () => end('the connection closed'));
      return () => {
        ended = true;
        req.destroy();
      };
    },
    close: () => agent.destroy(),
  };
}
