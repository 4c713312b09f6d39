// The cluster router in front of a simulated fleet: which node of a model's pools takes a request. Two policies:
// `gie-like`, the Gateway API Inference Extension's endpoint picker (queue and KV-cache gauges scraped at an interval,
// so up to one interval stale), and `predicted`, switchyard's own predicted time to first token on each node.
import type { Rng } from '../../runtime/rng.ts';
import type { FleetNode, NodeGauges } from './node.ts';

/** How the cluster router picks a node. */
export type FleetRouterPolicy = 'gie-like' | 'predicted';

/** The fleet router policies, for validation and the benchmark. */
export const FLEET_ROUTER_POLICIES: readonly FleetRouterPolicy[] = ['gie-like', 'predicted'];

/** Picks nodes for requests. */
export interface FleetRouter {
  /** The node to send a request of `model` to, among `candidates` (alive, ready, serving the model); null if none. */
  pick(model: string, promptTokens: number, maxTokens: number, candidates: readonly FleetNode[]): FleetNode | null;
  /** Refreshes the scraped gauges (gie-like): called every scrape interval. */
  scrape(nodes: readonly FleetNode[], models: readonly string[]): void;
}

/** The score of a node that cannot predict (no ready replica with room): after every node that can. */
const UNPREDICTABLE_MS = 1e15;

/** Creates the cluster router for `policy`; ties are broken by the seeded `rng`. */
export function createFleetRouter(policy: FleetRouterPolicy, rng: Rng): FleetRouter {
  const scraped = new Map<string, NodeGauges>();
  const key = (node: string, model: string): string => `${node}|${model}`;
  const pickGie = (model: string, candidates: readonly FleetNode[]): FleetNode | null => {
    // The endpoint picker's default scorers, equally weighted: fewer waiting requests (normalised across the
    // candidates) and a lower KV-cache utilisation score higher. A node never scraped counts as empty.
    const g = candidates.map((n) => scraped.get(key(n.id, model)) ?? { waiting: 0, running: 0, kvUsage: 0 });
    const minW = Math.min(...g.map((x) => x.waiting));
    const maxW = Math.max(...g.map((x) => x.waiting));
    const scores = g.map((x) => (maxW > minW ? (maxW - x.waiting) / (maxW - minW) : 1) + (1 - x.kvUsage));
    return best(candidates, scores, rng);
  };
  return {
    pick: (model, promptTokens, maxTokens, candidates) => {
      if (candidates.length === 0) return null;
      if (policy === 'gie-like') return pickGie(model, candidates);
      const scores = candidates.map((n) => {
        const t = n.predictTtftMs(model, promptTokens, maxTokens);
        return t === null ? -UNPREDICTABLE_MS : -t; // a node with no estimate (all saturated) comes last
      });
      return best(candidates, scores, rng);
    },
    scrape: (nodes, models) => {
      for (const n of nodes) {
        if (!n.alive) continue;
        for (const m of models) scraped.set(key(n.id, m), n.gauges(m));
      }
    },
  };
}

/** The candidate with the highest score; equal scores share the pick at random. */
function best(candidates: readonly FleetNode[], scores: readonly number[], rng: Rng): FleetNode | null {
  let top = -Infinity;
  for (const s of scores) if (s > top) top = s;
  if (top === -Infinity) return null;
  const tied = candidates.filter((_, i) => scores[i] === top);
  return tied.length === 1 ? tied[0]! : tied[rng.int(tied.length)]!;
}
