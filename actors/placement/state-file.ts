// The operator state file: what admin calls changed while serving (placement and routing policy, GPUs an operator
// marked failed, rollouts), written atomically next to the config (temporary file, fsync, rename, fsync of the
// directory) and restored at start, so a restarted control plane keeps the operator's decisions. A file that cannot be
// read, does not parse, fails its schema, or belongs to another config is refused with a typed error naming the file:
// never silently reset.
import { readFileSync, statSync } from 'node:fs';
import { writeFileAtomic } from '../../runtime/atomic-file.ts';
import { arr, int, obj, oneOf, optional, record, str, validate, type Infer } from '../../transport/schema.ts';

/** The format name every state file carries (a JSON file of something else is foreign). */
export const STATE_FORMAT = 'switchyard-state';
/** The state file version this build writes and reads. */
export const STATE_VERSION = 1;
/** Largest state file read (a bigger one is refused before it is read). */
export const STATE_MAX_BYTES = 1 << 20;

const name = str({ min: 1, max: 200 });
/** One rollout as the state file keeps it: started by whom is not kept, only what it moves. */
const rolloutSchema = obj({
  model: name,
  from: name,
  to: name,
  steps: optional(int({ min: 1, max: 1024 })),
  /** Replicas of `to` at the end. */
  replicas: optional(int({ min: 0, max: 1024 })),
});
const stateSchema = obj(
  {
    format: oneOf(STATE_FORMAT),
    version: int({ min: 1, max: 1_000_000 }),
    config: name,
    placement: obj({ policy: oneOf('exclusive', 'switch', 'share') }),
    routing: obj({ policy: oneOf('cost', 'round-robin', 'least-requests', 'power-of-two') }),
    failedGpus: arr(int({ min: 0, max: 63 }), { max: 64 }),
    rollouts: arr(rolloutSchema, { max: 64 }),
    /** Replicas per `model@version` as rollouts left them (so replicas a rollout placed are adopted, not reclaimed). */
    counts: record(int({ min: 0, max: 1024 }), { max: 256 }),
  },
  { strict: true },
);

/** The operator state (the file's content without its header). */
export type OperatorState = Omit<Infer<typeof stateSchema>, 'format' | 'version' | 'config'>;

/** A rollout as persisted. */
export type PersistedRollout = Infer<typeof rolloutSchema>;

/** Why a state file was refused. */
export type StateFileCode = 'state_unreadable' | 'state_corrupt' | 'state_foreign';

/** A refused state file: typed, naming the file (serve exits instead of starting with state it cannot trust). */
export class StateFileError extends Error {
  constructor(
    readonly code: StateFileCode,
    readonly path: string,
    detail: string,
  ) {
    super(`state file ${path}: ${detail}`);
    this.name = 'StateFileError';
  }
}

/** Reads the state file for the config named `config`; null when there is none yet. Throws StateFileError. */
export function loadState(path: string, config: string): OperatorState | null {
  let text: string;
  try {
    const size = statSync(path).size;
    if (size > STATE_MAX_BYTES)
      throw new StateFileError('state_corrupt', path, `${size} bytes, over the ${STATE_MAX_BYTES}-byte limit`);
    text = readFileSync(path, 'utf8');
  } catch (e) {
    if (e instanceof StateFileError) throw e;
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new StateFileError('state_unreadable', path, (e as Error).message);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new StateFileError('state_corrupt', path, `not JSON (${(e as Error).message}); fix or remove it`);
  }
  const head = json as { format?: unknown; config?: unknown; version?: unknown } | null;
  if (typeof head !== 'object' || head === null || head.format !== STATE_FORMAT)
    throw new StateFileError('state_foreign', path, `not a switchyard state file (format is not "${STATE_FORMAT}")`);
  if (head.version !== STATE_VERSION)
    throw new StateFileError(
      'state_foreign',
      path,
      `version ${String(head.version)}, this build reads ${STATE_VERSION}`,
    );
  if (head.config !== config)
    throw new StateFileError('state_foreign', path, `written for config "${String(head.config)}", not "${config}"`);
  const v = validate(stateSchema, json);
  if (!v.ok) throw new StateFileError('state_corrupt', path, `${v.error.path}: ${v.error.message}`);
  const { placement, routing, failedGpus, rollouts, counts } = v.value;
  return { placement, routing, failedGpus, rollouts, counts };
}

/** Writes the state atomically: an exclusively created temporary file beside it under an unpredictable name (a
 * symlink planted in the directory is never followed), fsync, rename over it, fsync of the directory. */
export function saveState(path: string, config: string, state: OperatorState): void {
  const body = `${JSON.stringify({ format: STATE_FORMAT, version: STATE_VERSION, config, ...state }, null, 2)}\n`;
  writeFileAtomic(path, body, { mode: 0o600, durable: true });
}
