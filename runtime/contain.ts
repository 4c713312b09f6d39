// Keeping a failure with what it happened to: the one error that no handler contains (a broken invariant that leaves
// the process's state unknown, naming the requests it touched), how a containing handler tells it apart, and how a
// serving process ends over one.
import type { ActorFault } from './system.ts';

/** A broken invariant after which the process's state is unknown: it ends the process (non-zero), never contained. */
export class BrokenInvariant extends Error {
  /** The requests it touched. */
  readonly requests: readonly string[];
  constructor(message: string, requests: readonly string[], cause?: unknown) {
    super(`${message} (requests: ${requests.length > 0 ? requests.join(', ') : 'none'})`, { cause });
    this.name = 'BrokenInvariant';
    this.requests = requests;
  }
}

/**
 * What a handler that contains failures (one frame, one request, one timer) calls first with what it caught: a broken
 * invariant goes on up, to end the process; anything else is answered with a line describing it, for the log.
 */
export function contained(e: unknown): string {
  if (e instanceof BrokenInvariant) throw e;
  if (e instanceof Error) return e.stack ?? `${e.name}: ${e.message}`;
  return String(e);
}

/**
 * Ends the process over a broken invariant, on a turn of its own: thrown outside every handler that could contain
 * it, it exits the process non-zero with the invariant's message (which names the requests it touched) and stack.
 */
export function endProcess(e: BrokenInvariant): void {
  queueMicrotask(() => {
    throw e;
  });
}

/**
 * How a serving process hears its runtime's faults: each is logged with the requests it touched; one the actor did
 * not contain (it is dead, its part of the state unknown) then ends the process, as a BrokenInvariant.
 */
export function faultHandler(log: (line: string) => void): (f: ActorFault) => void {
  return (f) => {
    const requests = f.requests ?? (f.error instanceof BrokenInvariant ? f.error.requests : []);
    const held = requests.length > 0 ? requests.join(', ') : 'none known';
    const error = f.error instanceof Error ? (f.error.stack ?? f.error.message) : String(f.error);
    log(`${f.contained ? 'contained a fault' : 'broken invariant'} in ${f.actor} (requests: ${held}): ${error}`);
    if (f.contained) return;
    endProcess(
      f.error instanceof BrokenInvariant ? f.error : new BrokenInvariant(`${f.actor} failed`, requests, f.error),
    );
  };
}

/** What a serving process's wall clock does with a timer whose callback threw: logs it (that timer alone failed), or
 * ends the process over a broken invariant (contained rethrows it, out of the timer). */
export function timerFailed(log: (line: string) => void): (e: unknown) => void {
  return (e) => log(`a timer failed: ${contained(e)}`);
}
