// Keeping a failure with what it happened to: the one error that no handler contains (a broken invariant that leaves
// the process's state unknown, naming the requests it touched), and how a containing handler tells it apart.

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
