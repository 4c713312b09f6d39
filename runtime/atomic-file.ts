// Writes a file atomically and safely in a directory others may write to: a temporary file beside it under an
// unpredictable name, created exclusively and never through a symlink, fsynced, then renamed over the target.
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fsyncSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

// O_NOFOLLOW is missing on some platforms (Windows): O_EXCL alone already refuses an existing name, links included.
const EXCLUSIVE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | (constants.O_NOFOLLOW ?? 0);

/**
 * A temporary name beside `path` that nobody can guess in advance. This is randomness for security, not for
 * simulation: it never reaches a report, so it comes from the OS (crypto), not from the seeded rng in runtime/rng.ts.
 * A predictable name (pid, counter) lets anyone who can write the directory plant a symlink there first.
 */
export function unpredictableTempName(path: string): string {
  return join(dirname(path), `.${basename(path)}.${randomBytes(12).toString('hex')}.tmp`);
}

/** Writes `data` to `path` atomically (temporary file, fsync, rename); with `durable`, the directory is fsynced too. */
export function writeFileAtomic(
  path: string,
  data: string | Uint8Array,
  opts: { mode?: number; durable?: boolean } = {},
) {
  const tmp = unpredictableTempName(path);
  const fd = openSync(tmp, EXCLUSIVE, opts.mode ?? 0o600);
  try {
    try {
      writeSync(fd, typeof data === 'string' ? Buffer.from(data) : data);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
  if (!opts.durable) return;
  // The rename is durable only once the directory entry is.
  const dir = openSync(dirname(path), 'r');
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}
