// Tests of engine hosts as real child processes: life states, steps over IPC, kill -9, drain, unload, bad hosts.
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineError } from '../../../actors/engine/engine.ts';
import { spawnEngineHost, type EngineHost, type HostStateChanged } from '../../../actors/engine/host-client.ts';
import { tinyModelFixture } from './fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
const hosts: EngineHost[] = [];
const load = { contextTokens: 128, sequences: 2, threads: 1 };
const FAKE_HOST = fileURLToPath(new URL('./fake-host.ts', import.meta.url));

const spawn = (id: string, file: string, extra: Partial<Parameters<typeof spawnEngineHost>[0]> = {}) => {
  const host = spawnEngineHost({ id, file, gpus: [], load, ...extra });
  const events: HostStateChanged[] = [];
  host.subscribe((e) => events.push(e));
  hosts.push(host);
  return { host, events };
};

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

let a: ReturnType<typeof spawn>;
let b: ReturnType<typeof spawn>;

beforeAll(async () => {
  fixture = await tinyModelFixture();
  a = spawn('replica.tiny@1#0', fixture.file);
  b = spawn('replica.tiny@1#1', fixture.file);
  await Promise.all([a.host.ready(), b.host.ready()]);
});
afterAll(async () => {
  for (const h of hosts) h.kill();
  await fixture?.cleanup();
});

describe('engine host', () => {
  describe('life', () => {
    it('goes from loading to ready once loaded and answering a health probe', async () => {
      expect(a.host.state).toBe('ready');
      expect(a.events.map((e) => `${e.from}->${e.to}`)).toEqual(['loading->ready']);
      // llama.cpp rounds each sequence's block up (to 256 cells here) and keeps one cell free.
      const cap = a.host.capacity()!;
      expect(cap.cellsPerSequence).toBeGreaterThanOrEqual(127);
      expect(cap.totalCells).toBe(2 * (cap.cellsPerSequence + 1));
      expect((await a.host.probe()).freeSequences).toBe(2);
      expect(a.host.pid).not.toBe(b.host.pid);
    });

    it('runs steps in the child and returns real tokens and text', async () => {
      const prompt = await a.host.tokenize('hello the world');
      expect(prompt.length).toBeGreaterThan(3);
      const first = await a.host.step({ items: [{ seq: 's', kind: 'prefill', tokens: prompt, sample: true }] });
      const next = await a.host.step({ items: [{ seq: 's', kind: 'decode' }] });
      expect(first.sampled[0]?.seq).toBe('s');
      expect(next.sampled).toHaveLength(1);
      expect(a.host.capacity()?.used.s).toBe(prompt.length + 1);
      await a.host.free('s');
      expect(a.host.capacity()?.used.s).toBeUndefined();
    });

    it('passes a typed invalid_request back from the engine and stays ready', async () => {
      const err = await a.host.step({ items: [{ seq: 'nope', kind: 'decode' }] }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(EngineError);
      expect((err as EngineError).code).toBe('invalid_request');
      expect(a.host.state).toBe('ready');
    });
  });

  describe('failure', () => {
    it('fails only the host that is killed with kill -9, and the other keeps serving', async () => {
      const pid = a.host.pid!;
      process.kill(pid, 'SIGKILL');
      await reach(a.host, 'failed');
      expect(a.events.at(-1)?.failure?.message).toMatch(/SIGKILL/);
      expect(a.events.at(-1)?.failure?.code).toBe('engine_failed');
      await expect(a.host.probe()).rejects.toBeInstanceOf(EngineError);
      const tokens = await b.host.tokenize('still here');
      const r = await b.host.step({ items: [{ seq: 'x', kind: 'prefill', tokens, sample: true }] });
      expect(r.sampled).toHaveLength(1);
      expect(b.host.state).toBe('ready');
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
    });

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

    it('fails and kills a host that makes no progress on a step within the bound', async () => {
      const silent = spawn('replica.silent#0', 'unused', {
        entry: FAKE_HOST,
        stepTimeoutMs: 300,
        env: { FAKE_HOST: 'silent' },
      });
      await silent.host.ready();
      const err = await silent.host
        .step({ items: [{ seq: 'q', kind: 'prefill', tokens: [1], sample: true }] })
        .catch((e: unknown) => e);
      expect((err as EngineError).code).toBe('engine_failed');
      expect(silent.events.at(-1)?.failure?.message).toMatch(/no progress within 300 ms/);
      await reach(silent.host, 'failed');
      const pid = silent.host.pid!;
      await expect.poll(() => isAlive(pid)).toBe(false);
    });

    it('fails a host that sends a message outside the protocol', async () => {
      const rogue = spawn('replica.rogue#0', 'unused', { entry: FAKE_HOST, env: { FAKE_HOST: 'rogue' } });
      await rogue.host.ready();
      await rogue.host
        .step({ items: [{ seq: 'q', kind: 'prefill', tokens: [1], sample: true }] })
        .catch(() => undefined);
      expect(rogue.host.state).toBe('failed');
      expect(rogue.events.at(-1)?.failure?.message).toMatch(/invalid message: .*sampled/);
    });
  });

  describe('drain and unload', () => {
    it('refuses new sequences while draining but lets running ones step and be freed', async () => {
      b.host.drain();
      expect(b.host.state).toBe('draining');
      const tokens = await b.host.tokenize('new one');
      const err = await b.host.step({ items: [{ seq: 'y', kind: 'prefill', tokens, sample: true }] }).catch((e) => e);
      expect((err as EngineError).code).toBe('invalid_request');
      const r = await b.host.step({ items: [{ seq: 'x', kind: 'decode' }] });
      expect(r.sampled[0]?.seq).toBe('x');
      await b.host.free('x');
      expect(b.host.capacity()?.freeSequences).toBe(2);
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
