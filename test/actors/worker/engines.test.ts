// The worker's engine manager with an in-memory host: one host per replica over all its GPUs, steps over the
// sequences' tokens, finishes by max tokens with the held text, and intended kills told apart from failures.
import { describe, expect, it } from 'vitest';
import type { EngineHost, EngineHostOptions, HostState, HostStateChanged } from '../../../actors/engine/host-client.ts';
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EngineFailure, StepPlan } from '../../../actors/engine/engine.ts';
import { createEngineManager } from '../../../actors/worker/engines.ts';
import type { MessageOf } from '../../../machines/messages.ts';

interface Fake extends EngineHost {
  opts: EngineHostOptions;
  plans: StepPlan[];
  freed: string[];
  killed: boolean;
  become(to: HostState): void;
}

function fakeHost(opts: EngineHostOptions): Fake {
  let state: HostState = 'loading';
  const listeners = new Set<(e: HostStateChanged) => void>();
  const capacity = {
    sequences: 4,
    cellsPerSequence: 255,
    totalCells: 1024,
    batchTokens: 256,
    freeSequences: 4,
    used: {},
  };
  const host: Fake = {
    opts,
    plans: [],
    freed: [],
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
    subscribe: (l) => (listeners.add(l), () => listeners.delete(l)),
    ready: () => Promise.resolve(),
    tokenize: async () => [],
    step: async (plan) => {
      host.plans.push(plan);
      // An item marked last is freed by the step, its held text ('!') appended, as the real engine does.
      for (const i of plan.items) if (i.last) host.freed.push(i.seq);
      return {
        sampled: plan.items.map((i) => ({ seq: i.seq, token: 65, text: i.last ? 'A!' : 'A' })),
        ms: 1,
        tokens: 1,
        dispatches: 1,
      };
    },
    free: async (seq) => {
      host.freed.push(seq);
      return { text: '!' };
    },
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
});

function setup(modelRoots: readonly string[] = [MODELS]) {
  const hosts: Fake[] = [];
  const events: string[] = [];
  const failures: (EngineFailure | undefined)[] = [];
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
  });
  return { m, hosts, events, failures };
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

  it('runs steps over the opened tokens and ends a sequence at its max tokens with the held text, freed in the step', async () => {
    const { m, hosts } = setup();
    m.assign(assign(0, 1));
    const done: unknown[] = [];
    const base = { type: 'step.execute' as const, replica: 'r', epoch: 1, gpus: [0] };
    const shape = { prefill: [], decodeBatch: 0, decodeContext: 0 };
    m.step(
      {
        ...base,
        step: 1,
        shape,
        open: [{ seq: 's', tokens: [1, 2, 3], left: 2 }],
        items: [{ seq: 's', from: 1, n: 2, sample: true }],
      },
      (r) => done.push(r),
    );
    m.step({ ...base, step: 2, shape, items: [{ seq: 's', from: 3, n: 0, sample: true }] }, (r) => done.push(r));
    await new Promise((r) => setTimeout(r, 10));
    expect(hosts[0]!.plans[0]!.items[0]).toMatchObject({ seq: 's', kind: 'prefill', tokens: [2, 3], sample: true });
    expect(hosts[0]!.plans[1]!.items[0]).toEqual({ seq: 's', kind: 'decode', last: true });
    expect(done[0]).toMatchObject({ sampled: [{ seq: 's', token: 65, text: 'A' }], cache: { sequences: 4 } });
    expect(done[1]).toMatchObject({ sampled: [{ seq: 's', text: 'A!', finish: 'length' }] });
    expect(hosts[0]!.freed).toEqual(['s']);
  });

  it('hands a recomputed sequence its generated tokens to replay on its first prefill only', async () => {
    const { m, hosts } = setup();
    m.assign(assign(0, 1));
    const base = { type: 'step.execute' as const, replica: 'r', epoch: 1, gpus: [0] };
    const shape = { prefill: [], decodeBatch: 0, decodeContext: 0 };
    const open = [{ seq: 's', tokens: [1, 2, 3, 70, 71], left: 4, stop: ['xy'], generated: 2 }];
    m.step({ ...base, step: 1, shape, open, items: [{ seq: 's', from: 0, n: 3, sample: false }] }, () => undefined);
    m.step({ ...base, step: 2, shape, items: [{ seq: 's', from: 3, n: 2, sample: true }] }, () => undefined);
    await new Promise((r) => setTimeout(r, 10));
    expect(hosts[0]!.plans[0]!.items[0]).toEqual({
      seq: 's',
      kind: 'prefill',
      tokens: [1, 2, 3],
      sample: false,
      sampling: { stop: ['xy'] },
      streamed: [70, 71],
    });
    expect(hosts[0]!.plans[1]!.items[0]).toEqual({ seq: 's', kind: 'prefill', tokens: [70, 71], sample: true });
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

describe('the worker engine manager, freeing', () => {
  it('frees a sequence only after the steps sent before the free, which still find its tokens', async () => {
    const { m, hosts } = setup();
    m.assign(assign(0, 1));
    const base = { type: 'step.execute' as const, replica: 'r', epoch: 1, gpus: [0] };
    const shape = { prefill: [], decodeBatch: 0, decodeContext: 0 };
    const open = [{ seq: 's', tokens: [1, 2], left: 9 }];
    const done: unknown[] = [];
    m.step({ ...base, step: 1, shape, open, items: [{ seq: 's', from: 0, n: 1, sample: false }] }, (r) => done.push(r));
    m.step({ ...base, step: 2, shape, items: [{ seq: 's', from: 1, n: 1, sample: true }] }, (r) => done.push(r));
    m.free('r', 1, ['s']);
    await new Promise((r) => setTimeout(r, 10));
    expect(done).toHaveLength(2);
    expect(hosts[0]!.killed).toBe(false);
    expect(hosts[0]!.freed).toEqual(['s']);
  });

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
