// Replicas and router dependencies for router tests: a real work view and cost model behind a fake actor whose
// state the test sets, so each test arranges queues, KV and readiness directly.
import { createWorkView } from '../../../actors/replica-view.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import type { ReplicaHandle } from '../../../actors/replica.ts';
import { replicaMachine, type ReplicaTag } from '../../../machines/replica.machine.ts';
import { createRegistry, type ModelEntry } from '../../../actors/router/registry.ts';
import {
  createRouter,
  type ClassLimits,
  type Router,
  type RouterDeps,
  type RoutingPolicy,
  viewOf,
} from '../../../actors/router/router.ts';
import { createRng } from '../../../runtime/rng.ts';

/** A replica whose machine state the test controls. */
export interface FakeReplica extends ReplicaHandle {
  setState(s: string): void;
  /** Queues a waiting request of `prompt` tokens (and `output` expected output tokens) in class `rank`. */
  load(prompt: number, output?: number, rank?: number): void;
}

const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
type TaggedNode = { tags: readonly string[]; states: Record<string, TaggedNode> };
/** The tags the real replica machine gives a dotted state (`ready.busy`): the fake answers tag queries as it would. */
const tagsOf = (state: string): Set<string> => {
  const tags = new Set<string>();
  let node: TaggedNode | undefined = replicaMachine.root as unknown as TaggedNode;
  for (const key of state.split('.')) {
    node = node?.states[key];
    for (const t of node?.tags ?? []) tags.add(t);
  }
  return tags;
};
let seqNo = 0;

/** A fake replica of model@version in machine state `state` (`ready.idle`, `loading`, `draining.working`…). */
export function fakeReplica(
  id: string,
  model: string,
  version: string,
  state = 'ready.idle',
  blocksTotal = 20_000,
): FakeReplica {
  let st = state;
  const work = createWorkView({
    policy: 'chunked',
    maxRunning: 256,
    tokenBudget: 2048,
    blockTokens: 16,
    blocksTotal,
    maxContext: 8192,
    watermarkBlocks: 0,
  });
  const actor = { getSnapshot: () => ({ matches: (v: string) => st === v || st.startsWith(`${v}.`) }) };
  const r = {
    id,
    model,
    version,
    gpus: [0],
    epoch: 1,
    cost,
    work,
    actor,
    state: () => st,
    hasTag: (tag: ReplicaTag) => tagsOf(st).has(tag),
    ready: () => tagsOf(st).has('ready'),
    accepting: () => st.startsWith('ready'),
    enqueue: (s: Parameters<ReplicaHandle['enqueue']>[0]) =>
      work.submitted(
        {
          id: s.id,
          rank: s.priority,
          prefill: s.promptTokens + s.generated,
          decode: s.estOutputTokens - s.generated,
          finalTokens: s.promptTokens + s.estOutputTokens,
        },
        0,
      ),
    steps: { count: 0, batchSizeSum: 0, tokens: 0, predictedMs: 0, busyMs: 0 },
    setState: (s: string) => {
      st = s;
    },
    load: (prompt: number, output = 100, rank = 0) => {
      seqNo++;
      work.submitted({ id: `load.${seqNo}`, rank, prefill: prompt, decode: output, finalTokens: prompt + output }, 0);
    },
  };
  return r as unknown as FakeReplica;
}

/** Two classes: interactive (rank 0, 1 s budget) and batch (rank 1, 10 s budget, shed at half the top budget). */
export const CLASSES: Record<string, ClassLimits> = {
  interactive: { rank: 0, ttftMs: 500, tpotMs: 100, maxQueueMs: 1000, maxQueued: 1000, maxQueuedTokens: 10_000_000 },
  batch: {
    rank: 1,
    ttftMs: 10_000,
    tpotMs: 1000,
    maxQueueMs: 10_000,
    maxQueued: 1000,
    maxQueuedTokens: 10_000_000,
    shedAt: 0.5,
  },
};

/** A router over `replicas` with overridable dependencies. */
export function routerFor(
  replicas: ReplicaHandle[],
  over: Partial<RouterDeps> & {
    models?: ModelEntry[];
    policy?: RoutingPolicy;
    classes?: Record<string, ClassLimits>;
  } = {},
): Router {
  const models = over.models ?? [{ name: 'm', versions: ['v1', 'v2'], aliases: {} }];
  return createRouter({
    registry: createRegistry(models),
    limits: () => ({ maxContext: 8192, classes: new Map(Object.entries(over.classes ?? CLASSES)) }),
    replicas: () => replicas.map(viewOf),
    unavailable: () => null,
    etaMs: () => null,
    held: () => ({ count: 0, tokens: 0 }),
    rng: createRng(1),
    now: () => 0,
    ...over,
    policy: over.policy ?? 'cost',
  });
}

/** A routing request for model `m` with defaults. */
export function req(over: Partial<Parameters<Router['route']>[0]> = {}): Parameters<Router['route']>[0] {
  return {
    id: 'r',
    model: 'm',
    priority: 'interactive',
    promptTokens: 500,
    maxTokens: 100,
    estOutputTokens: 100,
    ...over,
  };
}
