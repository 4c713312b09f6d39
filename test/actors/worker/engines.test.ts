// The worker's engine manager with an in-memory host: one host per replica over all its GPUs with the replica's core,
// submits and cancels to the host of the right epoch, reports passed on, and intended kills told apart from failures.
import { describe, expect, it } from 'vitest';
import type { EngineHost, EngineHostOptions, HostState, HostStateChanged } from '../../../actors/engine/host-client.ts';
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EngineFailure } from '../../../actors/engine/engine.ts';
import { createEngineManager } from '../../../actors/worker/engines.ts';
import { tinyModelFixture } from '../engine/fixtures.ts';
import type { CoreReport, SubmitSeq } from '../../../machines/core-messages.ts';
import type { MessageOf, WireCoreSpec } from '../../../machines/messages.ts';

interface Fake extends EngineHost {
  opts: EngineHostOptions;
  submitted: SubmitSeq[];
  cancelled: string[];
  killed: boolean;
  become(to: HostState): void;
}

function fakeHost(opts: EngineHostOptions): Fake {
  let state: HostState = 'loading';
  const listeners = new Set<(e: HostStateChanged) => void>();
  const held = new Set<string>();
  const capacity = {
    sequences: 4,
    cellsPerSequence: 255,
    totalCells: 1024,
    batchTokens: 256,
    freeSequences: 4,
    used: {},
  };
  const cancel = (ids: readonly string[]): number => {
    host.cancelled.push(...ids);
    return ids.filter((id) => held.delete(id)).length;
  };
  const host: Fake = {
    opts,
    submitted: [],
    cancelled: [],
    killed: false,
    id: opts.id,
    pid: 4242,
    get state() {
      return state;
    },
    become(to) {
      const from = state;
      state = to;
      for (const l of listeners) l({ type: 'host.state_changed', host: opts.id, from, to });
    },
    capacity: () => capacity,
    stats: () => ({ steps: 1, busyMs: 2, idleMs: 0, idleGaps: 0 }),
    subscribe: (l) => (listeners.add(l), () => listeners.delete(l)),
    ready: () => Promise.resolve(),
    tokenize: async () => [],
    submit: (seqs) => {
      if (state !== 'ready') throw new Error(`host is ${state}`);
      host.submitted.push(...seqs);
      for (const s of seqs) held.add(s.id);
    },
    cancel,
    cancelAll: () => cancel([...held]),
    probe: async () => capacity,
    drain: () => undefined,
    unload: async () => host.become('stopped'),
    kill: () => {
      host.killed = true;
      host.become('failed');
    },
  };
  return host;
}

// The worker opens model files only under its model roots: the tests' model lives in one.
const ROOT = mkdtempSync(join(tmpdir(), 'switchyard-roots-'));
const MODELS = join(ROOT, 'models');
mkdirSync(MODELS);
writeFileSync(join(MODELS, 'm.gguf'), 'GGUF');
const engine = {
  kind: 'llama.cpp' as const,
  file: join(MODELS, 'm.gguf'),
  contextTokens: 256,
  sequences: 4,
  threads: 1,
};
const core = (gpus: number[]): WireCoreSpec => ({
  gpus,
  owner: 'tiny@1',
  limits: {
    policy: 'chunked',
    maxRunning: 4,
    tokenBudget: 256,
    blockTokens: 16,
    blocksTotal: 64,
    maxContext: 255,
    watermarkBlocks: 0,
  },
});
const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);
const assign = (gpu: number, tp: number, epoch = 1): MessageOf<'gpu.assign'> & { engine: typeof engine } => ({
  type: 'gpu.assign',
  gpu,
  replica: 'r',
  epoch,
  model: 'llama-3-70b',
  gpuType: 'H100-SXM',
  tp,
  loadMs: 1,
  unloadMs: 1,
  engine,
  core: core(range(tp)),
});
const seqOf = (id: string): SubmitSeq => ({
  id,
  priority: 0,
  order: 0,
  promptTokens: 2,
  outputTokens: 4,
  maxTokens: 4,
  estOutputTokens: 4,
  generated: 0,
  prompt: [1, 2],
});

function setup(modelRoots: readonly string[] = [MODELS]) {
  const hosts: Fake[] = [];
  const events: string[] = [];
  const failures: (EngineFailure | undefined)[] = [];
  const progress: string[] = [];
  const m = createEngineManager({
    spawn: (o) => {
      const h = fakeHost(o);
      hosts.push(h);
      return h;
    },
    modelRoots,
    ready: (r, e, g) => events.push(`ready ${r}@${e} ${g.join(',')}`),
    failed: (r, e, g, f) => {
      events.push(`failed ${r}@${e} ${g.join(',')}`);
      failures.push(f);
    },
    progress: (r, e, report) => progress.push(`${r}@${e} ${report.events.length}`),
  });
  return { m, hosts, events, failures, progress };
}

describe('the worker engine manager', () => {
  it('starts one host for a tensor-parallel replica once all eight ranks are assigned, over all its GPUs', () => {
    const { m, hosts } = setup();
    for (const g of [7, 3, 0, 1, 2, 4, 5]) m.assign(assign(g, 8));
    expect(hosts).toHaveLength(0);
    m.assign(assign(6, 8));
    m.assign(assign(6, 8));
    expect(hosts).toHaveLength(1);
    expect(hosts[0]!.opts.gpus).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(m.owns('r', 1)).toBe(true);
  });

  it("gives the host the assignment's core and hands on its reports as the replica's progress", () => {
    const { m, hosts, progress } = setup();
    for (let g = 0; g < 2; g++) m.assign(assign(g, 2));
    expect(hosts[0]!.opts.core).toEqual({ replica: 'r', epoch: 1, owner: 'tiny@1', limits: core([0, 1]).limits });
    const report: CoreReport = { at: 1, start: 0, events: [{ k: 's', id: 'a' }], load: {} as CoreReport['load'] };
    hosts[0]!.opts.report!(report);
    expect(progress).toEqual(['r@1 1']);
    expect(m.stats('r')).toMatchObject({ steps: 1, busyMs: 2 });
  });

  it('submits to and cancels on the host of the epoch named, and drops what names another', () => {
    const { m, hosts } = setup();
    m.assign(assign(0, 1));
    m.submit('r', 1, [seqOf('a')]);
    hosts[0]!.become('ready');
    m.submit('r', 1, [seqOf('a'), seqOf('b')]);
    m.submit('r', 2, [seqOf('c')]);
    m.cancel('r', 2, ['a']);
    m.cancel('r', 1, ['b']);
    expect(hosts[0]!.submitted.map((s) => s.id)).toEqual(['a', 'b']);
    expect(hosts[0]!.cancelled).toEqual(['b']);
    expect(m.cancelAll()).toBe(1);
    expect(hosts[0]!.cancelled).toEqual(['b', 'a']);
    expect(hosts[0]!.killed).toBe(false);
  });

  it.each([
    ['without its core', { core: undefined }, /without its core/],
    [
      'with a dynamic-batching core',
      { core: { ...core([0]), stateless: {} as WireCoreSpec['stateless'] } },
      /generative/,
    ],
    ['with a core on other GPUs', { core: core([1]) }, /names GPUs 1, assigned 0/],
  ])('refuses a llama.cpp replica assigned %s: no host starts, the load fails', (_what, patch, message) => {
    const { m, hosts, events, failures } = setup();
    m.assign({ ...assign(0, 1), ...patch });
    expect(hosts).toHaveLength(0);
    expect(events).toEqual(['failed r@1 0']);
    expect(failures[0]).toMatchObject({ code: 'invalid_request', retryable: false });
    expect(failures[0]!.message).toMatch(message);
  });

  it('kills the host on a fault of any of its GPUs without reporting a failure; a host that dies by itself is', () => {
    const { m, hosts, events } = setup();
    for (let g = 0; g < 8; g++) m.assign(assign(g, 8));
    m.gpuFault(5);
    expect(hosts[0]!.killed).toBe(true);
    expect(events.filter((e) => e.startsWith('failed'))).toEqual([]);
    for (let g = 0; g < 8; g++) m.assign(assign(g, 8, 2));
    hosts[1]!.become('failed');
    expect(events).toContain('failed r@2 0,1,2,3,4,5,6,7');
    expect(m.owns('r')).toBe(false);
  });
});

describe('the worker engine manager, model files', () => {
  describe('opens model files only under its model roots', () => {
    const outside = join(ROOT, 'elsewhere.gguf');
    writeFileSync(outside, 'GGUF');
    symlinkSync(outside, join(MODELS, 'link.gguf'));
    const named = (file: string): ReturnType<typeof assign> => ({ ...assign(0, 1), engine: { ...engine, file } });

    it.each([
      ['a file outside every root', outside],
      ['a path that climbs out of a root', join(MODELS, '..', 'elsewhere.gguf')],
      ['a symlink inside a root to a file outside', join(MODELS, 'link.gguf')],
      ['a relative path', 'models/m.gguf'],
      ['a file that does not exist', join(MODELS, 'missing.gguf')],
    ])('refuses %s: no host starts, and the load fails with invalid_model_file', (_what, file) => {
      const { m, hosts, events, failures } = setup();
      m.assign(named(file));
      expect(hosts).toHaveLength(0);
      expect(events).toEqual(['failed r@1 0']);
      expect(failures[0]).toMatchObject({ code: 'invalid_model_file', retryable: false });
      expect(failures[0]!.message).toContain(file);
      expect(m.owns('r')).toBe(false);
    });

    it('starts a host for a file under a root, and refuses every file when the roots do not exist', () => {
      const ok = setup();
      ok.m.assign(named(engine.file));
      expect(ok.hosts).toHaveLength(1);
      const none = setup([join(ROOT, 'no-such-root')]);
      none.m.assign(named(engine.file));
      expect(none.hosts).toHaveLength(0);
      expect(none.failures[0]?.message).toMatch(/outside the worker's model roots/);
    });
  });
});

describe('the worker engine manager over a real host', () => {
  it('serves a submitted sequence through the host it spawned, and cancels every sequence of every host', async () => {
    const fixture = await tinyModelFixture();
    const progress: CoreReport[] = [];
    const ready: string[] = [];
    const m = createEngineManager({
      modelRoots: [fixture.dir],
      ready: (r, e) => ready.push(`${r}@${e}`),
      failed: (r, e, _g, f) => ready.push(`failed ${r}@${e}: ${f?.message}`),
      progress: (_r, _e, report) => progress.push(report),
    });
    try {
      m.assign({
        ...assign(0, 1),
        engine: { ...engine, file: fixture.file, contextTokens: 256, sequences: 4 },
      });
      await expect.poll(() => ready, { timeout: 60_000 }).toEqual(['r@1']);
      const events = () => progress.flatMap((r) => r.events);
      m.submit('r', 1, [{ ...seqOf('a'), prompt: [104, 105], outputTokens: 3, maxTokens: 3, estOutputTokens: 3 }]);
      await expect.poll(() => events().some((e) => e.k === 'f' && e.id === 'a'), { timeout: 30_000 }).toBe(true);
      expect(events().filter((e) => e.k === 't' && e.id === 'a')).toHaveLength(3);
      m.submit('r', 1, [{ ...seqOf('b'), outputTokens: 200, maxTokens: 200, estOutputTokens: 200 }]);
      expect(m.cancelAll()).toBe(1);
      expect(m.stats('r')?.steps).toBeGreaterThanOrEqual(3);
    } finally {
      m.stopAll();
      await fixture.cleanup();
    }
  }, 90_000);
});
