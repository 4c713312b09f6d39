// One batch of compatible stateless requests: forms within size, work, memory and delay bounds, then runs once.
import { assign, setup } from 'xstate';

/** Context of a batch actor: its compatibility key, members and bounds. */
export interface BatchContext {
  id: string;
  key: string;
  size: number;
  tokens: number;
  memoryBytes: number;
  maxSize: number;
  maxTokens: number;
  maxMemoryBytes: number;
  maxDelayMs: number;
  closedBy: 'size' | 'tokens' | 'memory' | 'delay' | 'flush' | null;
}

/** Input to open a batch. */
export interface BatchInput {
  id: string;
  key: string;
  maxSize: number;
  maxTokens: number;
  maxMemoryBytes: number;
  maxDelayMs: number;
}

/** Events a batch handles. */
export type BatchEvent =
  | { type: 'batch.add'; tokens: number; memoryBytes: number }
  /** Closes a forming batch now: `reason` when the next compatible request would not fit, else a drain or flush. */
  | { type: 'batch.flush'; reason?: 'size' | 'tokens' | 'memory' }
  | { type: 'batch.started' }
  | { type: 'batch.completed' }
  | { type: 'batch.failed'; code: string }
  | { type: 'batch.abort' };

/** What a batch reports when it ends. */
export interface BatchOutput {
  id: string;
  size: number;
  closedBy: BatchContext['closedBy'];
}

/** True when a member of `tokens` and `memoryBytes` fits a forming batch: the one rule the machine and its batcher share. */
export function fitsBatch(
  c: Pick<BatchContext, 'size' | 'tokens' | 'memoryBytes' | 'maxSize' | 'maxTokens' | 'maxMemoryBytes'>,
  tokens: number,
  memoryBytes: number,
): boolean {
  return c.size < c.maxSize && c.tokens + tokens <= c.maxTokens && c.memoryBytes + memoryBytes <= c.maxMemoryBytes;
}

/** The batch machine: forming → dispatched → running → done / failed / aborted. */
export const batchMachine = setup({
  types: {
    context: {} as BatchContext,
    input: {} as BatchInput,
    events: {} as BatchEvent,
    output: {} as BatchOutput,
  },
  actions: {
    /** Sends the closed batch to its replica. */
    dispatch: () => {},
    /** Splits results back to each member. */
    deliverResults: () => {},
    /** Gives each member its typed failure. */
    failMembers: () => {},
  },
  delays: {
    maxDelay: ({ context }) => context.maxDelayMs,
  },
  guards: {
    fits: ({ context, event }) => event.type === 'batch.add' && fitsBatch(context, event.tokens, event.memoryBytes),
    /** The member fits and brings the batch to one of its limits. A member that does not fit is never added. */
    fillsAfterAdd: ({ context, event }) =>
      event.type === 'batch.add' &&
      fitsBatch(context, event.tokens, event.memoryBytes) &&
      (context.size + 1 >= context.maxSize ||
        context.tokens + event.tokens >= context.maxTokens ||
        context.memoryBytes + event.memoryBytes >= context.maxMemoryBytes),
  },
}).createMachine({
  id: 'batch',
  context: ({ input }) => ({ ...input, size: 0, tokens: 0, memoryBytes: 0, closedBy: null }),
  initial: 'forming',
  on: { 'batch.abort': '.aborted' },
  states: {
    forming: {
      tags: ['accepting'],
      after: { maxDelay: { target: 'dispatched', actions: assign({ closedBy: 'delay' }) } },
      on: {
        'batch.add': [
          {
            guard: 'fillsAfterAdd',
            target: 'dispatched',
            actions: assign(({ context, event }) => ({
              size: context.size + 1,
              tokens: context.tokens + event.tokens,
              memoryBytes: context.memoryBytes + event.memoryBytes,
              closedBy:
                context.size + 1 >= context.maxSize
                  ? ('size' as const)
                  : context.tokens + event.tokens >= context.maxTokens
                    ? ('tokens' as const)
                    : ('memory' as const),
            })),
          },
          {
            guard: 'fits',
            actions: assign(({ context, event }) => ({
              size: context.size + 1,
              tokens: context.tokens + event.tokens,
              memoryBytes: context.memoryBytes + event.memoryBytes,
            })),
          },
        ],
        'batch.flush': { target: 'dispatched', actions: assign({ closedBy: ({ event }) => event.reason ?? 'flush' }) },
      },
    },
    // Closed and waiting for its replica: a compatible member that fits may still join until it starts.
    dispatched: {
      tags: ['joinable'],
      entry: 'dispatch',
      on: {
        'batch.started': 'running',
        'batch.failed': 'failed',
        'batch.add': {
          guard: 'fits',
          actions: assign(({ context, event }) => ({
            size: context.size + 1,
            tokens: context.tokens + event.tokens,
            memoryBytes: context.memoryBytes + event.memoryBytes,
          })),
        },
      },
    },
    running: {
      on: { 'batch.completed': 'done', 'batch.failed': 'failed' },
    },
    done: { type: 'final', entry: 'deliverResults' },
    failed: { type: 'final', entry: 'failMembers' },
    aborted: { type: 'final', entry: 'failMembers' },
  },
  output: ({ context }) => ({ id: context.id, size: context.size, closedBy: context.closedBy }),
});
