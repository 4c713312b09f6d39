// The worker's link lifecycle against a real serving control plane in this process: register, lose the link,
// reconnect with back-off and re-register with a new epoch, and serve again.
import { afterEach, describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../../actors/config.ts';
import { startNodeProcess, type NodeProcess } from '../../../actors/worker/process.ts';
import { startServer, type RunningServer } from '../../../api/server.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const until = async (f: () => boolean, ms = 15_000): Promise<void> => {
  const end = performance.now() + ms;
  while (!f()) {
    if (performance.now() > end) throw new Error('condition not met in time');
    await sleep(10);
  }
};

/** Submits one request of 5 tokens to `s` and waits for all of them. */
async function servesOne(s: RunningServer): Promise<void> {
  let tokens = 0;
  const r = s.serving.submit(
    { model: 'llama-3-8b', promptTokens: 4, maxTokens: 5 },
    { tokens: (_seq, n) => (tokens += n), done: () => {}, failed: () => {} },
    { text: false },
  );
  expect(r.ok).toBe(true);
  await until(() => tokens === 5);
}

let server: RunningServer | null = null;
let worker: NodeProcess | null = null;
afterEach(async () => {
  worker?.stop();
  await server?.close();
  server = null;
  worker = null;
});

describe('node process', () => {
  it('reconnects after the link drops and re-registers with a new epoch, then serves again', async () => {
    const scenario = normalizeScenario({
      name: 't',
      routing: { ejection: { failures: 1000 } },
      models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 1 }],
    });
    server = await startServer({ scenario, port: 0, workerTokens: ['w'], adminTokens: ['a'], nodeGraceMs: 50 });
    worker = startNodeProcess({
      url: server.nodeUrl,
      token: 'w',
      gpus: [0, 1, 2, 3, 4, 5, 6, 7],
      timeScale: 0.001,
      baseBackoffMs: 20,
    });
    const s = server;
    await until(() => s.serving.readiness()['llama-3-8b']!.ready);
    expect(worker.state()).toBe('serving');
    expect(worker.epoch()).toBe(1);

    // Cut the link from the control plane's side: the worker must notice, back off, and come back.
    s.node.close();
    const w = worker;
    await until(() => s.node.status().registrations === 2 && w.epoch() === 2);
    expect(w.state()).toBe('serving');
    await until(() => s.serving.readiness()['llama-3-8b']!.ready);

    await servesOne(s);
  });

  it('refuses a control-plane message whose handling throws and serves on', async () => {
    const scenario = normalizeScenario({
      name: 't',
      models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 1 }],
    });
    server = await startServer({ scenario, port: 0, workerTokens: ['w'], adminTokens: ['a'] });
    const lines: string[] = [];
    worker = startNodeProcess({
      url: server.nodeUrl,
      token: 'w',
      gpus: [0, 1],
      timeScale: 0.001,
      log: (line) => lines.push(line),
    });
    const s = server;
    await until(() => s.serving.readiness()['llama-3-8b']!.ready);
    const [replica] = [...s.cp.placement.replicas.values()];
    const spare = [0, 1].find((g) => !replica!.gpus.includes(g))!;
    // A well-formed assignment the worker cannot carry out: its model has no profile there, so handling it throws.
    s.runtime.send(`gpu.${spare}`, {
      type: 'gpu.assign',
      gpu: spare,
      replica: 'replica.nothing@v1#0',
      epoch: 1,
      model: 'no-such-model',
      gpuType: 'H100-SXM',
      tp: 1,
      loadMs: 1,
      unloadMs: 1,
    });
    s.node.flush();
    await until(() => lines.some((l) => l.startsWith('handling gpu.assign for gpu.')));
    expect(lines.find((l) => l.startsWith('handling gpu.assign'))).toMatch(/no-such-model/);
    // The replica it already held serves on.
    await servesOne(s);
    expect(worker.state()).toBe('serving');
    expect(s.node.status().registrations).toBe(1);
  });

  it('reports a refused token instead of retrying forever', async () => {
    const scenario = normalizeScenario({ name: 't', models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1 }] });
    server = await startServer({ scenario, port: 0, workerTokens: ['w'], adminTokens: ['a'] });
    let refused = false;
    worker = startNodeProcess({
      url: server.nodeUrl,
      token: 'wrong',
      gpus: [0],
      onUnauthorized: () => (refused = true),
    });
    await until(() => refused);
    expect(server.node.connected()).toBe(false);
  });
});
