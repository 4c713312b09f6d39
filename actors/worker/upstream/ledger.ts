// The requests of one upstream replica: those waiting in switchyard's bounded queue (priority class, then arrival;
// a resumed or requeued one at the head of its class, as a core orders them) and those streaming at the server, and
// the load a report carries, computed from them (and the server's scraped KV usage) in the core's own terms.
import { idleLoad, type CoreLimits, type ReplicaLoad, type SubmitSeq } from '../../../machines/core-messages.ts';

/** One request the replica holds. */
export interface UpstreamReq {
  seq: SubmitSeq;
  /** Prompt plus tokens it had when submitted (what the server prefills). */
  context: number;
  /** Tokens it may still make, and has made here (both as of its submit). */
  left: number;
  made: number;
  /** Ids made here (for a requeue: sent again with the prompt). */
  ids: number[];
  running: boolean;
  /** Closes its stream at the server. */
  close: (() => void) | null;
  /** When it last made progress (sent, or a chunk), on the adapter's clock. */
  lastAt: number;
  /** Its first token here has come. */
  first: boolean;
  /** `made` when it was last sent (the server's usage counts from there). */
  sentAt: number;
}

/** The queue and the running set. */
export interface RequestLedger {
  readonly byId: ReadonlyMap<string, UpstreamReq>;
  readonly running: ReadonlySet<UpstreamReq>;
  waiting(): number;
  /** Queues a request; false when the queue is full. */
  enqueue(r: UpstreamReq): boolean;
  /** The next request to send, taken off the queue (null when none waits or every slot is taken). */
  next(): UpstreamReq | null;
  start(r: UpstreamReq): void;
  /** Back to the head of its class (the server failed it; it keeps what it made). */
  requeue(r: UpstreamReq): void;
  /** Takes a request out wherever it is; answers it. */
  remove(id: string): UpstreamReq | undefined;
  clear(): UpstreamReq[];
  /** The load, with the counts the core keeps and the server's KV usage (null: unknown). */
  load(c: { received: number; cancelled: number; kvUsage: number | null }): ReplicaLoad;
}

const before = (a: UpstreamReq, b: UpstreamReq): boolean => {
  if (a.seq.priority !== b.seq.priority) return a.seq.priority < b.seq.priority;
  const ha = a.seq.atHead === true;
  if (ha !== (b.seq.atHead === true)) return ha;
  return a.seq.order < b.seq.order;
};

/** Creates the ledger of a replica with `limits.maxRunning` slots and `queueMax` waiting at most. */
export function createRequestLedger(limits: CoreLimits, queueMax: number): RequestLedger {
  const byId = new Map<string, UpstreamReq>();
  const queue: UpstreamReq[] = [];
  const running = new Set<UpstreamReq>();
  const B = limits.blockTokens;
  const blocks = (tokens: number): number => Math.ceil(tokens / B);
  const insert = (r: UpstreamReq): void => {
    let i = queue.length;
    while (i > 0 && before(r, queue[i - 1]!)) i--;
    queue.splice(i, 0, r);
  };
  return {
    byId,
    running,
    waiting: () => queue.length,
    enqueue: (r) => {
      if (queue.length >= queueMax + Math.max(0, limits.maxRunning - running.size)) return false;
      byId.set(r.seq.id, r);
      insert(r);
      return true;
    },
    next: () => (running.size < limits.maxRunning && queue.length > 0 ? queue.shift()! : null),
    start: (r) => {
      r.running = true;
      running.add(r);
    },
    requeue: (r) => {
      running.delete(r);
      r.running = false;
      r.close = null;
      r.seq = { ...r.seq, atHead: true };
      insert(r);
    },
    remove: (id) => {
      const r = byId.get(id);
      if (!r) return undefined;
      byId.delete(id);
      if (r.running) running.delete(r);
      else queue.splice(queue.indexOf(r), 1);
      return r;
    },
    clear: () => {
      const all = [...byId.values()];
      byId.clear();
      queue.length = 0;
      running.clear();
      return all;
    },
    load: (c) => {
      const byClass: number[] = [];
      const tokensByClass: number[] = [];
      let prefill = 0;
      let decode = 0;
      let waitingBlocks = 0;
      let committed = 0;
      let runningCommitted = 0;
      let runningContext = 0;
      for (const r of queue) {
        const p = r.context + r.made;
        const rank = r.seq.priority;
        for (let k = byClass.length; k <= rank; k++) ((byClass[k] = 0), (tokensByClass[k] = 0));
        byClass[rank]!++;
        tokensByClass[rank]! += p;
        prefill += p;
        decode += Math.max(0, Math.min(r.left, r.seq.estOutputTokens - r.seq.generated) - r.made);
        waitingBlocks += blocks(p);
        committed += blocks(r.context + Math.min(r.left, r.seq.estOutputTokens - r.seq.generated));
      }
      let used = 0;
      for (const r of running) {
        if (!r.first) prefill += r.context + r.made;
        decode += Math.max(0, Math.min(r.left, r.seq.estOutputTokens - r.seq.generated) - r.made);
        const fin = blocks(r.context + Math.max(r.made, Math.min(r.left, r.seq.estOutputTokens - r.seq.generated)));
        runningCommitted += fin;
        committed += fin;
        runningContext += r.context + r.made;
        used += blocks(r.context + r.made);
      }
      // The server's own gauge counts what others send it too: the larger of the two is what is used.
      const total = limits.blocksTotal;
      const scraped = c.kvUsage === null ? 0 : Math.round(c.kvUsage * total);
      return idleLoad({
        waiting: queue.length,
        running: running.size,
        blocksUsed: Math.min(total, Math.max(used, scraped)),
        blocksTotal: total,
        prefillTokensAhead: prefill,
        decodeTokensAhead: decode,
        waitingBlocks,
        waitingByClass: byClass,
        waitingTokensByClass: tokensByClass,
        committedBlocks: Math.max(committed, scraped),
        runningCommittedBlocks: Math.max(runningCommitted, scraped),
        runningContext,
        received: c.received,
        cancelled: c.cancelled,
        saturated: queue.length > 0 && running.size >= limits.maxRunning,
      });
    },
  };
}
