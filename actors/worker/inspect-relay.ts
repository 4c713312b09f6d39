// The node's half of the inspector: its GPU actors live here, beside the engines they describe, and the control
// plane's inspector shows them. While a watch lease holds (the control plane renews it while someone reads), every
// snapshot of a GPU actor crosses the link as one `inspect.snapshot`; when it lapses, the node's runtime carries no
// inspection observer at all. A replayed snapshot (the observer set late) shows each GPU as it is now.
import type { InspectionEvent } from 'xstate';
import type { MessageOf } from '../../machines/messages.ts';
import type { TimerId } from '../../runtime/clock.ts';
import type { Runtime } from '../../runtime/system.ts';

/** Most snapshots forwarded per second: GPU actors change a few times a minute; a storm is cut, not queued. */
export const MAX_SNAPSHOTS_PER_S = 200;

/** The relay of one node. */
export interface InspectRelay {
  /** Applies a watch message: a lease of `leaseMs` from now (0 ends it). */
  watch(m: MessageOf<'inspect.watch'>): void;
  /** True while a lease holds. */
  active(): boolean;
  /** Snapshots forwarded and cut by the rate bound. */
  readonly stats: { sent: number; cut: number };
  stop(): void;
}

/** A state value as a dotted path (`allocated.serving`). */
function pathOf(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === null || typeof v !== 'object') return String(v);
  const keys = Object.keys(v);
  if (keys.length === 0) return '';
  const rest = pathOf((v as Record<string, unknown>)[keys[0]!]);
  return rest ? `${keys[0]}.${rest}` : keys[0]!;
}

const text = (v: unknown): string | null => (typeof v === 'string' && v.length > 0 ? v : null);

/** Starts an idle relay on the node's runtime; snapshots go to the control plane's `inspector`. */
export function createInspectRelay(runtime: Runtime): InspectRelay {
  const { clock } = runtime;
  const stats = { sent: 0, cut: 0 };
  let until = -Infinity;
  let timer: TimerId | null = null;
  let windowAt = -Infinity;
  let inWindow = 0;

  const observe = (ev: InspectionEvent): void => {
    if (ev.type !== '@xstate.snapshot') return;
    const ref = ev.actorRef as unknown as { id: string; logic?: { id?: unknown } };
    if (ref.logic?.id !== 'gpu') return;
    const now = clock.now();
    if (now - windowAt >= 1000) {
      windowAt = now;
      inWindow = 0;
    }
    if (++inWindow > MAX_SNAPSHOTS_PER_S) {
      stats.cut++;
      return;
    }
    const snap = ev.snapshot as { value?: unknown; status?: string; context?: Record<string, unknown> };
    const ctx = snap.context ?? {};
    const epoch = ctx['epoch'];
    stats.sent++;
    runtime.send('inspector', {
      type: 'inspect.snapshot',
      id: ref.id,
      state: pathOf(snap.value),
      status: snap.status ?? 'active',
      event: text(ev.event.type) ?? 'unknown',
      replica: text(ctx['replica']),
      epoch: typeof epoch === 'number' && Number.isInteger(epoch) && epoch >= 0 ? epoch : 0,
      faultCode: text(ctx['faultCode']),
    });
  };

  const off = (): void => {
    if (timer !== null) clock.clearTimeout(timer);
    timer = null;
    until = -Infinity;
    runtime.setInspector(null);
  };
  const lapse = (): void => {
    timer = null;
    if (clock.now() >= until) off();
    else timer = clock.setTimeout(lapse, until - clock.now());
  };

  return {
    watch: (m) => {
      if (m.leaseMs <= 0) return off();
      const wasOn = timer !== null;
      until = clock.now() + m.leaseMs;
      if (wasOn) return;
      timer = clock.setTimeout(lapse, m.leaseMs);
      runtime.setInspector(observe);
    },
    active: () => timer !== null,
    stats,
    stop: off,
  };
}
