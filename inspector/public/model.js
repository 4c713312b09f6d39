// The page's view of the node, folded from inspection frames (live or replayed). Pure: no DOM here.

/** Frame format this page reads. */
export const VERSION = 1;

const MAX_TIMELINE = 400;
const MAX_FINISHED = 200;
const MAX_HISTORY = 64;
const MAX_PAST_REPLICAS = 12;
const TERMINAL = new Set(['done', 'cancelled', 'expired', 'rejected', 'failed']);

/** An empty view. */
export function createModel() {
  return {
    t: 0,
    hello: null,
    machines: {},
    scenario: '',
    gpus: [],
    placement: null,
    replicas: new Map(),
    pastReplicas: [],
    actors: new Map(),
    inFlight: new Map(),
    finished: [],
    timeline: [],
    dropped: 0,
    live: 0,
    frames: 0,
  };
}

const pushBounded = (list, item, max) => {
  list.push(item);
  if (list.length > max) list.splice(0, list.length - max);
};

const note = (m, t, text, tone, ref) =>
  pushBounded(m.timeline, { t, text, tone: tone ?? '', ref: ref ?? null }, MAX_TIMELINE);

const actorOf = (m, id, kind, t) => {
  let a = m.actors.get(id);
  if (!a) {
    a = { id, m: kind, state: null, ctx: {}, since: t, history: [], trace: [], done: false, wasFailed: false };
    m.actors.set(id, a);
  }
  return a;
};

const eventText = (ev) => {
  const parts = [ev.type];
  if (ev.code) parts.push(String(ev.code));
  if (ev.replica) parts.push(`→ ${ev.replica}`);
  if (ev.gpu !== undefined) parts.push(`gpu ${ev.gpu}`);
  return parts.join(' ');
};

const applyState = (m, f) => {
  const a = actorOf(m, f.id, f.m, f.t);
  const prev = a.state;
  a.state = f.s;
  a.ctx = f.ctx;
  a.done = !!f.done;
  if (prev !== f.s) a.since = f.t;
  // A one-GPU replica can pass through `failed` within one step: the failed GPUs in its context tell.
  const failed = f.s === 'failed' || (Array.isArray(f.ctx.failedGpus) && f.ctx.failedGpus.length > 0);
  if (failed) a.wasFailed = true;
  pushBounded(a.history, { t: f.t, s: f.s, ev: f.ev }, MAX_HISTORY);
  if (f.m === 'request') {
    if (f.done || TERMINAL.has(f.s)) {
      m.inFlight.delete(f.id);
      m.finished.push(f.id);
      // Finished requests keep their actor record only while listed, so memory stays bounded over a long run.
      while (m.finished.length > MAX_FINISHED) {
        const old = m.finished.shift();
        if (!m.inFlight.has(old)) m.actors.delete(old);
      }
      if (f.s !== 'done') note(m, f.t, `${f.id} ${f.s}${f.ctx.code ? ` (${f.ctx.code})` : ''}`, 'bad', f.id);
    } else {
      m.inFlight.set(f.id, a);
      const type = f.ev.type;
      if (type === 'request.preempted') note(m, f.t, `${f.id} preempted on ${f.ctx.replica ?? '?'}`, 'warn', f.id);
      else if (type === 'request.interrupted')
        note(m, f.t, `${f.id} interrupted (${f.ev.code ?? '?'}), waiting to resume`, 'warn', f.id);
      else if (type === 'request.requeued' && prev === 'requeued')
        note(m, f.t, `${f.id} resumed on ${f.ev.replica}`, 'good', f.id);
    }
    return;
  }
  if (prev !== f.s || f.ev.type !== 'xstate.init') {
    const tone = failed ? 'bad' : f.s.startsWith('ready') ? 'good' : '';
    // A replica's moves inside `ready` (idle, busy, saturated) and its per-GPU load/release reports stay off the timeline.
    if (f.m !== 'replica' || prev === null || prev.split('.')[0] !== f.s.split('.')[0]) {
      note(m, f.t, prev === null ? `${f.id} is ${f.s}` : `${f.id}: ${prev} → ${f.s} on ${eventText(f.ev)}`, tone, f.id);
    }
  }
  if (f.m === 'replica') {
    const r = m.replicas.get(f.id);
    if (r) {
      r.state = f.s;
      if (failed) r.wasFailed = true;
      if (typeof f.ctx.epoch === 'number') r.epoch = f.ctx.epoch;
    } else {
      m.replicas.set(f.id, {
        id: f.id,
        model: f.ctx.model ?? '',
        version: f.ctx.version ?? '',
        state: f.s,
        epoch: f.ctx.epoch ?? 0,
        gpus: f.ctx.gpus ?? [],
        step: f.ctx.step ?? 0,
        waiting: 0,
        running: 0,
        blocksUsed: 0,
        blocksTotal: 0,
        steps: 0,
        wasFailed: failed,
      });
    }
    if (f.done) retireReplica(m, f.id, f.t);
  }
};

const retireReplica = (m, id, t) => {
  const r = m.replicas.get(id);
  if (!r) return;
  m.replicas.delete(id);
  r.state = r.state === 'failed' || r.state === 'stopped' ? r.state : 'stopped';
  r.goneAt = t;
  m.pastReplicas = [r, ...m.pastReplicas.filter((p) => p.id !== id)].slice(0, MAX_PAST_REPLICAS);
};

const applyNode = (m, f) => {
  m.gpus = f.gpus;
  m.placement = f.placement;
  m.live = f.live;
  const present = new Set();
  for (const v of f.replicas) {
    present.add(v.id);
    const r = m.replicas.get(v.id);
    const actor = m.actors.get(v.id);
    // The actor's own state frames are newer than a summary taken on a timer.
    const state = actor && actor.state ? actor.state : v.state;
    m.replicas.set(v.id, { ...v, state, wasFailed: (r && r.wasFailed) || state === 'failed' });
  }
  for (const id of [...m.replicas.keys()]) if (!present.has(id)) retireReplica(m, id, f.t);
};

const applyPlace = (m, f) => {
  const e = f.ev;
  const what = [
    e.kind,
    e.replica,
    e.gpu !== undefined ? `gpu ${e.gpu}` : null,
    e.gpus ? `gpus ${e.gpus.join(',')}` : null,
    e.detail,
  ]
    .filter((x) => x !== null && x !== undefined)
    .join(' · ');
  const bad = e.kind === 'gpu.failed' || e.kind === 'replica.failed' || e.kind === 'unavailable';
  note(
    m,
    f.t,
    what,
    bad ? 'bad' : e.kind === 'replica.ready' || e.kind === 'available' || e.kind === 'gpu.ready' ? 'good' : '',
    e.replica ?? (e.gpu !== undefined ? `gpu.${e.gpu}` : null),
  );
  // Placement hears of a GPU fault before the next summary: show it at once.
  if (e.kind === 'gpu.failed' && typeof e.gpu === 'number') {
    const g = m.gpus.find((x) => x.index === e.gpu);
    if (g) Object.assign(g, { state: 'failed', machineState: 'failed', healthy: false, weightsBytes: 0, kvBytes: 0 });
  }
};

/** Applies one frame to the view. */
export function apply(m, f) {
  m.frames++;
  if (typeof f.t === 'number' && f.t > m.t) m.t = f.t;
  switch (f.k) {
    case 'hello':
      m.hello = f;
      m.machines = f.machines ?? {};
      m.scenario = f.scenario ?? '';
      break;
    case 'actor':
      actorOf(m, f.id, f.m, f.t);
      break;
    case 'state':
      applyState(m, f);
      break;
    case 'trace': {
      const a = actorOf(m, f.id, 'request', f.t);
      a.trace = f.trace;
      break;
    }
    case 'node':
      applyNode(m, f);
      break;
    case 'place':
      applyPlace(m, f);
      break;
    case 'dropped':
      m.dropped += f.n;
      note(m, f.t, `${f.n} inspection frames dropped (the reader fell behind)`, 'warn', null);
      break;
    default:
      break;
  }
}

/** The actor record behind a GPU tile, with the state its statechart highlights. */
export function gpuActor(m, index) {
  const g = m.gpus.find((x) => x.index === index);
  const own = m.actors.get(`gpu.${index}`);
  if (own && own.state) return own;
  return {
    id: `gpu.${index}`,
    m: 'gpu',
    state: g ? g.machineState : 'offline',
    ctx: g ? { replica: g.replica, model: g.model } : {},
    history: [],
    trace: [],
  };
}

/** The placement actor's record. */
export function placementActor(m) {
  return (
    m.actors.get('placement') ?? {
      id: 'placement',
      m: 'placement',
      state: m.placement?.state ?? 'steady',
      ctx: {},
      history: [],
      trace: [],
    }
  );
}

/** Checks a recorded file and returns its frames, or throws saying what is wrong. */
export function framesOfRecording(doc) {
  if (!doc || typeof doc !== 'object' || doc.format !== 'switchyard.inspect')
    throw new Error('not a switchyard inspection recording (format should be "switchyard.inspect")');
  if (doc.v !== VERSION) throw new Error(`recording version ${doc.v}; this page reads version ${VERSION}`);
  if (!Array.isArray(doc.frames) || doc.frames.length === 0) throw new Error('the recording has no frames');
  return doc.frames;
}
