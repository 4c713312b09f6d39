// The step invariant that every member of a step is a request for the replica's model@version, read from the
// sequences themselves (a token's step touches no request record).
import { describe, expect, it } from 'vitest';
import { createContinuousBatcher } from '../../../actors/batcher/continuous.ts';
import { createSequence, type SequenceListener } from '../../../actors/batcher/sequence.ts';
import { createInvariantChecker } from '../../../actors/control/invariants.ts';
import type { ReplicaHandle } from '../../../actors/replica.ts';

const quiet: SequenceListener = { scheduled: () => {}, preempted: () => {}, tokens: () => {}, finished: () => {} };
const limits = {
  policy: 'chunked' as const,
  maxRunning: 8,
  tokenBudget: 512,
  blockTokens: 16,
  blocksTotal: 64,
  watermarkBlocks: 0,
  maxContext: 4096,
};

function stepOf(owners: string[]) {
  const batcher = createContinuousBatcher(limits);
  owners.forEach((owner, i) =>
    batcher.enqueue(
      createSequence({
        id: `s${i}`,
        priority: 0,
        order: i,
        promptTokens: 8,
        outputTokens: 4,
        maxTokens: 4,
        receivedAt: 0,
        listener: quiet,
        owner,
      }),
    ),
  );
  const plan = batcher.plan(0)!;
  const r = { id: 'm@v1#0', model: 'm', version: 'v1', batcher, stateless: null } as unknown as ReplicaHandle;
  return { r, plan };
}

describe('control plane step invariants', () => {
  it("flags a step member that is another model@version's request, and only that", () => {
    const ok = createInvariantChecker(true);
    const same = stepOf(['m@v1', 'm@v1']);
    ok.step(same.r, same.plan, 5);
    expect(ok.violations).toEqual([]);

    const bad = createInvariantChecker(true);
    const mixed = stepOf(['m@v1', 'm@v2']);
    bad.step(mixed.r, mixed.plan, 5);
    expect(bad.violations).toEqual(['m@v1#0 at 5 ms: step holds s1 for m@v2']);
  });
});
