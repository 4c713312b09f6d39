// Engine host: the child process that owns one replica's engine and answers the worker's commands over Node IPC.
//
// Started by host-client.ts with `node --import tsx host.ts`, CUDA_VISIBLE_DEVICES already narrowed to the replica's
// GPUs. It loads the model when told, runs commands one at a time (the engine serialises them), and exits when told
// to unload or when its parent goes away, so the process and all of its memory never outlive the replica.
import { EngineError, type Engine, type EngineFailure } from './engine.ts';
import { parseHostCommand, type HostCommand, type HostMessage } from './host-protocol.ts';
import { checkModelFile } from './model-file.ts';

/** Sends a message; the promise settles once it is handed to the channel, so a disconnect after it loses nothing. */
const send = (msg: HostMessage): Promise<void> =>
  new Promise((resolve) => {
    if (!process.send) return resolve();
    process.send(msg, undefined, {}, () => resolve());
  });

const asFailure = (err: unknown): EngineFailure =>
  err instanceof EngineError
    ? err.failure()
    : { code: 'engine_failed', message: String(err).slice(0, 4096), retryable: true };

let engine: Engine | undefined;
let loading = false;

const reply = async (id: number, work: () => Promise<Extract<HostMessage, { ok: true }>['value']>) => {
  let msg: HostMessage;
  try {
    msg = { v: 1, type: 'reply', id, ok: true, value: await work() };
  } catch (err) {
    msg = { v: 1, type: 'reply', id, ok: false, failure: asFailure(err) };
  }
  await send(msg);
};

const loaded = (): Engine => {
  if (!engine) throw new EngineError('not_loaded', 'the engine host has no model loaded');
  return engine;
};

async function handle(cmd: HostCommand): Promise<void> {
  switch (cmd.type) {
    case 'load': {
      if (engine || loading) {
        await send({ v: 1, type: 'load_failed', failure: asFailure('already loaded') });
        return;
      }
      loading = true;
      try {
        // Refuse a bad file before paying for node-llama-cpp's import and its binary self-test.
        await checkModelFile(cmd.file);
        const { loadLlamaEngine } = await import('./llama-engine.ts');
        engine = await loadLlamaEngine(cmd.file, cmd.options);
        send({ v: 1, type: 'loaded', capacity: engine.capacity() });
      } catch (err) {
        await send({ v: 1, type: 'load_failed', failure: asFailure(err) });
        process.exitCode = 1;
        process.disconnect?.();
      }
      return;
    }
    case 'step':
      return reply(cmd.id, async () => {
        const result = await loaded().step(cmd.plan);
        return { kind: 'step', result, capacity: loaded().capacity() };
      });
    case 'free':
      return reply(cmd.id, async () => {
        const { text } = await loaded().free(cmd.seq);
        return { kind: 'free', text, capacity: loaded().capacity() };
      });
    case 'tokenize':
      return reply(cmd.id, async () => ({ kind: 'tokenize', tokens: loaded().tokenize(cmd.text) }));
    case 'probe':
      return reply(cmd.id, async () => ({ kind: 'probe', capacity: loaded().capacity() }));
    case 'unload':
      await engine?.unload();
      engine = undefined;
      await send({ v: 1, type: 'unloaded' });
      process.disconnect?.();
      return;
  }
}

process.on('message', (raw) => {
  const parsed = parseHostCommand(raw);
  if (!parsed.ok) {
    const id = (raw as { id?: unknown } | null)?.id;
    const failure: EngineFailure = { code: 'invalid_request', message: parsed.error, retryable: false };
    if (typeof id === 'number') void send({ v: 1, type: 'reply', id, ok: false, failure });
    return;
  }
  void handle(parsed.cmd);
});

// Without its worker, a host has no reason to live: exiting frees the model and the cache.
process.on('disconnect', () => {
  void (engine?.unload() ?? Promise.resolve()).finally(() => process.exit(process.exitCode ?? 0));
});
