// Whether a token is fit to guard an API: long enough, not a placeholder copied from an example, and not so repetitive
// that it could be guessed. Says why not without ever repeating the token.

/** Shortest token accepted (characters). */
export const MIN_TOKEN_LENGTH = 16;
/** Fewest distinct characters a token may have. */
export const MIN_DISTINCT_CHARS = 8;
/** Least entropy a token may have, estimated from its own character frequencies (bits). */
export const MIN_TOKEN_BITS = 48;

/** Words that mark a value copied from an example or a template rather than a generated secret. */
const PLACEHOLDERS = /replace[-_ ]?me|change[-_ ]?me|example|placeholder|your[-_ ]?token|dummy/i;

/** Why `token` is unfit (a phrase that never contains it), or null when it is fine. */
export function tokenWeakness(token: string): string | null {
  if (token.length < MIN_TOKEN_LENGTH) return `is shorter than ${MIN_TOKEN_LENGTH} characters`;
  const word = PLACEHOLDERS.exec(token);
  if (word) return `looks like a placeholder (it contains "${word[0]}")`;
  const counts = new Map<string, number>();
  for (const c of token) counts.set(c, (counts.get(c) ?? 0) + 1);
  if (counts.size < MIN_DISTINCT_CHARS) return `has only ${counts.size} distinct characters`;
  const n = [...token].length;
  let bits = 0;
  for (const k of counts.values()) bits -= k * Math.log2(k / n);
  if (bits < MIN_TOKEN_BITS) return `has too little entropy (about ${Math.floor(bits)} bits, ${MIN_TOKEN_BITS} needed)`;
  return null;
}
