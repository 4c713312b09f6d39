// Tests of engine hosts as real child processes: life states, sequences served by the host's engine core, kill -9,
// SIGSTOP, drain, unload, bad hosts and bad commands.
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineError, type Engine } from '../../../actors/engine/engine.ts';
import { spawnEngineHost, type EngineHost, type HostStateChanged } from '../../../actors/engine/host-client.ts';
import type { HostCoreSpec } from '../../../actors/engine/host-protocol.ts';
import { loadLlamaEngine } from '../../../actors/engine/llama-engine.ts';
import type { CoreReport, SubmitSeq } from '../../../machines/core-messages.ts';
import { tinyModelFixture } from './fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
const hosts: EngineHost[] = [];
const load = { contextTokens: 128, sequences: 2, threads: 1 };
const FAKE_HOST = fileURLToPath(new URL('./fake-host.ts', import.meta.url));
const coreSpec = (replica: string): HostCoreSpec => ({
  replica,
  epoch: 1,
  owner: 'tiny@1',
  limits: {
    policy: 'chunked',
    maxRunning: 2,
    tokenBudget: 128,
    blockTokens: 16,
    blocksTotal: 16,
    maxContext: 128,
    watermarkBlocks: 0,
  },
  check: true,
});

/** What a host's core said of each sequence: token ids, text and finish. */
type Got = Map<string, { tokens: number[]; text: string; finish?: string }>;

const spawn = (id: string, file: string, extra: Partial<Parameters<typeof spawnEngineHost>[0]> = {}) => {
  const events: HostStateChanged[] = [];
  const reports: CoreReport[] = [];
  const got: Got = new Map();
  const host = spawnEngineHost({
    id,
    file,
    gpus: [],
    load,
    core: coreSpec(id),
    report: (r) => {
      reports.push(r);
      for (const e of r.events) {
        if (e.k !== 't' && e.k !== 'f') continue;
        const g = got.get(e.id) ?? { tokens: [], text: '' };
        got.set(e.id, g);
        if (e.k === 't') {
          g.tokens.push(...(e.ids ?? []));
          g.text += e.text ?? '';
        } else g.finish = e.reason;
      }
    },
    ...extra,
  });
  host.subscribe((e) => events.push(e));
  hosts.push(host);
  return { host, events, reports, got };
};

const seqOf = (id: string, prompt: number[], maxTokens: number): SubmitSeq => ({
  id,
  priority: 0,
  order: 0,
  promptTokens: prompt.length,
  outputTokens: maxTokens,
  maxTokens,
  estOutputTokens: maxTokens,
  generated: 0,
  prompt,
  sampling: {},
});

/** Waits until the host reaches `state` (polling its state every few ms, bounded). */
const reach = async (host: EngineHost, state: string, withinMs = 15_000): Promise<void> => {
  const { setTimeout: sleep } = await import('node:timers/promises');
  for (let waited = 0; host.state !== state; waited += 20) {
    if (waited > withinMs) throw new Error(`host ${host.id} is ${host.state}, not ${state}`);
    await sleep(20);
  }
};

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** The engine's own greedy generation of n tokens after `prompt`, in this process. */
async function engineGreedy(engine: Engine, prompt: readonly number[], n: number) {
  const tokens: number[] = [];
  let text = '';
  let finish: string | undefined;
  let r = await engine.step({ items: [{ seq: 'ref', kind: 'prefill', tokens: prompt, sample: true }] });
  for (;;) {
    const t = r.sampled[0]!;
    tokens.push(t.token);
    text += t.text;
    finish = t.finish ?? (tokens.length === n ? 'length' : undefined);
    if (finish) break;
    r = await engine.step({ items: [{ seq: 'ref', kind: 'decode', last: tokens.length + 1 === n }] });
  }
  await engine.free('ref');
  return { tokens, text, finish };
}

let a: ReturnType<typeof spawn>;
let b: ReturnType<typeof spawn>;
let c: ReturnType<typeof spawn>;
let d: ReturnType<typeof spawn>;

beforeAll(async () => {
  fixture = await tinyModelFixture();
  a = spawn('replica.tiny@1#0', fixture.file);
  b = spawn('replica.tiny@1#1', fixture.file);
  c = spawn('replica.tiny@1#2', fixture.file);
  d = spawn('replica.tiny@1#3', fixture.file, { progressTimeoutMs: 1_500 });
  await Promise.all([a, b, c, d].map((h) => h.host.ready()));
}, 120_000);
afterAll(async () => {
  for (const h of hosts) h.kill();
  await fixture?.cleanup();
});

describe('engine host', () => {
  describe('life', () => {
    it('goes from loading to ready once loaded, its core open and a health probe answered', async () => {
      expect(a.host.state).toBe('ready');
      expect(a.events.map((e) => `${e.from}->${e.to}`)).toEqual(['loading->ready']);
      // llama.cpp rounds each sequence's block up (to 256 cells here) and keeps one cell free.
      const cap = a.host.capacity()!;
      expect(cap.cellsPerSequence).toBeGreaterThanOrEqual(127);
      expect(cap.totalCells).toBe(2 * (cap.cellsPerSequence + 1));
      expect((await a.host.probe()).freeSequences).toBe(2);
      expect(a.host.stats()).toEqual({ steps: 0, busyMs: 0, idleMs: 0, idleGaps: 0 });
      expect(a.host.pid).not.toBe(b.host.pid);
    });

    it("serves submitted sequences through its core with the engine's own greedy tokens and text", async () => {
      const prompt = await a.host.tokenize('hello the world');
      const engine = await loadLlamaEngine(fixture.file, load);
      const want = await engineGreedy(engine, prompt, 20).finally(() => engine.unload());
      a.host.submit([seqOf('s', prompt, 20)]);
      await expect.poll(() => a.got.get('s')?.finish, { timeout: 30_000 }).toBeDefined();
      expect(a.got.get('s')).toEqual(want);
      // One report per step, each with the load; the host's measurements ride along.
      expect(a.reports.at(-1)!.load).toMatchObject({ waiting: 0, running: 0, received: 1 });
      expect(a.host.stats()!.steps).toBeGreaterThanOrEqual(want.tokens.length);
      expect(a.host.stats()!.idleGaps).toBe(a.host.stats()!.steps - 1);
      expect((await a.host.probe()).freeSequences).toBe(2);
    });

    it('frees a cancelled sequence and counts what it held', async () => {
      a.host.submit([seqOf('long', await a.host.tokenize('a long one'), 100)]);
      await expect.poll(() => a.got.get('long')?.tokens.length ?? 0, { timeout: 30_000 }).toBeGreaterThan(1);
      expect(a.host.cancel(['long', 'unknown'])).toBe(1);
      await expect.poll(async () => (await a.host.probe()).used.long, { timeout: 10_000 }).toBeUndefined();
      expect((await a.host.probe()).freeSequences).toBe(2);
      expect(a.host.cancelAll()).toBe(0);
      expect(a.host.state).toBe('ready');
    });

    it('fails on a submit it cannot read, naming the field (the worker cannot account for those sequences)', async () => {
      const bad = { ...seqOf('bad', [1, 2, 3], 4), promptTokens: 4 };
      a.host.submit([bad]);
      await reach(a.host, 'failed');
      expect(a.events.at(-1)?.failure).toMatchObject({ code: 'invalid_request', retryable: false });
      expect(a.events.at(-1)?.failure?.message).toMatch(/command\.seqs\[0\]\.prompt does not hold its 4 tokens/);
    });
  });

  describe('failure', () => {
    it('fails only the host killed with kill -9 while it holds sequences, and the other keeps serving', async () => {
      c.host.submit([seqOf('k', await c.host.tokenize('to be killed'), 100)]);
      await expect.poll(() => c.got.get('k')?.tokens.length ?? 0, { timeout: 30_000 }).toBeGreaterThan(0);
      process.kill(c.host.pid!, 'SIGKILL');
      await reach(c.host, 'failed');
      expect(c.events.at(-1)?.failure?.message).toMatch(/SIGKILL/);
      expect(c.events.at(-1)?.failure?.code).toBe('engine_failed');
      await expect(c.host.probe()).rejects.toBeInstanceOf(EngineError);
      b.host.submit([seqOf('x', await b.host.tokenize('still here'), 3)]);
      await expect.poll(() => b.got.get('x')?.finish, { timeout: 30_000 }).toBe('length');
      expect(b.host.state).toBe('ready');
    });

    it('fails and kills a host stopped (SIGSTOP) while it holds sequences, within its progress bound', async () => {
      d.host.submit([seqOf('h', await d.host.tokenize('to be stopped'), 100)]);
      await expect.poll(() => d.got.get('h')?.tokens.length ?? 0, { timeout: 30_000 }).toBeGreaterThan(0);
      const pid = d.host.pid!;
      process.kill(pid, 'SIGSTOP');
      await reach(d.host, 'failed', 5_000);
      expect(d.events.at(-1)?.failure?.message).toMatch(/no progress within 1500 ms while holding 1 sequences/);
      await expect.poll(() => isAlive(pid)).toBe(false);
    });

    it('lets a profiled host exit by itself when killed, so that it writes its CPU profile', async () => {
      const dir = await mkdtemp(join(tmpdir(), 'switchyard-host-prof-'));
      const before = process.env['SWITCHYARD_CPU_PROF_DIR'];
      process.env['SWITCHYARD_CPU_PROF_DIR'] = dir;
      let p: ReturnType<typeof spawn>;
      try {
        p = spawn('replica.prof#0', fixture.file);
      } finally {
        if (before === undefined) delete process.env['SWITCHYARD_CPU_PROF_DIR'];
        else process.env['SWITCHYARD_CPU_PROF_DIR'] = before;
      }
      try {
        await p.host.ready();
        const pid = p.host.pid!;
        p.host.kill();
        await reach(p.host, 'failed');
        // SIGTERM, then an exit through the host's own handler: a SIGKILL, or SIGTERM's default action, writes nothing.
        expect(p.events.at(-1)?.failure?.message).toMatch(/process exited/);
        // The main thread's profile (thread 0; the loader's thread writes one of its own when it ends).
        expect((await readdir(dir)).filter((f) => f.includes(`.${pid}.0.`) && f.endsWith('.cpuprofile'))).toHaveLength(
          1,
        );
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }, 60_000);

    it('gives the child exactly the replica GPUs for CUDA, Vulkan and HIP, whatever the worker had', async () => {
      process.env.GGML_VK_VISIBLE_DEVICES = '0,1,2,3,4,5,6,7';
      let probe: EngineHost;
      try {
        probe = spawnEngineHost({
          id: 'replica.env#0',
          file: 'unused',
          gpus: [3, 5],
          load,
          entry: FAKE_HOST,
          env: { FAKE_HOST: 'env' },
        });
      } finally {
        delete process.env.GGML_VK_VISIBLE_DEVICES;
      }
      hosts.push(probe);
      await expect(probe.ready()).rejects.toThrow(
        /CUDA_VISIBLE_DEVICES=3,5 GGML_VK_VISIBLE_DEVICES=3,5 HIP_VISIBLE_DEVICES=3,5/,
      );
    });

    it('starts the child without the worker token or any other secret of the worker', async () => {
      const secrets = { SWITCHYARD_WORKER_TOKEN: 'worker-secret-value', AWS_SECRET_ACCESS_KEY: 'cloud-secret-value' };
      Object.assign(process.env, secrets, { GGML_CUDA_NO_PINNED: '1' });
      let probe: EngineHost;
      try {
        probe = spawnEngineHost({
          id: 'replica.names#0',
          file: 'unused',
          gpus: [1],
          load,
          entry: FAKE_HOST,
          env: { FAKE_HOST: 'names' },
        });
      } finally {
        for (const k of [...Object.keys(secrets), 'GGML_CUDA_NO_PINNED']) delete process.env[k];
      }
      hosts.push(probe);
      // The fake host refuses to load, naming every variable it was started with.
      const names = await probe.ready().then(
        () => '',
        (e: Error) => e.message,
      );
      expect(names).toContain(' PATH ');
      expect(names).toContain(' GGML_CUDA_NO_PINNED ');
      expect(names).toContain(' CUDA_VISIBLE_DEVICES ');
      expect(names).not.toContain('SWITCHYARD_WORKER_TOKEN');
      expect(names).not.toContain('AWS_SECRET_ACCESS_KEY');
    });

    it('fails a host whose model file is invalid, naming the file', async () => {
      const bad = spawn('replica.bad#0', `${fixture.dir}/missing.gguf`);
      await expect(bad.host.ready()).rejects.toMatchObject({ code: 'invalid_model_file' });
      expect(bad.host.state).toBe('failed');
      expect(bad.events.at(-1)?.failure?.message).toContain('missing.gguf');
    });

    it("fails a host whose core's limits exceed its engine's cache", async () => {
      const big = coreSpec('replica.big#0');
      const wide = spawn('replica.big#0', fixture.file, { core: { ...big, limits: { ...big.limits, maxRunning: 3 } } });
      await expect(wide.host.ready()).rejects.toMatchObject({ code: 'invalid_request' });
      expect(wide.events.at(-1)?.failure?.message).toMatch(/core limits .* exceed the engine's cache \(2 x/);
    }, 60_000);

    it('fails and kills a host that reports nothing within the bound while it holds sequences', async () => {
      const silent = spawn('replica.silent#0', 'unused', {
        entry: FAKE_HOST,
        progressTimeoutMs: 300,
        env: { FAKE_HOST: 'silent' },
      });
      await silent.host.ready();
      silent.host.submit([seqOf('q', [1], 1)]);
      await reach(silent.host, 'failed');
      expect(silent.events.at(-1)?.failure?.message).toMatch(/no progress within 300 ms while holding 1 sequences/);
      const pid = silent.host.pid!;
      await expect.poll(() => isAlive(pid)).toBe(false);
    });

    it('fails a host that sends a message outside the protocol', async () => {
      const rogue = spawn('replica.rogue#0', 'unused', { entry: FAKE_HOST, env: { FAKE_HOST: 'rogue' } });
      await rogue.host.ready();
      rogue.host.submit([seqOf('q', [1], 1)]);
      await reach(rogue.host, 'failed');
      expect(rogue.events.at(-1)?.failure?.message).toMatch(/invalid report: malformed: truncated/);
    });
  });

  describe('drain and unload', () => {
    it('refuses new sequences while draining but lets submitted ones finish', async () => {
      b.host.submit([seqOf('y', await b.host.tokenize('one more'), 12)]);
      b.host.drain();
      expect(b.host.state).toBe('draining');
      expect(() => b.host.submit([seqOf('z', [1, 2], 2)])).toThrow(EngineError);
      await expect.poll(() => b.got.get('y')?.finish, { timeout: 30_000 }).toBeDefined();
      expect(b.got.has('z')).toBe(false);
      expect((await b.host.probe()).freeSequences).toBe(2);
    });

    it('unloads: the process exits and the host is stopped', async () => {
      const pid = b.host.pid!;
      await b.host.unload();
      expect(b.host.state).toBe('stopped');
      expect(b.events.map((e) => e.to)).toEqual(['ready', 'draining', 'stopped']);
      expect(isAlive(pid)).toBe(false);
    });
  });
});
