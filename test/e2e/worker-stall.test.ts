// The worker process paused for 5 s (SIGSTOP, then SIGCONT: what a long GC pause or a stalled host looks like) while
// sixteen streams run on eight small replicas, on real processes and sockets: the pause is one stall of the worker,
// not eight hung GPUs. No GPU is failed for the repair time, full capacity is back within seconds of the SIGCONT,
// every stream completes with each token once, and no request fails.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectClient, type StreamResult } from '../../api/client.ts';
import { serve, writeConfig, type Served } from './harness.ts';

// The serving default's detection (heartbeats every second, five missed make a lost worker), a 60 s repair time.
const CONFIG = writeConfig(`
name: e2e-worker-stall
node: { gpu: H100-SXM, gpus: 8, repairMs: 60000 }
routing: { ejection: { failures: 1000 } }
placement: { policy: exclusive }
detection: { heartbeatMs: 1000, missedHeartbeats: 5 }
models:
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 8
    resume: { maxResumes: 2, budgetMs: 60000 }
    classes: { interactive: { ttftMs: 60000, tpotMs: 1000, maxQueueMs: 60000 } }
`);

interface Status {
  gpus: { index: number; healthy: boolean }[];
  replicas: { id: string; state: string }[];
  placement: { events: { kind: string; gpu?: number; path?: string; detail?: string }[] };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('the worker paused for 5 s while streams run', () => {
  let s: Served;
  beforeAll(async () => {
    // The simulated hardware runs at a fifth of model time: a 4,000-token stream lasts several seconds.
    s = await serve(['--config', CONFIG, '--time-scale', '0.2']);
    await s.waitReady('llama-3-8b');
    for (;;) {
      const st = (await s.get('/admin/status', s.adminToken)).body as Status;
      if (st.replicas.length === 8 && st.replicas.every((r) => r.state.startsWith('ready'))) break;
      await sleep(100);
    }
  }, 60_000);
  afterAll(async () => {
    await s?.stop();
  });

  it('costs no repair time, brings capacity back within seconds, repeats no token and fails no request', async () => {
    const c = await connectClient(s.wsUrl);
    const streams = Array.from({ length: 16 }, (_, i) =>
      c.stream({ model: 'llama-3-8b', prompt: `stream ${i}`, maxTokens: 4000 }),
    );
    const counts = streams.map(() => ({ tokens: 0, next: 0, gaps: 0 }));
    const consumed = streams.map(async (st, i) => {
      try {
        for await (const ch of st) {
          if (ch.seq !== counts[i]!.next) counts[i]!.gaps++;
          counts[i]!.next = ch.seq + ch.n;
          counts[i]!.tokens += ch.n;
        }
      } catch {
        // the terminal error is in st.result
      }
    });
    while (counts.some((x) => x.tokens < 20)) await sleep(20);

    const worker = s.workerPids().at(-1)!;
    process.kill(worker, 'SIGSTOP');
    await sleep(5_000);
    const pausedTokens = counts.map((x) => x.tokens);
    process.kill(worker, 'SIGCONT');
    const resumedAt = performance.now();

    // Full capacity: every GPU healthy and every replica ready again, within a few seconds of the SIGCONT.
    let st: Status;
    for (;;) {
      st = (await s.get('/admin/status', s.adminToken)).body as Status;
      const full =
        st.gpus.every((g) => g.healthy) && st.replicas.filter((r) => r.state.startsWith('ready')).length === 8;
      if (full) break;
      if (performance.now() - resumedAt > 5_000) throw new Error(`not back in 5 s: ${JSON.stringify(st)}`);
      await sleep(50);
    }
    expect(performance.now() - resumedAt).toBeLessThan(5_000);

    await Promise.all(consumed);
    const results: StreamResult[] = await Promise.all(streams.map((x) => x.result));
    for (const [i, r] of results.entries()) {
      expect(r.ok, JSON.stringify(r)).toBe(true);
      expect(counts[i]!.gaps).toBe(0);
      expect(counts[i]!.tokens).toBe(4000);
      // The streams really were under way when the worker paused, and continued after it.
      expect(pausedTokens[i]!).toBeGreaterThan(0);
    }
    // No GPU was failed as hung by the pause; at most, past the node-loss bound, one lost node (reset, not repaired).
    st = (await s.get('/admin/status', s.adminToken)).body as Status;
    const hung = st.placement.events.filter((e) => e.kind === 'gpu.failed' && e.detail === 'step_stalled');
    expect(hung).toEqual([]);
    expect(st.placement.events.some((e) => e.kind === 'node.stalled')).toBe(true);
    c.close();
  }, 90_000);
});
