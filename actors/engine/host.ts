// Engine host: the child process that owns one replica's engine and its engine core, and talks to the worker over
// Node IPC.
//
// Started by host-client.ts with `node --import tsx host.ts`, CUDA_VISIBLE_DEVICES already narrowed to the replica's
// GPUs. It loads the model when told, then opens the replica's engine core over it (the step loop runs here, on this
// process's wall clock, with no hop per step): sequences come in by `submit` and leave by `cancel`, and each step's
// events and load go out as one `report`. It exits when told to unload or when its parent goes away, so the process
// and all of its memory never outlive the replica.
import { renameSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createWallClock } from '../../runtime/clock.ts';
import {
  engineProfileAt,
  EngineProfileError,
  profileStepS,
  sizedEngineProfile,
  type EngineProfile,
} from '../gpu/profile-cost-model.ts';
import { createEngineCore } from '../engine-core/core.ts';
import type { EngineCore } from '../engine-core/types.ts';
import type { CoreReport } from '../../machines/core-messages.ts';
import { EngineError, type Engine, type EngineCapacity, type EngineFailure, type EngineLoadOptions } from './engine.ts';
import { createLlamaExecutor, type LlamaExecutor } from './llama-executor.ts';
import {
  ENGINE_STATS_DIR_ENV,
  parseHostCommand,
  type HostCommand,
  type HostCoreSpec,
  type HostMessage,
  type HostStatsFile,
} from './host-protocol.ts';
import { checkModelFile } from './model-file.ts';
import { encode } from '../../transport/codec.ts';

/** Sends a message; the promise settles once it is handed to the channel, so a disconnect after it loses nothing. */
const send = (msg: HostMessage): Promise<void> =>
  new Promise((resolve) => {
    if (!process.send || !process.connected) return resolve();
    process.send(msg, undefined, {}, () => resolve());
  });

const asFailure = (err: unknown): EngineFailure =>
  err instanceof EngineError
    ? err.failure()
    : { code: 'engine_failed', message: String(err).slice(0, 4096), retryable: true };

let engine: Engine | undefined;
let loading = false;
let loaded: { file: string; options: EngineLoadOptions } | undefined;
let core: EngineCore | undefined;
let executor: LlamaExecutor | undefined;
let broken = false;

/** The core or its engine failed, or the worker sent what cannot be served: say so once and stop the loop; the worker
 * kills this process. */
const failed = (err: unknown): void => {
  if (broken) return;
  broken = true;
  core?.stop();
  void send({ v: 2, type: 'failed', failure: asFailure(err) });
};

// The core's clock: this process's wall clock; a timer that throws fails the host instead of killing it silently.
const clock = createWallClock(failed);

const NO_STATS = Object.freeze({ steps: 0, busyMs: 0, idleMs: 0, idleGaps: 0 });

const statsDir = process.env[ENGINE_STATS_DIR_ENV];

/** Writes the engine's stats for a benchmark to read (ENGINE_STATS_DIR_ENV), whole or not at all. */
const writeStats = (): void => {
  if (!statsDir || !executor) return;
  const file = join(statsDir, `engine-stats-${process.pid}.json`);
  const out: HostStatsFile = { pid: process.pid, at: clock.now(), ...executor.stats() };
  try {
    writeFileSync(`${file}.tmp`, JSON.stringify(out));
    renameSync(`${file}.tmp`, file);
  } catch {
    // diagnosis only: a folder that cannot be written costs the benchmark its figure, not the host its work
  }
};

const report = (r: CoreReport): void => {
  const l = r.load;
  // Nothing runnable: the wait for the next submit is not the engine's idle time.
  if (l.waiting + l.running === 0) {
    executor?.workEnded();
    writeStats();
  }
  // One message a step, not waited on: nothing follows it that a lost report would change. The body is the report as
  // the control plane reads it; the worker forwards it without decoding (host-protocol.ts).
  const finished: string[] = [];
  for (const e of r.events) if (e.k === 'f') finished.push(e.id);
  const body = encode(r);
  const msg: HostMessage = {
    v: 2,
    type: 'progress',
    body: Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('base64'),
    finished,
    received: l.received,
    pending: l.waiting + l.running + l.queued,
    stats: executor?.stats() ?? NO_STATS,
  };
  if (process.connected) process.send?.(msg);
};

const reply = async (id: number, work: () => Promise<Extract<HostMessage, { ok: true }>['value']>) => {
  let msg: HostMessage;
  try {
    msg = { v: 2, type: 'reply', id, ok: true, value: await work() };
  } catch (err) {
    msg = { v: 2, type: 'reply', id, ok: false, failure: asFailure(err) };
  }
  await send(msg);
};

const loadedEngine = (): Engine => {
  if (!engine) throw new EngineError('not_loaded', 'the engine host has no model loaded');
  return engine;
};

/** The calibrated profile a core predicts with; one that cannot be read refuses the open, typed. */
function calibratedProfile(file: string): EngineProfile {
  try {
    return engineProfileAt(file);
  } catch (e) {
    if (e instanceof EngineProfileError) throw new EngineError('invalid_request', e.message);
    throw e;
  }
}

/** Opens the replica's core over the engine; refused when its limits do not fit the engine's real cache. */
function openCore(spec: HostCoreSpec): EngineCapacity {
  const e = loadedEngine();
  if (core) throw new EngineError('invalid_request', 'the engine core is already open');
  const cap = e.capacity();
  const { limits } = spec;
  if (
    limits.maxRunning > cap.sequences ||
    limits.maxContext > cap.cellsPerSequence ||
    limits.tokenBudget > cap.batchTokens
  ) {
    throw new EngineError(
      'invalid_request',
      `core limits of ${spec.replica} (${limits.maxRunning} sequences x ${limits.maxContext} tokens, ` +
        `${limits.tokenBudget} a step) exceed the engine's cache (${cap.sequences} x ${cap.cellsPerSequence}, ` +
        `batch ${cap.batchTokens})`,
    );
  }
  // Step times predicted as the control plane prices the replica: with its calibrated profile, else from the model
  // file's size (sizedEngineProfile); the measured time is what the core reports as busy.
  const opts = loaded!.options;
  const profile = spec.profile
    ? calibratedProfile(spec.profile)
    : sizedEngineProfile(statSync(loaded!.file).size, {
        threads: opts.threads ?? 1,
        sequences: cap.sequences,
        contextTokens: cap.cellsPerSequence + 1,
        batchTokens: cap.batchTokens,
      });
  executor = createLlamaExecutor(e, {
    replica: spec.replica,
    now: clock.now,
    predictMs: (plan) => profileStepS(profile, plan.shape) * 1000,
  });
  core = createEngineCore({
    replica: spec.replica,
    epoch: spec.epoch,
    owner: spec.owner,
    clock,
    limits: spec.limits,
    executor,
    report,
    crashed: failed,
    checkInvariants: spec.check === true,
  });
  return cap;
}

/** Runs `work` on the open core; anything it throws fails the host (the sequences are the worker's to re-home). */
const onCore = (work: (c: EngineCore) => void): void => {
  if (broken) return;
  if (!core) return failed(new EngineError('not_loaded', 'the engine host has no core open'));
  try {
    work(core);
  } catch (err) {
    failed(err);
  }
};

async function load(cmd: Extract<HostCommand, { type: 'load' }>): Promise<void> {
  if (engine || loading) {
    await send({ v: 2, type: 'load_failed', failure: asFailure('already loaded') });
    return;
  }
  loading = true;
  try {
    // Refuse a bad file before paying for node-llama-cpp's import and its binary self-test.
    await checkModelFile(cmd.file);
    const { loadLlamaEngine } = await import('./llama-engine.ts');
    engine = await loadLlamaEngine(cmd.file, cmd.options);
    loaded = { file: cmd.file, options: cmd.options };
    void send({ v: 2, type: 'loaded', capacity: engine.capacity() });
  } catch (err) {
    await send({ v: 2, type: 'load_failed', failure: asFailure(err) });
    process.exitCode = 1;
    process.disconnect?.();
  }
}

async function handle(cmd: HostCommand): Promise<void> {
  switch (cmd.type) {
    case 'load':
      return load(cmd);
    case 'open':
      return reply(cmd.id, async () => ({ kind: 'open', capacity: openCore(cmd.core) }));
    case 'submit':
      return onCore((c) => c.submit(cmd.seqs));
    case 'cancel':
      return onCore((c) => {
        c.cancel(cmd.ids);
        if (!c.busy() && c.load().running + c.load().waiting === 0) executor?.workEnded();
      });
    case 'tokenize':
      return reply(cmd.id, async () => ({ kind: 'tokenize', tokens: loadedEngine().tokenize(cmd.text) }));
    case 'probe':
      return reply(cmd.id, async () => ({
        kind: 'probe',
        capacity: loadedEngine().capacity(),
        stats: executor?.stats() ?? NO_STATS,
      }));
    case 'unload':
      core?.stop();
      await engine?.unload();
      engine = undefined;
      await send({ v: 2, type: 'unloaded' });
      process.disconnect?.();
      return;
  }
}

process.on('message', (raw) => {
  const parsed = parseHostCommand(raw);
  if (parsed.ok) return void handle(parsed.cmd);
  const failure: EngineFailure = { code: 'invalid_request', message: parsed.error, retryable: false };
  const id = (raw as { id?: unknown } | null)?.id;
  // A command with an answer gets its refusal; a submit or cancel that cannot be read leaves sequences unaccounted
  // for, so the host is of no further use.
  if (typeof id === 'number') void send({ v: 2, type: 'reply', id, ok: false, failure });
  else failed(new EngineError('invalid_request', parsed.error));
});

// Without its worker, a host has no reason to live: exiting frees the model and the cache.
process.on('disconnect', () => {
  core?.stop();
  void (engine?.unload() ?? Promise.resolve()).finally(() => process.exit(process.exitCode ?? 0));
});
