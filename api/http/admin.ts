// The admin API (always authenticated with an admin token): drain a replica, fail and repair a GPU, change the
// placement or routing policy, and read the node's status.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { failure } from '../../machines/outcomes.ts';
import type { RoutingPolicy } from '../../actors/router/router.ts';
import type { ControlPlane } from '../../actors/control-plane.ts';
import type { NodeLink } from '../../actors/node-link.ts';
import { readJson, sendFailure, sendJson } from './io.ts';

const ROUTING: readonly RoutingPolicy[] = ['cost', 'round-robin', 'least-requests', 'power-of-two'];
const PLACEMENT = ['exclusive', 'switch', 'share'] as const;

/** What the admin API acts on. */
export interface AdminDeps {
  cp: ControlPlane;
  node: NodeLink;
  /** Extra status fields (the worker supervisor's pid and restarts). */
  status?(): Record<string, unknown>;
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
      placement: { policy: cp.scenario.placement.policy, events: cp.placement.events.slice(-50) },
      routing: { policy: cp.router.policy },
      gpus: [...cp.placement.gpus.values()],
      replicas: [...cp.placement.replicas.values()].map((r) => ({
        id: r.id,
        model: r.model,
        version: r.version,
        state: r.state(),
        gpus: [...r.gpus],
        epoch: r.epoch,
        ...r.batcher.stats(),
      })),
      live: cp.live(),
      ...(deps.status?.() ?? {}),
    });
  }
  if (method !== 'POST')
    return sendFailure(res, failure('invalid_request', `${method} ${path} is not an admin action`), 405);
  if ((m = /^\/admin\/replicas\/([^/]+)\/drain$/.exec(path))) {
    const id = decodeURIComponent(m[1]!);
    const body = await readJson(req);
    const deadline =
      body.ok && typeof body.value === 'object' && body.value !== null
        ? (body.value as { deadlineMs?: unknown }).deadlineMs
        : undefined;
    const ok = cp.placement.drain(id, typeof deadline === 'number' && deadline >= 0 ? deadline : undefined);
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
    return sendJson(res, 202, { gpu, action: m[2] });
  }
  if (path === '/admin/placement' || path === '/admin/routing') {
    const body = await readJson(req);
    if (!body.ok) return sendFailure(res, body.failure, body.status);
    const policy =
      typeof body.value === 'object' && body.value !== null ? (body.value as { policy?: unknown }).policy : undefined;
    if (path === '/admin/routing') {
      if (!ROUTING.includes(policy as RoutingPolicy))
        return sendFailure(res, failure('invalid_request', `policy must be one of ${ROUTING.join(', ')}`));
      cp.router.setPolicy(policy as RoutingPolicy);
      return sendJson(res, 200, { routing: policy });
    }
    if (!PLACEMENT.includes(policy as (typeof PLACEMENT)[number]))
      return sendFailure(res, failure('invalid_request', `policy must be one of ${PLACEMENT.join(', ')}`));
    const p = cp.placement as unknown as PolicySwitchable;
    if (typeof p.setPolicy !== 'function') {
      return sendFailure(
        res,
        failure('invalid_request', 'this placement actor cannot change policy while running'),
        501,
      );
    }
    const result = p.setPolicy(policy as string);
    if (result && typeof result === 'object' && 'code' in result) return sendFailure(res, result as never);
    return sendJson(res, 200, { placement: policy });
  }
  return sendFailure(res, failure('invalid_request', `no admin action ${method} ${path}`), 404);
}
