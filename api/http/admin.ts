// The admin API (always authenticated with an admin token): drain a replica, fail and repair a GPU, change the
// placement or routing policy, and read the node's status.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { failure } from '../../machines/outcomes.ts';
import type { RoutingPolicy } from '../../actors/router/router.ts';
import type { ControlPlane } from '../../actors/control-plane.ts';
import type { NodeLink } from '../../actors/node-link.ts';
import { readBody, sendFailure, sendJson } from './io.ts';
import { int, num, obj, oneOf, optional, str } from '../../transport/schema.ts';
import type { Rollouts } from '../../actors/placement/rollouts.ts';

/** Body of POST /admin/replicas/<id>/drain. */
const drainBody = obj({ deadlineMs: optional(num({ min: 0, max: 3_600_000 })) });
/** Body of POST /admin/routing. */
const routingBody = obj({ policy: oneOf<RoutingPolicy[]>('cost', 'round-robin', 'least-requests', 'power-of-two') });
/** Body of POST /admin/placement. */
const placementBody = obj({ policy: oneOf('exclusive', 'switch', 'share') });
/** Body of POST /admin/rollout. */
const rolloutBody = obj(
  {
    model: str({ min: 1, max: 200 }),
    from: str({ min: 1, max: 200 }),
    to: str({ min: 1, max: 200 }),
    steps: optional(int({ min: 1, max: 1024 })),
  },
  { strict: true },
);

/** What the operator layer adds to the admin API: rollouts, and a call after each change (the state file). */
export interface AdminHooks {
  rollouts?: Rollouts;
  /** An admin call changed operator state (a policy, a GPU marked failed or repaired, a rollout). */
  changed?(change: { gpu?: number; failed?: boolean }): void;
}

/** A path segment decoded; null for a malformed `%` escape (a 400, not a thrown URIError). */
function decodeSegment(s: string): string | null {
  try {
    return decodeURIComponent(s);
  } catch {
    return null;
  }
}

/** What the admin API acts on. */
export interface AdminDeps {
  cp: ControlPlane;
  node: NodeLink;
  /** The policies in force; a policy change here updates them. */
  live: { placement: string };
  /** Extra status fields (the worker supervisor's pid and restarts). */
  status?(): Record<string, unknown>;
  hooks?: AdminHooks;
}

/** Placement as the admin API may find it: a policy switch exists only when the placement actor provides one. */
interface PolicySwitchable {
  setPolicy?(policy: string): unknown;
}

/** Handles a request under /admin/; the caller has already checked the admin token. */
export async function handleAdmin(
  deps: AdminDeps,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
): Promise<void> {
  const { cp, node } = deps;
  const method = req.method ?? 'GET';
  let m: RegExpExecArray | null;
  if (method === 'GET' && path === '/admin/status') {
    return sendJson(res, 200, {
      node: node.status(),
      placement: { policy: deps.live.placement, events: cp.placement.events.slice(-50) },
      routing: { policy: cp.router.policy },
      gpus: [...cp.placement.gpus.values()],
      replicas: [...cp.placement.replicas.values()].map((r) => ({
        id: r.id,
        model: r.model,
        version: r.version,
        state: r.state(),
        gpus: [...r.gpus],
        epoch: r.epoch,
        ...r.work.stats(),
      })),
      live: cp.live(),
      ...(deps.hooks?.rollouts ? { rollouts: deps.hooks.rollouts.list() } : {}),
      ...(deps.status?.() ?? {}),
    });
  }
  if (method !== 'POST')
    return sendFailure(res, failure('invalid_request', `${method} ${path} is not an admin action`), 405);
  if ((m = /^\/admin\/replicas\/([^/]+)\/drain$/.exec(path))) {
    const id = decodeSegment(m[1]!);
    if (id === null) return sendFailure(res, failure('invalid_request', 'malformed % escape in the replica id'), 400);
    const body = await readBody(req, drainBody);
    if (!body.ok) return sendFailure(res, body.failure, body.status);
    const ok = cp.placement.drain(id, body.value.deadlineMs);
    if (!ok)
      return sendFailure(
        res,
        failure('model_not_found', `no replica ${id}; replicas: ${[...cp.placement.replicas.keys()].join(', ')}`),
      );
    return sendJson(res, 202, { replica: id, action: 'drain' });
  }
  if ((m = /^\/admin\/gpus\/(\d+)\/(fail|repair)$/.exec(path))) {
    const gpu = Number(m[1]);
    if (!cp.placement.gpus.has(gpu))
      return sendFailure(res, failure('invalid_request', `the node has GPUs 0-${cp.placement.gpus.size - 1}`));
    if (!node.connected())
      return sendFailure(res, failure('model_unavailable', 'no worker is registered to act on the GPU'));
    const fault = m[2] === 'fail' ? 'fault' : 'repair';
    cp.runtime.send('node', { type: 'gpu.inject', gpu, fault });
    deps.hooks?.changed?.({ gpu, failed: fault === 'fault' });
    return sendJson(res, 202, { gpu, action: m[2] });
  }
  if (path === '/admin/rollout') {
    const body = await readBody(req, rolloutBody);
    if (!body.ok) return sendFailure(res, body.failure, body.status);
    if (!deps.hooks?.rollouts) return sendFailure(res, failure('invalid_request', 'rollouts are not enabled'), 501);
    const started = deps.hooks.rollouts.start(body.value);
    if (!started.ok) return sendFailure(res, started.failure);
    deps.hooks.changed?.({});
    return sendJson(res, 202, { rollout: body.value, events: started.rollout.events });
  }
  if (path === '/admin/placement' || path === '/admin/routing') {
    if (path === '/admin/routing') {
      const body = await readBody(req, routingBody);
      if (!body.ok) return sendFailure(res, body.failure, body.status);
      cp.router.setPolicy(body.value.policy);
      deps.hooks?.changed?.({});
      return sendJson(res, 200, { routing: body.value.policy });
    }
    const body = await readBody(req, placementBody);
    if (!body.ok) return sendFailure(res, body.failure, body.status);
    const { policy } = body.value;
    const p = cp.placement as unknown as PolicySwitchable;
    if (typeof p.setPolicy !== 'function') {
      return sendFailure(
        res,
        failure('invalid_request', 'this placement actor cannot change policy while running'),
        501,
      );
    }
    const result = p.setPolicy(policy);
    if (result && typeof result === 'object' && 'code' in result) return sendFailure(res, result as never);
    deps.live.placement = policy;
    deps.hooks?.changed?.({});
    return sendJson(res, 200, { placement: policy });
  }
  return sendFailure(res, failure('invalid_request', `no admin action ${method} ${path}`), 404);
}
