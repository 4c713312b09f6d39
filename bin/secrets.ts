// The serve command's secrets: tokens read from the environment or from files (never from flag values, which any
// user sees in `ps`), each checked before the server starts; generated ones written for the operator to a new file
// readable by its owner only (mode 0600), never a log line.
import { closeSync, fchmodSync, openSync, readFileSync, writeSync } from 'node:fs';
import { tokenWeakness } from '../api/token-quality.ts';

/** Writes `secrets` as JSON to `path` with mode 0600 (the file must not exist: a secret never overwrites a file). */
export function writeSecrets(path: string, secrets: Record<string, string>): void {
  const fd = openSync(path, 'wx', 0o600);
  try {
    // The mode given to open is masked by the umask; set it explicitly.
    fchmodSync(fd, 0o600);
    writeSync(fd, `${JSON.stringify(secrets)}\n`);
  } finally {
    closeSync(fd);
  }
}

/** Where one kind of token may come from: the environment variable and the file flag (and the refused value flag). */
export interface TokenSource {
  /** What the token guards, as messages say it ("admin"). */
  kind: string;
  /** The environment variable holding it (comma-separated when several). */
  env: string;
  /** The flag naming a file that holds it (one or more, separated by commas or white space). */
  fileFlag: string;
  /** The flag that used to take the token itself: refused, as its value shows in `ps`. */
  valueFlag?: string;
}

/** The tokens of one kind and where each came from, or why they cannot be used (never the token itself). */
export type TokensRead = { ok: true; tokens: string[] } | { ok: false; message: string };

const split = (s: string): string[] => s.split(/[\s,]+/).filter((x) => x.length > 0);

/**
 * Reads the tokens of `src`: from its environment variable (removed from the environment, so that no child process
 * inherits it) and from the file its file flag names. A token given as a flag value is refused, naming where to give
 * it instead; a weak token is refused naming its source (unless `strength` is false: a client only presents a token,
 * which the server it goes to checks).
 */
export function readTokens(
  src: TokenSource,
  given: { value?: string | readonly string[] | undefined; file?: string | undefined },
  env: NodeJS.ProcessEnv = process.env,
  strength = true,
): TokensRead {
  const flagged = typeof given.value === 'string' ? [given.value] : (given.value ?? []);
  if (flagged.length > 0)
    return {
      ok: false,
      message: `--${src.valueFlag ?? src.kind} would show the ${src.kind} token to every user of this host (ps): give it in ${src.env} or in a file named by --${src.fileFlag}`,
    };
  const sources: { where: string; tokens: string[] }[] = [];
  const fromEnv = env[src.env];
  delete env[src.env];
  if (fromEnv !== undefined && fromEnv !== '') sources.push({ where: src.env, tokens: split(fromEnv) });
  if (given.file !== undefined) {
    let text: string;
    try {
      text = readFileSync(given.file, 'utf8');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code ?? 'unreadable';
      return { ok: false, message: `cannot read --${src.fileFlag} ${given.file} (${code})` };
    }
    const tokens = split(text);
    if (tokens.length === 0) return { ok: false, message: `--${src.fileFlag} ${given.file} holds no token` };
    sources.push({ where: `--${src.fileFlag} ${given.file}`, tokens });
  }
  if (!strength) return { ok: true, tokens: sources.flatMap((s) => s.tokens) };
  for (const { where, tokens } of sources)
    for (const t of tokens) {
      const why = tokenWeakness(t);
      if (why !== null)
        return {
          ok: false,
          message: `the ${src.kind} token from ${where} ${why}: use a long random one (openssl rand -base64 32)`,
        };
    }
  return { ok: true, tokens: sources.flatMap((s) => s.tokens) };
}

/** The token a client command presents (the first of `src`'s, read as readTokens does without judging its strength),
 * undefined when none is given, or why it cannot be used. */
export function presentedToken(
  src: TokenSource,
  given: { value?: string | undefined; file?: string | undefined },
  env: NodeJS.ProcessEnv = process.env,
): { ok: true; token: string | undefined } | { ok: false; message: string } {
  const r = readTokens(src, given, env, false);
  return r.ok ? { ok: true, token: r.tokens[0] } : r;
}
