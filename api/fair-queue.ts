// Start-time fair queuing over tokens of work: each flow (a tenant) has its own FIFO; a request's start tag is the
// later of the queue's virtual time and its flow's last finish tag, its finish tag the start plus its cost divided by
// the flow's weight; the head with the smallest start tag leaves first. A flow that sends more than its share only
// pushes its own tags ahead, so a quiet flow's next request is served before the flood's backlog.

/** One flow's identity and weight. */
export interface Flow {
  readonly weight: number;
}

/** A queued item with its tags. */
export interface Tagged<T> {
  readonly item: T;
  readonly flow: Flow;
  readonly cost: number;
  readonly start: number;
  readonly finish: number;
  /** Arrival order: ties of start tags leave in it. */
  readonly order: number;
}

/** A fair queue of items from several flows. */
export interface FairQueue<T> {
  /** Tags and queues an item; `queued` false tags it as sent at once (it still advances the flow's finish tag). */
  push(item: T, flow: Flow, cost: number, queued?: boolean): Tagged<T>;
  /** The item that leaves next (smallest start tag among the heads `eligible` accepts), without removing it. */
  peek(eligible?: (head: Tagged<T>) => boolean): Tagged<T> | null;
  /** Removes and returns the next item (as `peek`); the virtual time moves to its start tag. */
  pop(eligible?: (head: Tagged<T>) => boolean): Tagged<T> | null;
  /** Removes an item wherever it is (cancelled, expired); false when not queued. */
  remove(t: Tagged<T>): boolean;
  /** Items queued, in all or of one flow. */
  size(flow?: Flow): number;
  /** Cost queued by one flow. */
  costOf(flow: Flow): number;
  /** Total weight of the flows with items queued (plus `also`, if it has none). */
  activeWeight(also?: Flow): number;
}

/** Test-only mutations that break the queue's promise on purpose, to show its property test catches them. */
export interface FairQueueMutations {
  /** First come, first served across flows (arrival order) instead of the smallest start tag. */
  fifo?: boolean;
}

/** Creates an empty fair queue. */
export function createFairQueue<T>(mutations: FairQueueMutations = {}): FairQueue<T> {
  const before = mutations.fifo
    ? (h: Tagged<T>, best: Tagged<T>): boolean => h.order < best.order
    : (h: Tagged<T>, best: Tagged<T>): boolean =>
        h.start < best.start || (h.start === best.start && h.order < best.order);
  let virtual = 0;
  let order = 0;
  let total = 0;
  const flows = new Map<Flow, { items: Tagged<T>[]; cost: number; lastFinish: number }>();
  const flowOf = (f: Flow): { items: Tagged<T>[]; cost: number; lastFinish: number } => {
    let s = flows.get(f);
    if (!s) {
      s = { items: [], cost: 0, lastFinish: 0 };
      flows.set(f, s);
    }
    return s;
  };
  const peek = (eligible?: (head: Tagged<T>) => boolean): Tagged<T> | null => {
    let best: Tagged<T> | null = null;
    for (const s of flows.values()) {
      const h = s.items[0];
      if (h && (!eligible || eligible(h)) && (best === null || before(h, best))) best = h;
    }
    return best;
  };
  const remove = (t: Tagged<T>): boolean => {
    const s = flows.get(t.flow);
    const i = s ? s.items.indexOf(t) : -1;
    if (!s || i < 0) return false;
    s.items.splice(i, 1);
    s.cost -= t.cost;
    total--;
    return true;
  };
  return {
    push: (item, flow, cost, queued = true) => {
      const s = flowOf(flow);
      const start = Math.max(virtual, s.lastFinish);
      const t: Tagged<T> = { item, flow, cost, start, finish: start + cost / flow.weight, order: order++ };
      s.lastFinish = t.finish;
      if (queued) {
        s.items.push(t);
        s.cost += cost;
        total++;
      } else virtual = Math.max(virtual, start);
      return t;
    },
    peek,
    pop: (eligible) => {
      const t = peek(eligible);
      if (t === null) return null;
      remove(t);
      virtual = Math.max(virtual, t.start);
      return t;
    },
    remove,
    size: (flow) => (flow === undefined ? total : (flows.get(flow)?.items.length ?? 0)),
    costOf: (flow) => flows.get(flow)?.cost ?? 0,
    activeWeight: (also) => {
      let w = 0;
      for (const [f, s] of flows) if (s.items.length > 0 || f === also) w += f.weight;
      if (also && !flows.has(also)) w += also.weight;
      return w;
    },
  };
}
