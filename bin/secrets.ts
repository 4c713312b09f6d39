// Generated secrets written for the operator: a new file readable by its owner only (mode 0600), never a log line.
import { closeSync, fchmodSync, openSync, writeSync } from 'node:fs';

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
