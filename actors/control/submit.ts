// Submitting a request: admission by the router, the request's actor and record, then a replica (a sequence, or a
// stateless batch member) or the hold until one is ready. Answers the resolved model version, or the refusal.
import { failure } from '../../machines/outcomes.ts';
import type { ModelConfig } from '../config.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { Router } from '../router/router.ts';
import type { Runtime } from '../../runtime/system.ts';
import { HELD_ADDRESS, type HeldQueue } from './held-queue.ts';
import type { RequestTable } from './request-table.ts';
import type { StatelessDispatch } from './stateless.ts';
import type { ClientListener, Live, SubmitResult, SubmitSpec } from './types.ts';

/** What submitting needs. */
export interface SubmitDeps {
  runtime: Runtime;
  model(name: string): ModelConfig | undefined;
  router: Router;
  table: RequestTable;
  held: HeldQueue;
  stateless: StatelessDispatch;
  replica(id: string): ReplicaHandle | undefined;
  handTo(l: Live, r: ReplicaHandle, generated: number, atHead: boolean): void;
  demand(model: string, rejected?: boolean, retryAfterMs?: number): void;
}

/** Creates the control plane's `submit`. */
export function createSubmit(deps: SubmitDeps): (spec: SubmitSpec, listener?: ClientListener) => SubmitResult {
  const { runtime, router, table } = deps;
  return (spec, clientListener) => {
    const t = runtime.clock.now();
    const id = spec.id ?? runtime.ids.next('req');
    if (table.has(id))
      return { id, ok: false, failure: failure('invalid_request', `request id ${id} is already in flight`) };
    const m = deps.model(spec.model);
    const priority = spec.priority ?? m?.classes[0]?.name ?? 'interactive';
    // Object.assign, not `{ ...spec, priority }`: a spread followed by a new key gives every object a hidden class of
    // its own in V8, and each read of the spec would then miss V8's caches (same keys, same order either way).
    const outputTokens = Math.min(spec.outputTokens ?? spec.maxTokens, spec.maxTokens);
    const full = Object.assign({}, spec, { priority, outputTokens });
    // A stateless request is one forward pass with one response: it asks for no output tokens.
    const stateless = m?.kind === 'stateless';
    const estOutputTokens = m?.estimate === 'oracle' ? full.outputTokens : spec.maxTokens;
    const adm = router.route({
      id,
      model: spec.model,
      ...(spec.version !== undefined ? { version: spec.version } : {}),
      priority,
      promptTokens: spec.promptTokens,
      maxTokens: stateless ? 1 : spec.maxTokens,
      estOutputTokens,
      ...(spec.deadlineMs !== undefined ? { deadlineMs: spec.deadlineMs } : {}),
    });
    const budgetMs = adm.ok ? adm.budgetMs : 0;
    const routed = adm.ok && adm.replica ? deps.replica(adm.replica.id)! : null;
    // A stateless request goes to the replica with the fewest requests in its batcher (the router's estimate reads the
    // iteration-level ledger, empty for these replicas); that batcher refuses what no batch can hold, or a full queue.
    const target = routed && stateless ? deps.stateless.leastQueued(routed) : routed;
    const refused =
      target && stateless ? deps.stateless.batcherOf(target).check({ id, tokens: spec.promptTokens }) : null;
    // Admitted: its actor starts as `request.admitted` leaves it (the table's start says how).
    const admitted = adm.ok && !refused ? { replica: target?.id ?? HELD_ADDRESS, t } : undefined;
    const l = table.start(
      {
        id,
        spec: full,
        model: spec.model,
        version: adm.ok ? adm.version : '',
        rank: adm.ok ? adm.rank : 0,
        budgetMs,
        estOutputTokens,
        receivedAt: t,
        firstScheduledAt: -1,
        streamed: 0,
        seq: null,
        listener: clientListener,
        traces: [adm.trace],
        heldSince: -1,
        ...(spec.engine
          ? {
              tokens: {
                prompt: spec.engine.prompt,
                out: [],
                lastText: '',
                finish: null,
                sampling: spec.engine.sampling,
              },
            }
          : {}),
        ...(adm.ok ? {} : adm.failure.retryAfterMs !== undefined ? { retryAfterMs: adm.failure.retryAfterMs } : {}),
      },
      { budgetMs: m?.resume.budgetMs ?? 30_000, maxResumes: m?.resume.maxResumes ?? 1 },
      admitted,
    );
    const { actor } = l;
    if (refused) {
      actor.send({ type: 'request.rejected', code: refused.code, message: refused.message, t });
      return { id, ok: false, failure: refused };
    }
    if (!adm.ok) {
      // Refused only because no replica is ready yet: still demand for placement (the client will retry).
      if (adm.failure.code === 'overloaded' && adm.trace.candidates.length === 0)
        deps.demand(spec.model, true, adm.failure.retryAfterMs);
      actor.send({ type: 'request.rejected', code: adm.failure.code, message: adm.failure.message, t });
      return { id, ok: false, failure: adm.failure };
    }
    clientListener?.accepted?.(id);
    if (target) {
      deps.handTo(l, target, 0, false);
    } else {
      deps.held.push(l);
      deps.demand(adm.model);
    }
    return { id, ok: true, model: adm.model, version: adm.version };
  };
}
