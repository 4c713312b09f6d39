// Submitting a request: admission by the router, the request's actor and record, then a replica (a sequence, or a
// stateless batch member) or the hold until one is ready. Answers the resolved model version, or the refusal.
import { segmentBlockHashes, tokenBlockHashes } from '../batcher/block-hash.ts';
import { failure } from '../../machines/outcomes.ts';
import type { ModelConfig } from '../config.ts';
import type { ReplicaHandle } from '../replica.ts';
import type { Router } from '../router/router.ts';
import type { Runtime } from '../../runtime/system.ts';
import { contained } from '../../runtime/contain.ts';
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
  /** Where a request that failed while being submitted is told (the operator's log). */
  log?(line: string): void;
}

/** Creates the control plane's `submit`. An exception while submitting one request fails that request alone
 * (`internal`, everything it held released: see RequestTable.fail) and is told to `log`. */
export function createSubmit(deps: SubmitDeps): (spec: SubmitSpec, listener?: ClientListener) => SubmitResult {
  const { runtime, table } = deps;
  const log = deps.log ?? (() => {});
  return (spec, clientListener) => {
    const id = spec.id ?? runtime.ids.next('req');
    // A live request of the same id is another one (refused as a duplicate): never failed for this one.
    const other = table.has(id);
    try {
      return submitOne(deps, id, spec, clientListener);
    } catch (e) {
      log(`request ${id} failed while being submitted: ${contained(e)}`);
      const f = failure('internal', `the server failed while submitting request ${id}`);
      // Not live: it threw before its record existed (nothing held), or it ended meanwhile.
      if (!other && table.fail(id, f.message)) log(`request ${id} ended with internal and released`);
      return { id, ok: false, failure: f };
    }
  };
}

/** Submits one request: admission, its actor and record, then its replica or the hold. */
function submitOne(deps: SubmitDeps, id: string, spec: SubmitSpec, clientListener?: ClientListener): SubmitResult {
  const { runtime, router, table } = deps;
  const t = runtime.clock.now();
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
  // A model with a prefix cache keys its blocks by what its prompt is made of.
  // A real engine's request carries its token ids: they are what it is made of.
  const hashes = !m?.batching.prefixCache
    ? undefined
    : spec.engine
      ? tokenBlockHashes(spec.engine.prompt, m.batching.blockTokens)
      : spec.segments
        ? segmentBlockHashes(spec.segments, m.batching.blockTokens)
        : undefined;
  const adm = router.route({
    id,
    model: spec.model,
    ...(spec.version !== undefined ? { version: spec.version } : {}),
    priority,
    promptTokens: spec.promptTokens,
    maxTokens: stateless ? 1 : spec.maxTokens,
    estOutputTokens,
    ...(spec.deadlineMs !== undefined ? { deadlineMs: spec.deadlineMs } : {}),
    ...(hashes ? { hashes } : {}),
  });
  const budgetMs = adm.ok ? adm.budgetMs : 0;
  const routed = adm.ok && adm.replica ? deps.replica(adm.replica.id)! : null;
  // A stateless request goes to the replica with the fewest requests in its batcher (the router's estimate reads the
  // iteration-level ledger, empty for these replicas); that batcher refuses what no batch can hold, or a full queue.
  const target = routed && stateless ? deps.stateless.leastQueued(routed) : routed;
  const refused = target && stateless ? target.checkItem({ id, tokens: spec.promptTokens }) : null;
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
      ...(hashes ? { hashes } : {}),
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
  if (target) {
    deps.handTo(l, target, 0, false);
  } else {
    deps.held.push(l);
    deps.demand(adm.model);
  }
  // Accepted once handed over: a hand-off that throws is answered as this submit's refusal (the client hears nothing
  // else of it), not as a second end after an accepted one; a request its hand-off ended has that end as the answer.
  if (!table.has(id)) {
    const c = l.actor.getSnapshot().context;
    return { id, ok: false, failure: failure(c.code ?? 'internal', c.message ?? `request ${id} ended at once`) };
  }
  clientListener?.accepted?.(id);
  return { id, ok: true, model: adm.model, version: adm.version };
}
