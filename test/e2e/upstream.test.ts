// `engine: openai` end to end with real processes: the front `switchyard serve` routes to two replicas whose engine is
// a separate model server (another `switchyard serve` of the tiny llama model, started by the front's worker per
// replica on exactly the replica's GPUs). The official openai client streams through the front; a cancel ends the
// upstream's request; a kill -9 of one upstream fails only its replica (each of its requests resumed or failed once);
// a SIGSTOPped upstream is found hung within its bound.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { connectClient } from '../../api/client.ts';
import { serve, writeConfig, type Served } from './harness.ts';
import { alive, tinyModel, until } from './engine-harness.ts';
import { openaiModel, upstreamConfig, upstreamsOf, UPSTREAM_ENV, type UpstreamProc } from './upstream-harness.ts';

interface Status {
  replicas: { id: string; state: string; gpus: number[]; running: number }[];
}

const HANG_MS = 4000;

/** A counter's value in a Prometheus page (summed over the series whose labels contain `labels`). */
function counter(text: string, name: string, labels: string): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) || !line.includes(labels)) continue;
    sum += Number(line.split(' ').at(-1));
  }
  return sum;
}

/** The text a server streams for a /v1/completions body. */
async function streamedText(port: number, body: object): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', ...body, stream: true }),
  });
  let text = '';
  for (const e of (await res.text()).split('\n\n')) {
    if (!e.startsWith('data: {')) continue;
    text += (JSON.parse(e.slice(6)) as { choices: { text?: string }[] }).choices[0]?.text ?? '';
  }
  return text;
}

describe('engine openai: replicas whose engine is a separate model server', () => {
  let s: Served;
  // The front's own worker: the first one it started (an upstream's log quoted in a failure names its own workers).
  const ups = (): UpstreamProc[] => upstreamsOf(s.workerPids()[0]!);
  const status = async (): Promise<Status> => (await s.get('/admin/status', s.adminToken)).body as Status;
  const twoReady = async (): Promise<void> => {
    try {
      await until(
        'both replicas ready with their servers',
        async () => (await status()).replicas.every((r) => r.state.startsWith('ready')) && ups().length === 2,
        120_000,
      );
    } catch (e) {
      const st = JSON.stringify((await status()).replicas);
      throw new Error(
        `${(e as Error).message}: ${st}; servers ${JSON.stringify(ups())}\n${s.lines.slice(-40).join('\n')}`,
      );
    }
  };

  beforeAll(async () => {
    const file = await tinyModel();
    const up = upstreamConfig(file);
    const config = writeConfig(`
name: e2e-upstream
node: { gpu: H100-SXM, gpus: 8 }
placement: { policy: exclusive }
# The worker loads the model's vocabulary (node-llama-cpp) while the replica loads: on this busy 2-core machine the
# default 3 x 500 ms heartbeat bound is too tight for it.
detection: { heartbeatMs: 1000, missedHeartbeats: 5 }
models:${openaiModel({ name: 'tiny', file, upstreamFile: up, replicas: 2, hangMs: HANG_MS })}
`);
    s = await serve(['--config', config], UPSTREAM_ENV);
    await s.waitReady('tiny', true, 120_000);
    await twoReady();
  }, 180_000);
  afterAll(async () => {
    const left = s ? ups() : [];
    await s?.stop();
    for (const u of left) {
      try {
        process.kill(-u.pid, 'SIGKILL');
      } catch {
        // gone with its worker
      }
    }
  });

  it('starts one server per replica on exactly its GPUs', async () => {
    const st = await status();
    const gpus = st.replicas.map((r) => r.gpus.join(',')).sort();
    expect(
      ups()
        .map((u) => u.gpus)
        .sort(),
    ).toEqual(gpus);
  });

  it('streams the server’s own text to the official openai client, as the server gives it directly', async () => {
    const prompt = 'The switchyard';
    const [u] = ups();
    const direct = (await (
      await fetch(`http://127.0.0.1:${u!.port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', prompt, max_tokens: 24, temperature: 0 }),
      })
    ).json()) as { choices: { text: string }[]; usage: { completion_tokens: number; prompt_tokens: number } };
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const stream = await openai.completions.create({
      model: 'tiny',
      prompt,
      max_tokens: 24,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let chunks = 0;
    let usage: { completion_tokens: number; prompt_tokens: number } | undefined;
    let finish: string | null | undefined;
    for await (const c of stream) {
      if (c.choices[0]) {
        text += c.choices[0].text;
        finish = c.choices[0].finish_reason ?? finish;
        chunks++;
      }
      if (c.usage) usage = c.usage;
    }
    expect(text).toBe(direct.choices[0]!.text);
    expect(chunks).toBeGreaterThan(1);
    expect(finish).toBe('length');
    expect(usage?.completion_tokens).toBe(24);
    expect(usage?.prompt_tokens).toBe(direct.usage.prompt_tokens);
  }, 60_000);

  it('passes sampling through: a seed repeats the text, a stop string ends it', async () => {
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const ask = async (extra: object): Promise<string> => {
      const r = await openai.completions.create({ model: 'tiny', prompt: 'seeded', max_tokens: 16, ...extra });
      return r.choices[0]!.text;
    };
    const a = await ask({ temperature: 1, seed: 7 });
    expect(await ask({ temperature: 1, seed: 7 })).toBe(a);
    // A stop string ends the text where the server itself ends it.
    const greedy = await ask({ temperature: 0 });
    const stop = greedy.slice(4, 6);
    const [u] = ups();
    const direct = await streamedText(u!.port, { prompt: 'seeded', max_tokens: 16, temperature: 0, stop: [stop] });
    const stopped = await ask({ temperature: 0, stop: [stop] });
    expect(stopped).toBe(direct);
    expect(stopped.length).toBeLessThan(greedy.length);
  }, 60_000);

  it('ends the upstream’s request when the client cancels its stream', async () => {
    const before = await Promise.all(
      ups().map(async (u) =>
        counter(
          await (await fetch(`http://127.0.0.1:${u.port}/metrics`)).text(),
          'switchyard_requests_total',
          'outcome="cancelled"',
        ),
      ),
    );
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback' });
    const stream = await openai.completions.create({
      model: 'tiny',
      prompt: 'cancel me',
      max_tokens: 400,
      stream: true,
    });
    let n = 0;
    for await (const _ of stream) if (++n >= 3) break; // leaving the loop aborts the HTTP request
    await until(
      'an upstream counts a cancelled request',
      async () => {
        const now = await Promise.all(
          ups().map(async (u) =>
            counter(
              await (await fetch(`http://127.0.0.1:${u.port}/metrics`)).text(),
              'switchyard_requests_total',
              'outcome="cancelled"',
            ),
          ),
        );
        return now.some((v, i) => v > before[i]!);
      },
      15_000,
    );
    // Nothing runs at the upstreams any more.
    await until(
      'the upstreams idle',
      async () => {
        const texts = await Promise.all(
          ups().map(async (u) => (await fetch(`http://127.0.0.1:${u.port}/metrics`)).text()),
        );
        return texts.every((t) => /^switchyard_num_requests_running 0$/m.test(t));
      },
      15_000,
    );
  }, 60_000);

  it('fails only the killed upstream’s replica: each of its requests resumes or ends typed once, the other serves on', async () => {
    const [victim, other] = ups();
    const failedBefore = s.lines.filter((l) => /^replica\.tiny@\S+ failed: /.test(l)).length;
    const c = await connectClient(s.wsUrl);
    const streams = Array.from({ length: 6 }, (_, i) =>
      c.stream({ model: 'tiny', prompt: `kill ${i}`, maxTokens: 200 }),
    );
    await Promise.all(streams.map((st) => st[Symbol.asyncIterator]().next()));
    process.kill(victim!.pid, 'SIGKILL');
    const results = await Promise.all(streams.map((st) => st.result));
    c.close();
    for (const r of results) {
      if (!r.ok) expect(['replica_failed', 'model_unavailable']).toContain(r.error.code);
      else expect(r.usage.completionTokens).toBe(200);
    }
    expect(results.filter((r) => r.ok).length).toBeGreaterThan(0);
    expect(alive(other!.pid)).toBe(true);
    const failed = s.lines.filter((l) => /^replica\.tiny@\S+ failed: /.test(l));
    const relevant = s.lines.join('\n');
    expect(failed.length - failedBefore, relevant).toBe(1);
    expect(
      s.lines.some((l) => /upstream replica\.tiny@\S+: failed: its server exited \(SIGKILL\)/.test(l)),
      relevant,
    ).toBe(true);
    // Placement replaces the failed replica: a new server on the reset GPU.
    await twoReady();
    expect(ups().some((u) => u.pid === victim!.pid)).toBe(false);
  }, 180_000);

  it('finds a SIGSTOPped upstream hung within its bound and fails only its replica', async () => {
    await twoReady();
    const [victim] = ups();
    const openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused-on-loopback', maxRetries: 0 });
    const failedBefore = s.lines.filter((l) => /^replica\.tiny@\S+ failed: /.test(l)).length;
    // Streams on both replicas (routing spreads them); the victim stops mid-stream.
    const streams = await Promise.all(
      Array.from({ length: 4 }, (_, i) =>
        openai.completions.create({ model: 'tiny', prompt: `hang ${i}`, max_tokens: 300, stream: true }),
      ),
    );
    const done = streams.map(async (st) => {
      let text = '';
      for await (const c of st) text += c.choices[0]?.text ?? '';
      return text;
    });
    await new Promise((r) => setTimeout(r, 300));
    process.kill(victim!.pid, 'SIGSTOP');
    const stoppedAt = performance.now();
    try {
      await until(
        'the hung replica failed',
        () => s.lines.filter((l) => /^replica\.tiny@\S+ failed: /.test(l)).length > failedBefore,
        HANG_MS + 15_000,
      );
    } finally {
      try {
        process.kill(victim!.pid, 'SIGCONT');
      } catch {
        // killed by the worker already
      }
    }
    const tookMs = performance.now() - stoppedAt;
    const why = s.lines.filter((l) => /upstream replica\.tiny@\S+: failed: /.test(l)).at(-1);
    expect(why, s.lines.filter((l) => /upstream|failed/.test(l)).join('\n')).toMatch(
      /made no progress|errors in a row/,
    );
    // The bound, plus a tick, a report and the control plane's handling.
    expect(tookMs).toBeLessThan(HANG_MS + 3_000);
    const settled = await Promise.allSettled(done);
    expect(settled.filter((r) => r.status === 'fulfilled').length).toBeGreaterThan(0);
    await until('the hung server is gone', () => !alive(victim!.pid), 10_000);
    await twoReady();
  }, 180_000);
});
