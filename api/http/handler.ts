// The HTTP routes of a serving control plane: client APIs under /v1 (client token when configured), the admin API under
// /admin (admin token, always), and the unauthenticated probes /healthz, /readyz and /metrics (Host checked all the same).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { failure } from '../../machines/outcomes.ts';
import type { ControlPlane } from '../../actors/control-plane.ts';
import type { NodeLink } from '../../actors/node-link.ts';
import type { ServerMetrics } from '../metrics.ts';
import type { Serving } from '../serving.ts';
import { bearerToken, requestPath, type TokenSet } from '../../transport/ws.ts';
import { hasBody, hostAllowed, isJsonContent, originAllowed, type EdgePolicy } from './edge.ts';
import { handleAdmin, type AdminHooks } from './admin.ts';
import { sendFailure, sendJson } from './io.ts';
import { handleCompletion, handleModels } from './openai.ts';
import { contained } from '../../runtime/contain.ts';

/** What the routes need. */
export interface HttpDeps {
  cp: ControlPlane;
  serving: Serving;
  metrics: ServerMetrics;
  node: NodeLink;
  /** Client tokens for /v1; null leaves /v1 open (loopback only). */
  clientTokens: TokenSet | null;
  adminTokens: TokenSet;
  /** Extra fields for /admin/status. */
  status?(): Record<string, unknown>;
  /** Rollouts and the state file's hook. */
  adminHooks?: AdminHooks;
  /** Host and Origin rules; absent accepts any (tests of the routes alone). */
  edge?: EdgePolicy;
  /** True once the server is stopping: not ready, no new requests. */
  draining?(): boolean;
  /** The tenant a request's token belongs to, when tenants are configured. */
  tenantOf?(req: IncomingMessage): string | undefined;
  /** Least time between an SSE stream's writes of later tokens (ms; default TOKEN_FLUSH_MS). */
  tokenFlushMs?: number;
  /** The operator's log: a handler that failed on one request. */
  log?(line: string): void;
}

/** The policies in force now (the admin API may have changed them since start). */
export interface LivePolicies {
  placement: string;
}

const PROBES = new Set(['/healthz', '/readyz', '/metrics']);

/** Creates the request handler of the HTTP server. */
export function createHttpHandler(deps: HttpDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const live: LivePolicies = { placement: deps.cp.scenario.placement.policy };
  const draining = deps.draining ?? (() => false);
  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = requestPath(req.url);
    if (path === null) return sendFailure(res, failure('invalid_request', 'bad request target'), 400);
    const method = req.method ?? 'GET';
    const refused = edgeRefusal(deps, req, path);
    if (refused) {
      deps.metrics.refused(refused.metric);
      return sendFailure(res, failure('invalid_request', refused.message), refused.status);
    }
    if (path === '/healthz') return sendJson(res, 200, { status: 'ok' });
    if (path === '/readyz') {
      const models = deps.serving.readiness();
      const stopping = draining();
      const ready = !stopping && Object.values(models).every((m) => m.ready);
      const st = deps.node.status();
      return sendJson(res, ready ? 200 : 503, {
        ready,
        ...(stopping ? { draining: true } : {}),
        node: { connected: st.connected, epoch: st.epoch, registrations: st.registrations },
        policies: { placement: live.placement, routing: deps.cp.router.policy },
        models,
      });
    }
    if (path === '/metrics' && method === 'GET') {
      const text = await deps.metrics.text();
      res.writeHead(200, { 'Content-Type': deps.metrics.registry.contentType });
      res.end(text);
      return;
    }
    if (path.startsWith('/admin/')) {
      if (!deps.adminTokens.has(bearerToken(req))) {
        deps.metrics.refused('unauthorized');
        return sendFailure(
          res,
          failure('unauthorized', 'the admin API needs an admin token (Authorization: Bearer <token>)'),
        );
      }
      return handleAdmin(
        {
          cp: deps.cp,
          node: deps.node,
          live,
          ...(deps.status ? { status: deps.status } : {}),
          ...(deps.adminHooks ? { hooks: deps.adminHooks } : {}),
        },
        req,
        res,
        path,
      );
    }
    if (path.startsWith('/v1/')) {
      if (deps.clientTokens && !deps.clientTokens.has(bearerToken(req))) {
        deps.metrics.refused('unauthorized');
        return sendFailure(
          res,
          failure('unauthorized', 'missing or wrong client token (Authorization: Bearer <token>)'),
        );
      }
      if (method === 'POST' && draining()) {
        deps.metrics.refused('draining');
        return sendFailure(res, { ...failure('model_unavailable', 'the server is shutting down'), retryAfterMs: 1000 });
      }
      if (path === '/v1/models' && method === 'GET') return handleModels(deps.serving, res);
      const tenant = deps.tenantOf?.(req);
      if (path === '/v1/completions' && method === 'POST')
        return handleCompletion(deps.serving, req, res, false, tenant, deps.cp.runtime.clock, deps.tokenFlushMs);
      if (path === '/v1/chat/completions' && method === 'POST')
        return handleCompletion(deps.serving, req, res, true, tenant, deps.cp.runtime.clock, deps.tokenFlushMs);
    }
    return sendFailure(res, failure('invalid_request', `no route ${method} ${path}`), 404);
  };
  // A handler that fails answers 500 on its own request and is counted; the process and other requests go on (a
  // broken invariant, whose state is unknown, goes on up and ends the process).
  const failed = (res: ServerResponse, e: unknown): void => {
    const what = contained(e);
    deps.log?.(`HTTP handler failed: ${what}`);
    deps.metrics.handlerFailed();
    if (res.headersSent) res.destroy();
    else sendFailure(res, failure('internal', `handler failed: ${e instanceof Error ? e.name : typeof e}`));
  };
  return (req, res) => {
    try {
      route(req, res).catch((e: unknown) => failed(res, e));
    } catch (e) {
      failed(res, e);
    }
  };
}

/** A request refused before any route: a Host not allowed (probes included: a rebound name must not read the node's
 * state), a page from another site, a POST body not JSON. */
function edgeRefusal(
  deps: HttpDeps,
  req: IncomingMessage,
  path: string,
): { status: number; message: string; metric: string } | null {
  if (deps.edge && !hostAllowed(req, deps.edge))
    return { status: 403, message: 'Host is not allowed (see --allowed-host)', metric: 'forbidden_host' };
  if (PROBES.has(path)) return null;
  if (deps.edge && !originAllowed(req, deps.edge))
    return { status: 403, message: 'Origin is not allowed (see --allowed-origin)', metric: 'forbidden_origin' };
  // A JSON content type cannot be sent cross-site without a CORS preflight, which this server never grants.
  if (req.method === 'POST' && hasBody(req) && !isJsonContent(req))
    return {
      status: 415,
      message: 'POST bodies must be JSON (Content-Type: application/json)',
      metric: 'unsupported_media_type',
    };
  return null;
}
