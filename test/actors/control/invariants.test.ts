// The step invariant that every member of a step is a request for the replica's model@version, read from the
// sequences themselves (a token's step touches no request record): what an engine core checks after every step.
import { describe, expect, it } from 'vitest';
import { createContinuousBatcher } from '../../../actors/batcher/continuous.ts';
import { createSequence, type SequenceListener } from '../../../actors/batcher/sequence.ts';

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
  return { batcher, plan: batcher.plan(0)! };
}

describe('step invariants', () => {
  it("flag a step member that is another model@version's request, and only that", () => {
    const same = stepOf(['m@v1', 'm@v1']);
    expect(() => same.batcher.checkInvariants(same.plan, 'm@v1')).not.toThrow();
    const mixed = stepOf(['m@v1', 'm@v2']);
    expect(() => mixed.batcher.checkInvariants(mixed.plan, 'm@v1')).toThrow(/s1/);
  });
});
