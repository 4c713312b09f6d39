// Optional: also send the inspection stream to Stately's inspector (`serve --stately-inspect ws://host:port`), through
// @statelyai/inspect's WebSocket sender (reconnects, buffers a bounded number of events). Stately's UI is loaded from
// stately.ai, so this needs the internet; the self-hosted /inspector stays the default. @xstate/inspect itself is not
// used: its 0.8 line requires xstate v4 (see docs/inspector.md).
import { createWebSocketInspector } from '@statelyai/inspect';
import type { AnyEventObject, MachineContext } from 'xstate';
import { cleanFields } from './protocol.ts';
import type { InspectionSession } from './session.ts';
import { isHotEvent } from './tap.ts';

/** A running Stately sender. */
export interface StatelySender {
  stop(): void;
}

/** Sends a session's inspection events (filtered and sanitized like the page's) to a Stately WebSocket inspector at `url`. */
export function attachStatelyInspector(
  session: InspectionSession,
  url: string,
  maxDeferredEvents = 1_000,
): StatelySender {
  const inspector = createWebSocketInspector({
    url,
    maxDeferredEvents,
    sanitizeEvent: (ev) => cleanFields(ev as Record<string, unknown>, null) as AnyEventObject,
    sanitizeContext: (ctx) => cleanFields(ctx as Record<string, unknown>, null) as MachineContext,
  });
  const off = session.observeRaw((ev) => {
    // The same filter as the page's tap: no action reports, no per-step rank reports.
    if (ev.type === '@xstate.action') return;
    if ((ev.type === '@xstate.event' || ev.type === '@xstate.snapshot') && isHotEvent(ev.event.type)) return;
    inspector.inspect.next?.(ev);
  });
  return {
    stop: () => {
      off();
      inspector.stop();
    },
  };
}
