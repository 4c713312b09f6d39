// A stand-in engine host for the client's edge cases: FAKE_HOST=silent never reports on what it was submitted, rogue
// answers a submit with a report whose body is not one msgpack map (it is cut short), env tells its GPUs, names tells the names of every variable
// in its environment.
const mode = process.env.FAKE_HOST;
const capacity = { sequences: 1, cellsPerSequence: 63, totalCells: 64, batchTokens: 64, freeSequences: 1, used: {} };
const stats = { steps: 0, busyMs: 0, idleMs: 0, idleGaps: 0 };
const refuse = (message: string) =>
  process.send?.({ v: 2, type: 'load_failed', failure: { code: 'engine_failed', message, retryable: false } });

process.on('message', (cmd: { type: string; id?: number }) => {
  if (cmd.type === 'load' && mode === 'env') {
    const e = process.env;
    refuse(['CUDA', 'GGML_VK', 'HIP'].map((k) => `${k}_VISIBLE_DEVICES=${e[`${k}_VISIBLE_DEVICES`]}`).join(' '));
  } else if (cmd.type === 'load' && mode === 'names') {
    refuse(`env: ${Object.keys(process.env).sort().join(' ')}`);
  } else if (cmd.type === 'load') process.send?.({ v: 2, type: 'loaded', capacity });
  else if (cmd.type === 'open')
    process.send?.({ v: 2, type: 'reply', id: cmd.id, ok: true, value: { kind: 'open', capacity } });
  else if (cmd.type === 'probe')
    process.send?.({ v: 2, type: 'reply', id: cmd.id, ok: true, value: { kind: 'probe', capacity, stats } });
  else if (cmd.type === 'submit' && mode === 'rogue')
    process.send?.({
      v: 2,
      type: 'progress',
      body: Buffer.from([0x82, 0xa2, 0x61, 0x74]).toString('base64'),
      finished: [],
      received: 1,
      pending: 1,
      stats,
    });
});
process.on('disconnect', () => process.exit(0));
