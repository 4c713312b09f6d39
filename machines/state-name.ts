// A machine state value as one dotted string ("ready.idle"), for logs, status pages and the inspector.

/** Flattens an XState state value into a dotted path; the first child wins in a parallel state. */
export function stateName(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object') {
    const [k, child] = Object.entries(v)[0] ?? ['?', null];
    return child ? `${k}.${stateName(child)}` : k;
  }
  return String(v);
}
