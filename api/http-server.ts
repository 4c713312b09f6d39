// The serving control plane's HTTP(S) server, with every phase bounded (headers, whole requests, keep-alive) and
// connections capped per address until a known client claims them.
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer, type ServerOptions as HttpsOptions } from 'node:https';
import type { Socket } from 'node:net';
import { createClientCounter } from './client-caps.ts';
import type { ServerOptions } from './server.ts';

/** Refusal to start: the configuration is unsafe or incomplete. */
export class ServeError extends Error {
  override readonly name = 'ServeError';
}

/** What the HTTP server takes from the server's options. */
export type HttpServerOptions = Pick<
  ServerOptions,
  'tls' | 'headersTimeoutMs' | 'requestTimeoutMs' | 'maxConnections' | 'maxConnectionsPerAddress'
>;

/** createHttpsServer, with an unusable certificate or key refused as a ServeError naming the cause. */
function createTlsServer(options: HttpsOptions, listener: RequestListener): ReturnType<typeof createHttpsServer> {
  try {
    return createHttpsServer(options, listener);
  } catch (e) {
    throw new ServeError(`the TLS certificate or key cannot be used: ${(e as Error).message}`);
  }
}

/** The HTTP server with every phase bounded: headers, the whole request (slow bodies), idle keep-alive, connections.
 * `knownClient(req)` says when a request (or an upgrade) shows a known client: its connection then leaves its
 * address's count. */
export function createHttpServer(
  opts: HttpServerOptions,
  listener: RequestListener,
  knownClient: (req: IncomingMessage) => boolean,
): Server {
  const counted = new WeakMap<Socket, () => void>();
  const headersTimeoutMs = opts.headersTimeoutMs ?? 10_000;
  const requestTimeoutMs = Math.max(opts.requestTimeoutMs ?? 30_000, headersTimeoutMs + 1);
  const common = {
    maxHeaderSize: 16 * 1024,
    requestTimeout: requestTimeoutMs,
    headersTimeout: headersTimeoutMs,
    connectionsCheckingInterval: Math.min(1_000, Math.max(50, headersTimeoutMs / 4)),
    keepAliveTimeout: 5_000,
  };
  // HTTPS is the same server behind TLS (a TLS handshake that fails only closes its socket); https.Server has
  // every http.Server method used here.
  const server: Server = opts.tls
    ? (createTlsServer(
        {
          ...common,
          cert: opts.tls.cert,
          key: opts.tls.key,
          minVersion: 'TLSv1.2',
          handshakeTimeout: headersTimeoutMs,
        },
        listener,
      ) as unknown as Server)
    : createServer(common, listener);
  server.maxConnections = opts.maxConnections ?? 8192;
  // Connections count against their address until one of their requests shows a known client (a tenant's or a client
  // token): behind a gateway every client shares one address, and known clients are capped by their own streams.
  const perAddress = createClientCounter(opts.maxConnectionsPerAddress ?? 512);
  // Over TLS, the socket requests arrive on is the one after the handshake (bounded by handshakeTimeout before it).
  server.on(opts.tls ? 'secureConnection' : 'connection', (socket: Socket) => {
    const release = perAddress.take(socket.remoteAddress ?? '?');
    if (release === null) return void socket.destroy();
    counted.set(socket, release);
    socket.once('close', release);
  });
  const claim = (req: IncomingMessage): void => {
    if (knownClient(req)) counted.get(req.socket as Socket)?.();
  };
  server.prependListener('request', claim);
  server.prependListener('upgrade', claim);
  // `Expect: 100-continue`: node writes the interim 100 straight to the socket, so on a request pipelined behind one
  // not yet answered it lands inside that answer (between its headers and body) and garbles the stream. It is sent
  // only when this request's answer is next on the socket; otherwise the final answer alone is sent (which RFC 9110
  // allows) and node closes the connection after it.
  // Emitted as 'request' so that every listener (the WebSocket server counts answers owed per connection) sees it.
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
    if (res.socket) res.writeContinue();
    server.emit('request', req, res);
  });
  // A malformed or slow request is answered by node itself (400, 408 or 431) and its socket closed: no listener here.
  return server;
}
