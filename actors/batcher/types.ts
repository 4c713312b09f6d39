// The continuous batcher's public shapes: its limits, a planned step, its stats, and the batcher itself.
import type { StepShape } from '../gpu/cost-model.ts';
import type { Sequence } from './sequence.ts';
import type { CacheChanges } from './kv-ledger.ts';
import type { BatcherStats, CoreLimits } from '../../machines/core-messages.ts';

/** How a replica composes each step, and the limits of its iteration loop (defined with the core's messages). */
export type { BatchPolicy } from '../../machines/core-messages.ts';
export type ContinuousLimits = CoreLimits;

/** One sequence's part in a step. */
export interface PlanEntry {
  readonly seq: Sequence;
  /** Prefill tokens in this step; 0 for a decode. */
  readonly chunk: number;
}

/** A planned step: who runs, the shape the cost model prices, and the blocks it holds. */
export interface StepPlan {
  entries: PlanEntry[];
  shape: StepShape;
  tokens: number;
  prefillTokens: number;
  decodes: number;
  /** Blocks in use on the replica once the step's allocations are made (what the worker's cache holds). */
  blocksUsed: number;
  /** Step time the replica's cost model predicts, and when the step was sent (set by the replica, for estimate error). */
  predictedMs: number;
  dispatchedAt: number;
}

/** The batcher of one replica: queues, running set, block ledger, and step planning. */
export interface ContinuousBatcher {
  readonly limits: ContinuousLimits;
  /** Adds a sequence to the waiting queue (preempted/resumed ones at the head of their class). */
  enqueue(seq: Sequence, atHead?: boolean): void;
  /** Plans the next step, allocating KV blocks and preempting if blocks run out; null only when there is no work. */
  plan(now: number): StepPlan | null;
  /** Plans the next step in `plan`'s place when it is the same pure decode as `plan`, just completed (the plan that
   * plan() would return, with nothing else to do); false (plan() is then called) when it may not be. `ahead`: as a
   * step of a decode run (decode-run.ts), whose sequences lag until settled. */
  replan(plan: StepPlan, ahead?: boolean): boolean;
  /** Applies a decode run's steps to its sequences and the ledger (see decode-run.ts); the replica calls it before
   * its step loop returns to the event loop, and every other entry point does it first. */
  settle(): void;
  /** Applies a step all ranks completed: produces tokens, frees finished sequences. */
  complete(plan: StepPlan, now: number): void;
  /** Removes a sequence (cancelled or expired); returns false if it is not here. */
  withdraw(id: string): boolean;
  /** Removes every sequence (replica failed or drained past its deadline) and returns them. */
  evictAll(): Sequence[];
  has(id: string): boolean;
  /** What its prefix cache kept and evicted since the last call (empty without a cache). */
  cacheChanges(): CacheChanges;
  hasWork(): boolean;
  saturated(): boolean;
  stats(): BatcherStats;
  /** stats()'s counts of waiting and running sequences and KV blocks, without the rest (O(1): a scrape's gauges). */
  gauges(): Pick<BatcherStats, 'waiting' | 'running' | 'blocksUsed' | 'blocksTotal'>;
  /** Sequences of class `rank` waiting and their prompt tokens: stats()'s per-class totals, without the rest (O(1)). */
  waitingOf(rank: number): { count: number; tokens: number };
  /** Waiting sequences in the order they will be admitted (highest class first); O(queue), for tests and views. */
  waitingList(): Sequence[];
  /** Running sequences, highest class and oldest first. */
  runningList(): readonly Sequence[];
  /** Throws if the ledger disagrees with the sequences' allocations, or if `plan` broke the policy's limits or holds
   * a sequence whose owner is not `owner` (when given: the control plane's model@version of the replica). */
  checkInvariants(plan?: StepPlan, owner?: string): void;
}

/** What the router and the ledger read from a batcher (defined with the core's messages, whose load carries it). */
export type { BatcherStats } from '../../machines/core-messages.ts';
