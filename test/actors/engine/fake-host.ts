// A stand-in engine host for the client's edge cases: FAKE_HOST=silent never answers a step, rogue lies, env tells its
// GPUs, names tells the names of every variable in its environment.
const mode = process.env.FAKE_HOST;
const capacity = { sequences: 1, cellsPerSequence: 63, totalCells: 64, batchTokens: 64, freeSequences: 1, used: {} };

process.on('message', (cmd: { type: string; id?: number }) => {
  if (cmd.type === 'load' && mode === 'env') {
    const e = process.env;
    const message = ['CUDA', 'GGML_VK', 'HIP']
      .map((k) => `${k}_VISIBLE_DEVICES=${e[`${k}_VISIBLE_DEVICES`]}`)
      .join(' ');
    process.send?.({ v: 1, type: 'load_failed', failure: { code: 'engine_failed', message, retryable: false } });
  } else if (cmd.type === 'load' && mode === 'names') {
    const message = `env: ${Object.keys(process.env).sort().join(' ')}`;
    process.send?.({ v: 1, type: 'load_failed', failure: { code: 'engine_failed', message, retryable: false } });
  } else if (cmd.type === 'load') process.send?.({ v: 1, type: 'loaded', capacity });
  else if (cmd.type === 'probe')
    process.send?.({ v: 1, type: 'reply', id: cmd.id, ok: true, value: { kind: 'probe', capacity } });
  else if (cmd.type === 'step' && mode === 'rogue')
    process.send?.({ v: 1, type: 'reply', id: cmd.id, ok: true, value: { kind: 'step', result: { sampled: 'lots' } } });
});
process.on('disconnect', () => process.exit(0));
