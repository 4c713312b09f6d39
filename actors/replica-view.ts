// What the control plane knows of a replica's work: the load its engine core reported last, plus what it submitted
// since (which that report could not count yet). Routing, admission and placement predict from this view, as
// Dynamo's router does from its workers' load events plus its own in-flight count; the core owns the real ledger.
import type { BatcherStats, ContinuousLimits } from './batcher/types.ts';
import type { ReplicaLoad } from '../machines/core-messages.ts';

/** A submitted sequence the core's last report does not yet count. */
interface Pending {
  id: string;
  rank: number;
  prefill: number;
  decode: number;
  blocks: number;
  finalBlocks: number;
  at: number;
  /** Cancelled before the core counted it: it still counts toward `received`, not toward the work. */
  gone: boolean;
}

/** Totals over a replica's steps, as its core reports them. */
export interface StepStats {
  count: number;
  batchSizeSum: number;
  tokens: number;
  predictedMs: number;
  busyMs: number;
}

/** The control plane's view of one replica's work. */
export interface WorkView {
  readonly limits: ContinuousLimits;
  /** The last load plus the submitted work it does not count. */
  stats(): BatcherStats;
  gauges(): Pick<BatcherStats, 'waiting' | 'running' | 'blocksUsed' | 'blocksTotal'>;
  waitingOf(rank: number): { count: number; tokens: number };
  /** Work waiting, running or submitted and not yet reported. */
  hasWork(): boolean;
  /** The core said it cannot admit more. */
  saturated(): boolean;
  /** Stateless requests held (forming, closed and running batches), reported and submitted since. */
  queued(): number;
  /** The last load heard, or null before the first. */
  last(): ReplicaLoad | null;
  /** When (control-plane clock) the last load was heard; -1 before the first. */
  heardAt(): number;
  /** The step its core runs now, as last reported: its predicted ms and how long it has run by `now` (control-plane
   * clock); null when none ran at the last report. */
  stepInFlight(now: number): { predictedMs: number; elapsedMs: number } | null;
  /** When the oldest submit the core has not reported was sent; -1 when none. */
  oldestPending(): number;
  /** Prefill tokens of the submits not reported yet. */
  pendingPrefill(): number;
  steps(): StepStats;
  /** Records a submit (generative: its lengths; stateless: tokens 0). */
  submitted(s: { id: string; rank: number; prefill: number; decode: number; finalTokens: number }, now: number): void;
  /** A submitted request left (cancelled, expired): a cancel goes to the core. Until a report counts that cancel, the
   * view leaves the request out: `held` says what it held when the core had reported it (running or waiting). */
  cancelled(id: string, held?: Withdrawn): void;
  /** A load from the core, heard at `now`. */
  heard(load: ReplicaLoad, now: number): void;
  /** The core is gone (failure, restart): nothing it reported holds. */
  reset(): void;
}

/** What a withdrawn sequence the core had reported holds, by the view's estimate. */
export interface Withdrawn {
  running: boolean;
  rank: number;
  prefill: number;
  decode: number;
  finalTokens: number;
}

const EMPTY: readonly number[] = [];

/** Withdrawn sequences the core has not counted the cancel of, and what they held in all. */
function createWithdrawals(blocksOf: (tokens: number) => number) {
  let gone: (Withdrawn & { index: number })[] = [];
  const sums = { running: 0, waiting: 0, prefill: 0, decode: 0, finalBlocks: 0, runningBlocks: 0 };
  const resum = (): void => {
    sums.running = sums.waiting = sums.prefill = sums.decode = sums.finalBlocks = sums.runningBlocks = 0;
    for (const g of gone) {
      const fb = blocksOf(g.finalTokens);
      if (g.running) {
        sums.running++;
        sums.runningBlocks += fb;
      } else {
        sums.waiting++;
        sums.prefill += g.prefill;
      }
      sums.decode += g.decode;
      sums.finalBlocks += fb;
    }
  };
  return {
    sums,
    /** `w` was withdrawn with the cancel numbered `index` (from 0). */
    add: (w: Withdrawn, index: number): void => {
      gone.push({ ...w, index });
      resum();
    },
    /** A report counted the first `cancels` cancels. */
    counted: (cancels: number): void => {
      if (gone.length === 0) return;
      gone = gone.filter((g) => g.index >= cancels);
      resum();
    },
  };
}

/** Creates the view of a replica with the given limits (`blocksTotal` is the ledger's). */
export function createWorkView(limits: ContinuousLimits): WorkView {
  let load: ReplicaLoad | null = null;
  let heardAt = -1;
  // Submitted, in order; the first `acked` of all ever submitted are counted by the core.
  const pending: Pending[] = [];
  let head = 0;
  let sent = 0;
  const sums = { count: 0, prefill: 0, decode: 0, blocks: 0, finalBlocks: 0 };
  const byClass: number[] = [];
  const tokensByClass: number[] = [];
  const blocksOf = (tokens: number): number => Math.ceil(tokens / limits.blockTokens);
  // Cancels sent, and the reported sequences they withdrew that no report has counted the cancel of yet.
  let cancels = 0;
  const gone = createWithdrawals(blocksOf);
  const out = gone.sums;
  const sub = (a: number, b: number): number => Math.max(0, a - b);

  const drop = (p: Pending): void => {
    if (p.gone) return;
    p.gone = true;
    sums.count--;
    sums.prefill -= p.prefill;
    sums.decode -= p.decode;
    sums.blocks -= p.blocks;
    sums.finalBlocks -= p.finalBlocks;
    byClass[p.rank] = (byClass[p.rank] ?? 0) - 1;
    tokensByClass[p.rank] = (tokensByClass[p.rank] ?? 0) - p.prefill;
  };
  const compact = (): void => {
    if (head > 1024 && head * 2 > pending.length) {
      pending.splice(0, head);
      head = 0;
    }
  };
  const addByClass = (base: readonly number[], extra: readonly number[]): number[] => {
    const n = Math.max(base.length, extra.length);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) out[i] = (base[i] ?? 0) + (extra[i] ?? 0);
    return out;
  };

  const stats = (): BatcherStats => {
    const l = load;
    return {
      waiting: sub(l?.waiting ?? 0, out.waiting) + sums.count,
      running: sub(l?.running ?? 0, out.running),
      blocksUsed: l?.blocksUsed ?? 0,
      blocksTotal: limits.blocksTotal,
      prefillTokensAhead: sub(l?.prefillTokensAhead ?? 0, out.prefill) + sums.prefill,
      decodeTokensAhead: sub(l?.decodeTokensAhead ?? 0, out.decode) + sums.decode,
      waitingBlocks: (l?.waitingBlocks ?? 0) + sums.blocks,
      waitingByClass: sums.count > 0 ? addByClass(l?.waitingByClass ?? EMPTY, byClass) : (l?.waitingByClass ?? EMPTY),
      waitingTokensByClass:
        sums.count > 0
          ? addByClass(l?.waitingTokensByClass ?? EMPTY, tokensByClass)
          : (l?.waitingTokensByClass ?? EMPTY),
      committedBlocks: sub(l?.committedBlocks ?? 0, out.finalBlocks) + sums.finalBlocks,
      runningCommittedBlocks: sub(l?.runningCommittedBlocks ?? 0, out.runningBlocks),
      runningContext: l?.runningContext ?? 0,
      preemptions: l?.preemptions ?? 0,
      steps: l?.steps ?? 0,
    };
  };

  return {
    limits,
    stats,
    gauges: () => ({
      waiting: (load?.waiting ?? 0) + sums.count,
      running: load?.running ?? 0,
      blocksUsed: load?.blocksUsed ?? 0,
      blocksTotal: limits.blocksTotal,
    }),
    waitingOf: (rank) => ({
      count: (load?.waitingByClass[rank] ?? 0) + (byClass[rank] ?? 0),
      tokens: (load?.waitingTokensByClass[rank] ?? 0) + (tokensByClass[rank] ?? 0),
    }),
    hasWork: () => sums.count > 0 || (load !== null && load.waiting + load.running + load.queued > 0),
    saturated: () => load?.saturated === true,
    queued: () => (load?.queued ?? 0) + sums.count,
    last: () => load,
    heardAt: () => heardAt,
    stepInFlight: (now) =>
      load && load.inflightPredictedMs > 0
        ? { predictedMs: load.inflightPredictedMs, elapsedMs: load.inflightMs + Math.max(0, now - heardAt) }
        : null,
    oldestPending: () => {
      for (let i = head; i < pending.length; i++) if (!pending[i]!.gone) return pending[i]!.at;
      return -1;
    },
    pendingPrefill: () => sums.prefill,
    steps: () => ({
      count: load?.stepCount ?? 0,
      batchSizeSum: load?.stepMembers ?? 0,
      tokens: load?.stepTokens ?? 0,
      predictedMs: load?.stepPredictedMs ?? 0,
      busyMs: load?.stepBusyMs ?? 0,
    }),
    submitted: (s, now) => {
      const p: Pending = {
        id: s.id,
        rank: s.rank,
        prefill: s.prefill,
        decode: s.decode,
        blocks: blocksOf(s.prefill),
        finalBlocks: blocksOf(s.finalTokens),
        at: now,
        gone: false,
      };
      pending.push(p);
      sent++;
      sums.count++;
      sums.prefill += p.prefill;
      sums.decode += p.decode;
      sums.blocks += p.blocks;
      sums.finalBlocks += p.finalBlocks;
      byClass[p.rank] = (byClass[p.rank] ?? 0) + 1;
      tokensByClass[p.rank] = (tokensByClass[p.rank] ?? 0) + p.prefill;
    },
    cancelled: (id, held) => {
      const index = cancels++;
      for (let i = head; i < pending.length; i++) {
        if (pending[i]!.id !== id) continue;
        drop(pending[i]!);
        return;
      }
      if (held) gone.add(held, index);
    },
    heard: (l, now) => {
      load = l;
      heardAt = now;
      // The core has counted the first `received` submits ever sent to it.
      const unacked = sent - l.received;
      const ackUpTo = pending.length - Math.max(0, Math.min(unacked, pending.length - head));
      while (head < ackUpTo) drop(pending[head++]!);
      compact();
      gone.counted(l.cancelled);
    },
    reset: () => {
      load = null;
      heardAt = -1;
      while (head < pending.length) drop(pending[head++]!);
      pending.length = 0;
      head = 0;
      sent = 0;
      cancels = 0;
      gone.counted(Infinity);
    },
  };
}
