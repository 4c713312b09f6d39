// The tap: turns XState inspection events into the inspector's frames, filtered at the source. Only snapshots of
// the four inspected machines count; a snapshot becomes a frame when the actor's state changed or the event is
// not one of the hot-path ones (a rank's step report, a wake-up), and every field is sanitized.
import type { InspectionEvent } from 'xstate';
import { cleanFields, type ActorFrame, type Clean, type Frame, type StateFrame, type TraceFrame } from './protocol.ts';

/** Events that arrive per step or per wake-up: shown only when they change the actor's state. */
const HOT_EVENTS: ReadonlySet<string> = new Set(['work.available', 'work.idle', 'work.saturated', 'work.unsaturated']);

/** Context fields the page shows, per machine; nothing else leaves the process. */
const CONTEXT_FIELDS: Readonly<Record<string, readonly string[]>> = {
  gpu: ['replica', 'epoch', 'faultCode'],
  replica: ['model', 'version', 'epoch', 'busy', 'gpus', 'failedGpus'],
  request: ['model', 'priority', 'replica', 'tokens', 'resumes', 'preemptions', 'code', 'message', 'outcome'],
  placement: ['mode', 'target', 'reservation', 'switches', 'deadlineAt'],
};

/** Events after which a request's decision trace may have grown (a resume adds a routing decision). */
const TRACE_EVENTS: ReadonlySet<string> = new Set([
  'xstate.init',
  'request.admitted',
  'request.rejected',
  'request.requeued',
  'request.interrupted',
]);

/** True for events that arrive per step or per wake-up (other senders filter with it too). */
export function isHotEvent(type: string): boolean {
  return HOT_EVENTS.has(type);
}

/** What the tap needs from its surroundings. */
export interface TapOptions {
  now(): number;
  /** Where frames go. */
  emit(frame: Frame): void;
  /** A request's decision traces (the control plane's `explain`). */
  explain?(id: string): readonly unknown[] | undefined;
  /** Called for every inspected snapshot, kept or not (drives activity-paced summaries). */
  tick?(): void;
}

/** A running tap. */
export interface Tap {
  /** The inspection observer to hand to the runtime. */
  observe(ev: InspectionEvent): void;
  /** Snapshots seen and frames emitted, for the filter's effect. */
  readonly stats: { seen: number; emitted: number };
}

/** A state value as a dotted path (`ready.busy`). */
export function statePath(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object') {
    const entries = Object.entries(v);
    if (entries.length === 0) return '';
    // A parallel state would have several regions; none of the inspected machines has one, so the first suffices.
    const [k, child] = entries[0]!;
    const rest = statePath(child);
    return rest ? `${k}.${rest}` : k;
  }
  return String(v);
}

/** True when two state values name the same state (compared without building their paths). */
function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  for (const k of ka)
    if (!Object.hasOwn(b, k) || !sameValue((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]))
      return false;
  return true;
}

interface Seen {
  value: unknown;
  path: string;
  traces: number;
}

interface ActorLike {
  id: string;
  logic?: { id?: unknown };
}

/** Creates a tap that emits frames for the inspected machines. */
export function createTap(opts: TapOptions): Tap {
  const seen = new Map<string, Seen>();
  const stats = { seen: 0, emitted: 0 };
  const emit = (f: Frame): void => {
    stats.emitted++;
    opts.emit(f);
  };

  const traceFrame = (id: string, s: Seen, t: number): TraceFrame | null => {
    const traces = opts.explain?.(id);
    if (!traces || traces.length <= s.traces) return null;
    s.traces = traces.length;
    const clean = cleanFields({ trace: traces }, ['trace'])['trace'];
    return { k: 'trace', t, id, trace: Array.isArray(clean) ? (clean as Clean[]) : [] };
  };

  const observe = (ev: InspectionEvent): void => {
    if (ev.type !== '@xstate.snapshot') return;
    const ref = ev.actorRef as unknown as ActorLike;
    const m = ref.logic?.id;
    if (typeof m !== 'string' || !Object.hasOwn(CONTEXT_FIELDS, m)) return;
    stats.seen++;
    opts.tick?.();
    const snap = ev.snapshot as { value?: unknown; status?: string; context?: Record<string, unknown> };
    const type = ev.event.type;
    const id = ref.id;
    let s = seen.get(id);
    const t = opts.now();
    const fresh = s === undefined;
    // An unchanged state on a hot-path event is the common case: decide it without building the path.
    const same = s !== undefined && sameValue(s.value, snap.value);
    if (same && HOT_EVENTS.has(type)) return;
    const path = same ? s!.path : statePath(snap.value);
    const changed = !s || s.path !== path;
    if (!s) {
      s = { value: snap.value, path, traces: 0 };
      seen.set(id, s);
    } else {
      s.value = snap.value;
      s.path = path;
    }
    const done = snap.status === 'done' || snap.status === 'stopped' || snap.status === 'error';
    if (!changed && !done && HOT_EVENTS.has(type)) return;
    if (fresh) emit({ k: 'actor', t, id, m } satisfies ActorFrame);
    const frame: StateFrame = {
      k: 'state',
      t,
      id,
      m,
      s: path,
      ev: cleanFields(ev.event as Record<string, unknown>, null),
      ctx: snap.context ? cleanFields(snap.context, CONTEXT_FIELDS[m]!) : {},
      ...(done ? { done: true } : {}),
    };
    emit(frame);
    if (m === 'request' && (fresh || TRACE_EVENTS.has(type))) {
      const tf = traceFrame(id, s, t);
      if (tf) emit(tf);
    }
    if (done) seen.delete(id);
  };

  return { observe, stats };
}
