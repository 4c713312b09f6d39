// A serving control plane in one process: the control plane on the wall clock, the node link for its worker, the
// /v1/ws streaming API, OpenAI-compatible HTTP, metrics, probes and the admin API, all on one HTTP server.
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer, type ServerOptions as HttpsOptions } from 'node:https';
import type { AddressInfo } from 'node:net';
import { startControlPlane, type ControlPlane } from '../actors/control-plane.ts';
import type { Scenario } from '../actors/config.ts';
import { createWallClock, type Clock } from '../runtime/clock.ts';
import { createRng } from '../runtime/rng.ts';
import { createRuntime, type Runtime } from '../runtime/system.ts';
import { faultHandler, timerFailed } from '../runtime/contain.ts';
import { CLIENT_SUBPROTOCOLS } from '../transport/client-protocol.ts';
import { createHttpHandler } from './http/handler.ts';
import type { AdminHooks } from './http/admin.ts';
import { createBoundedCollector } from './bounded-collector.ts';
import {
  DEFAULT_MAX_BUFFERED,
  attachWsServer,
  bearerToken,
  isLoopback,
  tokenSet,
  type TokenSet,
  type WsServer,
} from '../transport/ws.ts';
import { createServerMetrics, type ServerMetrics } from './metrics.ts';
import { startNodeLink, type NodeLink } from '../actors/node-link.ts';
import { createServing, type PromptTokenizer, type Serving } from './serving.ts';
import { createStreamApi, type StreamApi } from './stream-api.ts';
import { createInspectorRoutes, type InspectorRoutes } from '../inspector/server.ts';
import { LOOPBACK_HOSTS, hostAllowed, hostName, originAllowed, type EdgePolicy } from './http/edge.ts';
import { createDrainGate } from './drain.ts';
import { createTenantGate } from './tenant-gate.ts';
import type { Tenants } from './tenants.ts';

/** Options of a serving control plane. */
export interface ServerOptions {
  scenario: Scenario;
  /** Interface to bind; 127.0.0.1 unless told otherwise. */
  host?: string;
  /** Port; 0 picks a free one. */
  port?: number;
  /** Client tokens for /v1 and /v1/ws; required when host is not loopback (tenants count as tokens). */
  clientTokens?: readonly string[];
  /** Certificate and key (PEM): serve HTTPS and WSS (`--tls-cert`, `--tls-key`). */
  tls?: { cert: string | Buffer; key: string | Buffer };
  /** Allow a non-loopback listener without TLS (bearer tokens in clear text): TLS ends in front of it (`--insecure`). */
  insecure?: boolean;
  /** Tenants (a tokens file): each client token's tenant, its limits and its fair share; replaces clientTokens. */
  tenants?: Tenants;
  /** Worker tokens for /v1/node; at least one. */
  workerTokens: readonly string[];
  /** Admin tokens for /admin; at least one. */
  adminTokens: readonly string[];
  /** Grace before a disconnected worker's GPUs are failed. */
  nodeGraceMs?: number;
  heartbeatMs?: number;
  maxStreamsPerConnection?: number;
  /** Least time between two writes to a client that carry only later tokens and ends (ms); default TOKEN_FLUSH_MS,
   * 0 writes every turn of the loop (`--token-flush-ms`). */
  tokenFlushMs?: number;
  maxConnections?: number;
  /** Most concurrent WebSocket connections (clients, workers, inspectors); more get HTTP 503 at the upgrade. Default 4096. */
  maxWsConnections?: number;
  /** Time a connection has to send complete request headers (slow upgrades, idle sockets); then HTTP 408. Default 10 s. */
  headersTimeoutMs?: number;
  /** Outgoing bytes (socket buffer plus merged messages waiting) past which a client is cut off with 4001. Default 16 MiB. */
  maxBufferedBytes?: number;
  /** Outgoing bytes above which a socket counts as congested. Default 1 MiB. */
  highWaterBytes?: number;
  /** Browser Origins allowed besides the server's own, on /v1, /admin, /v1/ws and /v1/inspect (`--allowed-origin`). */
  allowedOrigins?: readonly string[];
  /** Host names a request may name (`--allowed-host`); default: the loopback names when the client API is open. */
  allowedHosts?: readonly string[];
  /** Time a request has to arrive whole, headers and body (slow senders); then 408. Default 30 s. */
  requestTimeoutMs?: number;
  /** Most concurrent HTTP connections from one address (more are closed at once). Default 512. */
  maxConnectionsPerAddress?: number;
  /** Most concurrent WebSocket connections from one address, and presenting one token. Defaults 256 and 1024. */
  maxWsPerAddress?: number;
  maxWsPerToken?: number;
  /** WebSocket slots of /v1/node's own, outside every other cap. Default 8. */
  workerSlots?: number;
  /** Shortest token accepted (characters); `serve` passes MIN_TOKEN_LENGTH. Default 0 (embedders and tests). */
  minTokenLength?: number;
  clock?: Clock;
  log?(line: string): void;
  /** The tokenizers of models served by a real engine, by model name (serve loads them before it starts). */
  tokenizers?: ReadonlyMap<string, PromptTokenizer>;
  /** Extra fields for /admin/status. */
  status?(): Record<string, unknown>;
  /** The operator layer (rollouts, the state file), made once the control plane exists. */
  admin?(cp: ControlPlane, node: NodeLink): AdminHooks;
}

/** A running server. */
export interface RunningServer {
  readonly port: number;
  readonly host: string;
  /** Base URL of the HTTP API (`http://host:port`). */
  readonly url: string;
  /** The client streaming endpoint. */
  readonly wsUrl: string;
  /** The endpoint workers register on. */
  readonly nodeUrl: string;
  readonly cp: ControlPlane;
  readonly runtime: Runtime;
  readonly node: NodeLink;
  readonly serving: Serving;
  readonly streams: StreamApi;
  readonly metrics: ServerMetrics;
  /** The inspector: /inspector page and the read-only /v1/inspect stream. */
  readonly inspector: InspectorRoutes;
  /** True when client tokens are not required (loopback only). */
  readonly openClientApi: boolean;
  /**
   * Graceful stop: readiness false and no new requests at once (503 with Retry-After), running requests finish
   * within `deadlineMs`, every request still open then gets one terminal event (cancelled); resolves when none is
   * left. Call close() after it.
   */
  drain(deadlineMs: number): Promise<void>;
  /** True once drain() was called. */
  draining(): boolean;
  close(): Promise<void>;
}

/** Shortest token `serve` accepts. */
export const MIN_TOKEN_LENGTH = 16;

/** Refusal to start: the configuration is unsafe or incomplete. */
export class ServeError extends Error {
  override readonly name = 'ServeError';
}

/** The control plane's runtime: a fault an actor contained is logged; one it did not (its state unknown) ends the
 * process, naming its requests. */
function controlRuntime(seed: number, clock: Clock, log: (line: string) => void): Runtime {
  return createRuntime({ name: 'control', clock, rng: createRng(seed).fork('control'), onFault: faultHandler(log) });
}

/** Starts serving `scenario`; resolves once the HTTP server listens. */
export async function startServer(opts: ServerOptions): Promise<RunningServer> {
  const host = opts.host ?? '127.0.0.1';
  const clientTokens = opts.clientTokens ?? [];
  checkOptions(opts, host, clientTokens);
  const log = opts.log ?? (() => {});
  const clock = opts.clock ?? createWallClock(timerFailed(log));
  const runtime = controlRuntime(opts.scenario.seed, clock, log);
  const cp = startControlPlane(runtime, opts.scenario, {
    checkInvariants: false,
    collector: createBoundedCollector(),
    realEngines: true,
    log,
  });
  const node = startNodeLink(runtime, {
    gpus: opts.scenario.node.gpus,
    graceMs: opts.nodeGraceMs ?? 2_000,
    log,
    // The same node settings the simulator gives its agent.
    settings: {
      heartbeatMs: opts.scenario.detection.heartbeatMs,
      repairMs: opts.scenario.node.repairMs,
      lanes: opts.scenario.placement.policy === 'share' ? 2 : 1,
    },
  });
  const metrics = createServerMetrics(cp, node);
  cp.onStep = (r, plan) => metrics.step(r.model, plan.entries.length);
  const base = createServing(cp, node, metrics, opts.tokenizers);
  const tenantGate = opts.tenants
    ? createTenantGate(base, {
        clock,
        tenants: opts.tenants,
        refused: (code) => metrics.refused(code === 'overloaded' ? 'tenant_limit' : code),
      })
    : null;
  const gate = createDrainGate(tenantGate ?? base, clock);
  const serving = gate.serving;
  const maxBufferedBytes = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED;
  const streams = createStreamApi(serving, metrics, {
    clock,
    maxStreamsPerConnection: opts.maxStreamsPerConnection ?? 16_384,
    maxQueuedBytes: maxBufferedBytes,
    ...(opts.tokenFlushMs !== undefined ? { tokenFlushMs: opts.tokenFlushMs } : {}),
    afterTurn: () => node.flush(),
    log,
  });
  const clientSet: TokenSet | null = opts.tenants ?? (clientTokens.length > 0 ? tokenSet(clientTokens) : null);
  const tenantOf = (req: IncomingMessage): string | undefined => opts.tenants?.of(bearerToken(req))?.name;
  const edge: EdgePolicy = {
    allowedHosts: opts.allowedHosts
      ? new Set(opts.allowedHosts.map((h) => hostName(h) ?? h.toLowerCase()))
      : clientSet === null
        ? new Set(LOOPBACK_HOSTS)
        : null,
    allowedOrigins: new Set(opts.allowedOrigins ?? []),
  };
  const inspector = createInspectorRoutes({ cp, tokens: clientSet, allowedOrigins: opts.allowedOrigins ?? null });
  const handler = createHttpHandler({
    cp,
    serving,
    metrics,
    node,
    clientTokens: clientSet,
    adminTokens: tokenSet(opts.adminTokens),
    edge,
    draining: gate.draining,
    tenantOf,
    log,
    ...(opts.tokenFlushMs !== undefined ? { tokenFlushMs: opts.tokenFlushMs } : {}),
    ...(opts.status ? { status: opts.status } : {}),
    ...(opts.admin ? { adminHooks: opts.admin(cp, node) } : {}),
  });
  const server = createHttpServer(opts, (req, res) => {
    try {
      if (!edgeAllowsInspector(req, edge) || !inspector.handleHttp(req, res)) handler(req, res);
    } catch (e) {
      // The inspector's routes failed on this request: answer it alone, count it, and serve on.
      metrics.handlerFailed();
      log(`inspector route failed: ${e instanceof Error ? e.message : String(e)}`);
      if (res.headersSent) res.destroy();
      else {
        res.writeHead(500, { 'Content-Type': 'text/plain' });
        res.end('internal error');
      }
    }
  });
  const ws: WsServer = attachWsServer(server, {
    clock,
    log,
    maxConnections: opts.maxWsConnections ?? 4096,
    maxPerAddress: opts.maxWsPerAddress ?? 256,
    maxPerToken: opts.maxWsPerToken ?? 1024,
    maxBufferedBytes,
    ...(opts.highWaterBytes !== undefined ? { highWaterBytes: opts.highWaterBytes } : {}),
    ...(opts.heartbeatMs !== undefined ? { heartbeatMs: opts.heartbeatMs } : {}),
    admit: (req, path) => {
      if (path === '/v1/node') return null;
      if (!hostAllowed(req, edge)) return { status: 403, text: 'Forbidden: Host not allowed' };
      if (gate.draining()) return { status: 503, text: 'Service Unavailable: shutting down' };
      return null;
    },
    checkOrigin: (_o, req) => originAllowed(req, edge),
    routes: {
      '/v1/node': {
        tokens: tokenSet(opts.workerTokens),
        ownSlots: opts.workerSlots ?? 8,
        onConnection: (peer) => node.onConnection(peer),
      },
      '/v1/ws': {
        tokens: clientSet,
        protocols: CLIENT_SUBPROTOCOLS,
        onConnection: (peer, req) => streams.onConnection(peer, tenantOf(req)),
      },
      '/v1/inspect': inspector.ws,
    },
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 8080, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const shown = host.includes(':') ? `[${host}]` : host;
  const [httpScheme, wsScheme] = opts.tls ? ['https', 'wss'] : ['http', 'ws'];
  return {
    port,
    host,
    url: `${httpScheme}://${shown}:${port}`,
    wsUrl: `${wsScheme}://${shown}:${port}/v1/ws`,
    nodeUrl: `${wsScheme}://${shown}:${port}/v1/node`,
    cp,
    runtime,
    node,
    serving,
    streams,
    metrics,
    inspector,
    openClientApi: clientSet === null,
    drain: (deadlineMs) => gate.drain(deadlineMs, () => cp.live() + (tenantGate?.pending() ?? 0)),
    draining: gate.draining,
    close: () =>
      new Promise<void>((resolve) => {
        node.close();
        inspector.close();
        ws.close();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Refuses to start an unsafe or incomplete configuration (a ServeError saying what to give). */
function checkOptions(opts: ServerOptions, host: string, clientTokens: readonly string[]): void {
  if (!isLoopback(host) && clientTokens.length === 0 && !opts.tenants) {
    throw new ServeError(
      `listening on ${host} reaches beyond this host: give client tokens (--client-token or SWITCHYARD_CLIENT_TOKENS)`,
    );
  }
  if (!isLoopback(host) && !opts.tls && opts.insecure !== true) {
    throw new ServeError(
      `listening on ${host} in plain text would send bearer tokens in clear text: give --tls-cert and --tls-key, or --insecure when TLS ends in front of this server`,
    );
  }
  if (opts.workerTokens.length === 0)
    throw new ServeError('workers always authenticate: give at least one worker token');
  if (opts.adminTokens.length === 0)
    throw new ServeError('the admin API always authenticates: give at least one admin token');
  const minLength = opts.minTokenLength ?? 0;
  for (const [kind, list] of [
    ['client', clientTokens],
    ['worker', opts.workerTokens],
    ['admin', opts.adminTokens],
  ] as const) {
    if (list.some((t) => t.length < minLength))
      throw new ServeError(`a ${kind} token is shorter than ${minLength} characters: use a longer, random one`);
  }
}

/** createHttpsServer, with an unusable certificate or key refused as a ServeError naming the cause. */
function createTlsServer(options: HttpsOptions, listener: RequestListener): ReturnType<typeof createHttpsServer> {
  try {
    return createHttpsServer(options, listener);
  } catch (e) {
    throw new ServeError(`the TLS certificate or key cannot be used: ${(e as Error).message}`);
  }
}

/** The inspector page is served only to allowed Hosts (the handler answers the others with 403). */
function edgeAllowsInspector(req: IncomingMessage, edge: EdgePolicy): boolean {
  return hostAllowed(req, edge);
}

/** The HTTP server with every phase bounded: headers, the whole request (slow bodies), idle keep-alive, connections. */
function createHttpServer(opts: ServerOptions, listener: RequestListener): Server {
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
  const perAddress = new Map<string, number>();
  const maxPerAddress = opts.maxConnectionsPerAddress ?? 512;
  server.on('connection', (socket) => {
    const address = socket.remoteAddress ?? '?';
    const n = (perAddress.get(address) ?? 0) + 1;
    if (n > maxPerAddress) return void socket.destroy();
    perAddress.set(address, n);
    socket.once('close', () => {
      const left = (perAddress.get(address) ?? 1) - 1;
      if (left <= 0) perAddress.delete(address);
      else perAddress.set(address, left);
    });
  });
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
