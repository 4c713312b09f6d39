// A serving control plane in one process: the control plane on the wall clock, the node link for its worker, the
// /v1/ws streaming API, OpenAI-compatible HTTP, metrics, probes and the admin API, all on one HTTP server.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { networkInterfaces } from 'node:os';
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
import { createHttpServer, ServeError } from './http-server.ts';
import { clientKeyOf, createClientCounter, holdStream, type ClientCounter, type ClientKey } from './client-caps.ts';
import { workerAllowList, type AddressAllowList } from './worker-allow.ts';
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
  /** Admin tokens for /admin; at least one. They also open the inspector's stream. */
  adminTokens: readonly string[];
  /** Tokens that open the inspector's stream (/v1/inspect) and nothing else. */
  inspectorTokens?: readonly string[];
  /** Most inspector readers at once (DEFAULT_MAX_READERS). */
  maxInspectorReaders?: number;
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
  /** Host names a request may name (`--allowed-host`); default: the loopback names when the client API is open, else
   * any. Whenever the Host is checked, the server's own addresses (the listening address; every interface's address
   * when bound to a wildcard, the pod's IP in Kubernetes) are allowed too, for probes that name the address. */
  allowedHosts?: readonly string[];
  /** Addresses and CIDR blocks the worker link (/v1/node) accepts connections from (`--worker-allow`); default:
   * loopback and the listening address. */
  workerAllow?: readonly string[];
  /** Time a request has to arrive whole, headers and body (slow senders); then 408. Default 30 s. */
  requestTimeoutMs?: number;
  /** Most concurrent HTTP connections from one address, until a request shows a known client (more are closed at
   * once). Default 512. */
  maxConnectionsPerAddress?: number;
  /** Most concurrent POSTs under /v1 (completions, SSE streams) of one client: its tenant, else its token, else its
   * address; more get 429. Default 512. */
  maxStreamsPerClient?: number;
  /** Most concurrent WebSocket connections from one address of unknown clients, and of one known client (its
   * tenant, else its token). Defaults 256 and 1024. */
  maxWsPerAddress?: number;
  maxWsPerToken?: number;
  /** Bytes of incoming /v1/ws frames waiting to be handled, of one client and of all (DEFAULT_MAX_INBOUND_BYTES). */
  maxInboundBytesPerClient?: number;
  maxInboundBytes?: number;
  /** WebSocket slots of /v1/node's own, outside every other cap. Default 8. */
  workerSlots?: number;
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

export { ServeError };

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
  const workerAllow = allowListOrRefuse(opts.workerAllow, host);
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
  cp.onProgress = (r, d) => metrics.steps(r.model, d.members / d.steps, d.steps);
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
    ...(opts.maxInboundBytes !== undefined ? { maxInboundBytes: opts.maxInboundBytes } : {}),
    ...(opts.maxInboundBytesPerClient !== undefined ? { maxInboundBytesPerClient: opts.maxInboundBytesPerClient } : {}),
    ...(opts.tokenFlushMs !== undefined ? { tokenFlushMs: opts.tokenFlushMs } : {}),
    afterTurn: () => node.flush(),
    log,
  });
  const clientSet: TokenSet | null = opts.tenants ?? (clientTokens.length > 0 ? tokenSet(clientTokens) : null);
  const tenantOf = (req: IncomingMessage): string | undefined => opts.tenants?.of(bearerToken(req))?.name;
  const edge = edgePolicy(opts, host, clientSet === null);
  const inspector = createInspectorRoutes({
    cp,
    tokens: tokenSet([...opts.adminTokens, ...(opts.inspectorTokens ?? [])]),
    allowedOrigins: opts.allowedOrigins ?? null,
    ...(opts.maxInspectorReaders !== undefined ? { maxReaders: opts.maxInspectorReaders } : {}),
  });
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
  const clientOf = clientKeyOf(opts.tenants, clientSet);
  const streamsHeld = createClientCounter(opts.maxStreamsPerClient ?? 512);
  const server = createHttpServer(
    opts,
    requestListener({ clientOf, streamsHeld, edge, inspector, handler, metrics, log }),
    (req) => clientOf(req).known,
  );
  const ws: WsServer = attachWsServer(server, {
    clock,
    log,
    maxConnections: opts.maxWsConnections ?? 4096,
    maxPerAddress: opts.maxWsPerAddress ?? 256,
    maxPerToken: opts.maxWsPerToken ?? 1024,
    clientKey: (req) => {
      const c = clientOf(req);
      return c.known ? c.key : null;
    },
    maxBufferedBytes,
    ...(opts.highWaterBytes !== undefined ? { highWaterBytes: opts.highWaterBytes } : {}),
    ...(opts.heartbeatMs !== undefined ? { heartbeatMs: opts.heartbeatMs } : {}),
    admit: (req, path) => {
      // The worker link: only from where the worker is expected (a browser cannot present its token anyway).
      if (path === '/v1/node')
        return workerAllow.allows(req.socket.remoteAddress) ? null : { status: 403, text: 'Forbidden: address' };
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
        onConnection: (peer, req) => streams.onConnection(peer, tenantOf(req), clientOf(req).key),
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
      `listening on ${host} reaches beyond this host: give client tokens (SWITCHYARD_CLIENT_TOKENS or --client-tokens-file)`,
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
}

/** The worker link's allow-list; an entry it cannot use is a ServeError naming it. */
function allowListOrRefuse(entries: readonly string[] | undefined, host: string): AddressAllowList {
  try {
    return workerAllowList(entries, host);
  } catch (e) {
    throw new ServeError((e as Error).message);
  }
}

/** The Host and Origin rules: see ServerOptions.allowedHosts. */
function edgePolicy(opts: ServerOptions, host: string, openClientApi: boolean): EdgePolicy {
  const named = opts.allowedHosts ?? (openClientApi ? LOOPBACK_HOSTS : null);
  return {
    allowedHosts:
      named === null ? null : new Set([...named, ...ownAddresses(host)].map((h) => hostName(h) ?? h.toLowerCase())),
    allowedOrigins: new Set(opts.allowedOrigins ?? []),
  };
}

/** The addresses a server bound to `host` answers on: that one, or every interface's when it is a wildcard. */
function ownAddresses(host: string): string[] {
  const bare = host.startsWith('[') ? host.slice(1, -1) : host;
  if (bare !== '0.0.0.0' && bare !== '::') return [bare];
  return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address));
}

/** Every HTTP request: the per-client caps, then the inspector's routes or the handler. An inspector route that fails
 * answers 500 on its own request, and the server serves on. */
function requestListener(d: {
  clientOf: (req: IncomingMessage) => ClientKey;
  streamsHeld: ClientCounter;
  edge: EdgePolicy;
  inspector: InspectorRoutes;
  handler: (req: IncomingMessage, res: ServerResponse) => void;
  metrics: ServerMetrics;
  log: (line: string) => void;
}): RequestListener {
  return (req, res) => {
    try {
      if (!holdStream(d.streamsHeld, d.clientOf(req).key, req, res)) return d.metrics.refused('overloaded');
      if (!edgeAllowsInspector(req, d.edge) || !d.inspector.handleHttp(req, res)) d.handler(req, res);
    } catch (e) {
      d.metrics.handlerFailed();
      d.log(`inspector route failed: ${e instanceof Error ? e.message : String(e)}`);
      if (res.headersSent) res.destroy();
      else {
        res.writeHead(500, { 'Content-Type': 'text/plain' });
        res.end('internal error');
      }
    }
  };
}

/** The inspector page is served only to allowed Hosts (the handler answers the others with 403). */
function edgeAllowsInspector(req: IncomingMessage, edge: EdgePolicy): boolean {
  return hostAllowed(req, edge);
}
