// Explainable decisions: the trace recorded when a request expires, and the human-readable form of a request's
// traces (route, hold, resume, rejection, expiry) for `simulate --explain req.N`.
import type { ReplicaHandle } from '../replica.ts';
import { estimateWait } from './estimate.ts';
import type { DecisionTrace, RoutingPolicy } from './router.ts';

/** At most this many traces are kept per request (admission, resumes, expiry). */
export const MAX_TRACES = 16;

/** What an expiry trace needs to know about the request (the control plane's live record fits). */
export interface ExpiringRequest {
  model: string;
  version: string;
  rank: number;
  budgetMs: number;
  receivedAt: number;
  spec: { priority: string; promptTokens: number; maxTokens: number };
}

/** The trace of a request that reached its queue budget: where it waited, and that replica's queue at the end. */
export function expiryTrace(
  policy: RoutingPolicy,
  req: ExpiringRequest,
  ctx: { replica: string | null },
  replica: ReplicaHandle | undefined,
  now: number,
): DecisionTrace {
  const waited = now - req.receivedAt;
  const where = ctx.replica && ctx.replica !== 'router' ? ctx.replica : null;
  const candidates = replica
    ? [
        estimateWait(replica, {
          promptTokens: req.spec.promptTokens,
          estOutputTokens: req.spec.maxTokens,
          priority: req.rank,
        }),
      ]
    : [];
  return {
    t: now,
    kind: 'expire',
    policy,
    model: req.model,
    version: req.version || null,
    priority: req.spec.priority,
    budgetMs: req.budgetMs,
    candidates,
    excluded: [],
    chosen: where,
    outcome: 'expired',
    reason: `waited ${Math.round(waited)} ms, its whole ${Math.round(req.budgetMs)} ms budget, ${where ? `in the queue of ${where}` : 'held at the router for a replica'}`,
  };
}

const ms = (x: number): string => `${Math.round(x)} ms`;

/** A request's decision traces as an indented, human-readable block. */
export function formatTraces(id: string, traces: readonly DecisionTrace[]): string {
  const lines: string[] = [`explain ${id}`];
  if (traces.length === 0) lines.push('  no decisions recorded (unknown id, or traces were not kept)');
  for (const tr of traces) {
    const v = tr.version ? `${tr.model}@${tr.version}` : tr.model;
    const how = tr.resolvedBy
      ? ` (version by ${tr.resolvedBy}${tr.fallbackFrom ? `, fell back from ${tr.fallbackFrom}` : ''})`
      : '';
    lines.push(
      `  t=${ms(tr.t)} ${tr.kind} ${v}${how} class ${tr.priority || '-'} budget ${ms(tr.budgetMs)} policy ${tr.policy}`,
    );
    lines.push(`    ${tr.outcome}${tr.chosen ? ` -> ${tr.chosen}` : ''}: ${tr.reason}`);
    if (tr.candidates.length > 0) {
      lines.push('    replica                          wait ms   ttft ms  ahead tok  queued running  free/need blocks');
      for (const c of tr.candidates) {
        const mark = c.replica === tr.chosen ? '*' : ' ';
        const cached = c.cachedTokens ? `  cached ${c.cachedTokens} tok expected` : '';
        lines.push(
          `   ${mark}${c.replica.padEnd(30)} ${String(Math.round(c.waitMs)).padStart(8)} ${String(Math.round(c.ttftMs)).padStart(9)} ${String(c.aheadTokens).padStart(10)} ${String(c.queued).padStart(7)} ${String(c.running).padStart(7)}  ${c.freeBlocks}/${c.needBlocks}${c.headroom ? '' : ' (no headroom)'}${cached}`,
        );
      }
    }
    if (tr.cachedTokens !== undefined) {
      const expected = tr.candidates.find((c) => c.replica === tr.chosen)?.cachedTokens ?? 0;
      lines.push(
        `    prefix cache: ${expected} prompt tokens expected cached, ${tr.cachedTokens} found when scheduled`,
      );
    }
    for (const x of tr.excluded) lines.push(`     excluded ${x.replica}: ${x.why}`);
  }
  return `${lines.join('\n')}\n`;
}
