// The HTTP routes of a serving control plane: client APIs under /v1 (client token when configured), the admin API under
// /admin (admin token, always), and the unauthenticated probes /healthz, /readyz and /metrics.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { failure } from '../../machines/outcomes.ts';
import type { ControlPlane } from '../../actors/control-plane.ts';
import type { NodeLink } from '../../actors/node-link.ts';
import type { ServerMetrics } from '../metrics.ts';
import type { Serving } from '../serving.ts';
import { bearerToken, type TokenSet } from '../../transport/ws.ts';
import { handleAdmin } from './admin.ts';
import { sendFailure, sendJson } from './io.ts';
import { handleCompletion, handleModels } from './openai.ts';

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
}

/** Creates the request handler of the HTTP server. */
export function createHttpHandler(deps: HttpDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    let path: string;
    try {
      path = new URL(req.url ?? '/', 'http://x').pathname;
    } catch {
      return sendFailure(res, failure('invalid_request', 'bad URL'));
    }
    const method = req.method ?? 'GET';
    if (path === '/healthz') return sendJson(res, 200, { status: 'ok' });
    if (path === '/readyz') {
      const models = deps.serving.readiness();
      const ready = Object.values(models).every((m) => m.ready);
      const st = deps.node.status();
      return sendJson(res, ready ? 200 : 503, {
        ready,
        node: { connected: st.connected, epoch: st.epoch, registrations: st.registrations },
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
        { cp: deps.cp, node: deps.node, ...(deps.status ? { status: deps.status } : {}) },
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
      if (path === '/v1/models' && method === 'GET') return handleModels(deps.serving, res);
      if (path === '/v1/completions' && method === 'POST') return handleCompletion(deps.serving, req, res, false);
      if (path === '/v1/chat/completions' && method === 'POST') return handleCompletion(deps.serving, req, res, true);
    }
    return sendFailure(res, failure('invalid_request', `no route ${method} ${path}`), 404);
  };
  return (req, res) => {
    route(req, res).catch((e: unknown) => {
      sendFailure(res, failure('internal', `handler failed: ${e instanceof Error ? e.message : String(e)}`));
    });
  };
}
