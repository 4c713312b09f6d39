// What routing and resuming share: the router's state (policy, round-robin cursor), the candidate replicas of a
// model@version, their estimates, the policies' choice, the class queue totals and a fresh decision trace.
import type { WaitEstimate, WorkSpec } from './estimate.ts';
import type { DecisionTrace, Excluded, RouterDeps, RoutingPolicy } from './router.ts';
import type { ReplicaView } from './view.ts';

/** The router's shared state and helpers, for `route` and `resume`. */
export interface RouterCore {
  readonly deps: RouterDeps;
  policy: RoutingPolicy;
  /** Ready replicas of model@version (every ready one ejected: those), noting the others in `excluded`. */
  candidatesOf(model: string, version: string, excluded: Excluded[] | null, exclude?: string): ReplicaView[];
  estimate(r: ReplicaView, work: WorkSpec): WaitEstimate;
  /** True when the replica's whole KV cache can hold the request. */
  fits(r: ReplicaView, e: WaitEstimate): boolean;
  /** The policy's choice, or -1 if no candidate can hold the request. */
  choose(cands: ReplicaView[], ests: WaitEstimate[]): number;
  /** Queue totals of a model's class across all its replicas (any version) and the router's hold. */
  classTotals(model: string, rank: number): { count: number; tokens: number };
  newTrace(kind: DecisionTrace['kind'], model: string, priority: string): DecisionTrace;
}

/** Creates the shared core of a router. */
export function createRouterCore(deps: RouterDeps): RouterCore {
  let rr = 0;
  const core: RouterCore = {
    deps,
    policy: deps.policy,
    candidatesOf: (model, version, excluded, exclude) => {
      const out: ReplicaView[] = [];
      const ejected: ReplicaView[] = [];
      for (const r of deps.replicas()) {
        if (r.model !== model || r.version !== version) continue;
        if (r.id === exclude) {
          excluded?.push({ replica: r.id, why: 'failing (the request is being resumed from it)' });
          continue;
        }
        if (!r.ready()) {
          excluded?.push({ replica: r.id, why: `not ready (${r.state()})` });
          continue;
        }
        const ej = deps.ejected?.(r.id) ?? null;
        if (ej) {
          excluded?.push({ replica: r.id, why: `ejected: ${ej}` });
          ejected.push(r);
          continue;
        }
        out.push(r);
      }
      // Every ready replica ejected: a slow replica still beats none (requests would only wait for a ready event).
      if (out.length === 0 && ejected.length > 0) {
        excluded?.splice(0, excluded.length, ...excluded.filter((x) => !x.why.startsWith('ejected')));
        return ejected;
      }
      return out;
    },
    fits: (r, e) => e.needBlocks <= r.blocksTotal,
    // Measured step-time ratio, kept within sane bounds so one odd sample cannot zero or explode an estimate.
    estimate: (r, work) => {
      const slowdown = Math.min(20, Math.max(0.5, deps.slowdown?.(r.id) ?? 1));
      // What the replica is expected to hold of the prompt, by the prefix index its core's reports feed.
      const blocks = work.hashes && deps.prefix ? deps.prefix.cachedBlocks(r.id, work.hashes) : 0;
      const w = blocks > 0 ? { ...work, cachedTokens: blocks * r.blockTokens } : work;
      return r.estimate(w, slowdown, deps.now());
    },
    choose: (cands, ests) => {
      const { fits } = core;
      if (core.policy === 'round-robin') {
        for (let k = 0; k < cands.length; k++) {
          const i = (rr + k) % cands.length;
          if (fits(cands[i]!, ests[i]!)) {
            rr = i + 1;
            return i;
          }
        }
        return -1;
      }
      if (core.policy === 'least-requests') {
        let best = -1;
        for (let i = 0; i < cands.length; i++) {
          if (!fits(cands[i]!, ests[i]!)) continue;
          const load = ests[i]!.queued + ests[i]!.running;
          if (best < 0 || load < ests[best]!.queued + ests[best]!.running) best = i;
        }
        return best;
      }
      if (core.policy === 'power-of-two') {
        if (cands.length === 1) return fits(cands[0]!, ests[0]!) ? 0 : -1;
        const a = deps.rng.int(cands.length);
        let b = deps.rng.int(cands.length - 1);
        if (b >= a) b++;
        const ok = [a, b].filter((i) => fits(cands[i]!, ests[i]!));
        if (ok.length === 0) return -1;
        return ok.reduce((x, y) => (ests[y]!.queued < ests[x]!.queued ? y : x));
      }
      // cost: lowest predicted time to first token among replicas with KV headroom; KV is a hard limit, then time.
      let best = -1;
      for (let i = 0; i < cands.length; i++) {
        if (!ests[i]!.headroom || !fits(cands[i]!, ests[i]!)) continue;
        if (best < 0 || ests[i]!.ttftMs < ests[best]!.ttftMs) best = i;
      }
      return best;
    },
    classTotals: (model, rank) => {
      const h = deps.held(model, rank);
      let count = h.count;
      let tokens = h.tokens;
      for (const r of deps.replicas()) {
        if (r.model !== model) continue;
        const w = r.waiting(rank);
        count += w.count;
        tokens += w.tokens;
      }
      return { count, tokens };
    },
    newTrace: (kind, model, priority) => ({
      t: deps.now(),
      kind,
      policy: core.policy,
      model,
      version: null,
      priority,
      budgetMs: 0,
      candidates: [],
      excluded: [],
      chosen: null,
      outcome: 'rejected',
      reason: '',
    }),
  };
  return core;
}
