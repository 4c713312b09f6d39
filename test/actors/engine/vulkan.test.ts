// The GPU offload path for real, without a GPU: node-llama-cpp's Vulkan build on Mesa's software Vulkan driver
// (llvmpipe, Debian's mesa-vulkan-drivers). An engine host given GPU 0 with `gpu: vulkan` offloads every layer to
// that device and samples the same greedy tokens as a CPU host. Where the driver is missing the test says so and
// skips, unless SWITCHYARD_REQUIRE_VULKAN=1 (as .ci/run sets it), where that is a failure.
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineError } from '../../../actors/engine/engine.ts';
import { spawnEngineHost, type EngineHost } from '../../../actors/engine/host-client.ts';
import type { HostCoreSpec } from '../../../actors/engine/host-protocol.ts';
import { tinyModelFixture } from './fixtures.ts';

/** Mesa's software rasteriser's Vulkan ICD, as Debian installs it. */
const LVP_ICD = '/usr/share/vulkan/icd.d/lvp_icd.x86_64.json';
const required = process.env.SWITCHYARD_REQUIRE_VULKAN === '1';
const present = existsSync(LVP_ICD);
if (!present && !required) console.warn(`vulkan test skipped: no ${LVP_ICD} (apt-get install mesa-vulkan-drivers)`);

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
const hosts: EngineHost[] = [];
const load = { contextTokens: 256, sequences: 1, threads: 1 };

beforeAll(async () => {
  fixture = await tinyModelFixture();
});
afterAll(async () => {
  for (const h of hosts) h.kill();
  await fixture?.cleanup();
});

const core = (replica: string): HostCoreSpec => ({
  replica,
  epoch: 1,
  owner: 'tiny@1',
  limits: {
    policy: 'chunked',
    maxRunning: 1,
    tokenBudget: 256,
    blockTokens: 16,
    blocksTotal: 16,
    maxContext: 255,
    watermarkBlocks: 0,
  },
});

/** Starts a host whose core's reports collect each sequence's token ids. */
function spawnCollecting(opts: Omit<Parameters<typeof spawnEngineHost>[0], 'core' | 'report'>) {
  const tokens = new Map<string, number[]>();
  const finished = new Set<string>();
  const host = spawnEngineHost({
    ...opts,
    core: core(opts.id),
    report: (r) => {
      for (const e of r.events) {
        if (e.k === 't') tokens.set(e.id, [...(tokens.get(e.id) ?? []), ...(e.ids ?? [])]);
        if (e.k === 'f') finished.add(e.id);
      }
    },
  });
  hosts.push(host);
  return { host, tokens, finished };
}

/** Greedy tokens of a host's core: at most n after the prompt. */
async function greedy(h: ReturnType<typeof spawnCollecting>, text: string, n: number): Promise<number[]> {
  const prompt = await h.host.tokenize(text);
  h.host.submit([
    {
      id: 'g',
      priority: 0,
      order: 0,
      promptTokens: prompt.length,
      outputTokens: n,
      maxTokens: n,
      estOutputTokens: n,
      generated: 0,
      prompt,
    },
  ]);
  await expect.poll(() => h.finished.has('g'), { timeout: 600_000, interval: 50 }).toBe(true);
  return h.tokens.get('g') ?? [];
}

describe.skipIf(!present && !required)('an engine host on the Vulkan build (software driver)', () => {
  it('offloads every layer to its replica device and samples what the CPU build samples', async () => {
    expect(present, `${LVP_ICD} is missing: apt-get install mesa-vulkan-drivers`).toBe(true);
    const onGpuHost = spawnCollecting({
      id: 'replica.vk#0',
      file: fixture.file,
      gpus: [0],
      load: { ...load, gpu: 'vulkan' },
      // The first start compiles the driver's shaders (about a minute on a loaded 2-core machine).
      loadTimeoutMs: 600_000,
    });
    const onCpuHost = spawnCollecting({ id: 'replica.cpu#0', file: fixture.file, gpus: [], load });
    const [gpu, cpu] = [onGpuHost.host, onCpuHost.host];
    await Promise.all([gpu.ready(), cpu.ready()]);
    const offload = gpu.capacity()!.offload!;
    expect(offload.backend).toBe('vulkan');
    expect(offload.devices).toHaveLength(1);
    expect(offload.devices[0]).toMatch(/llvmpipe/);
    expect(offload.totalLayers).toBeGreaterThan(1);
    expect(offload.gpuLayers).toBe(offload.totalLayers);
    expect(cpu.capacity()!.offload).toEqual({
      backend: 'cpu',
      devices: [],
      gpuLayers: 0,
      totalLayers: offload.totalLayers,
    });
    const text = 'hello the world';
    const [onGpu, onCpu] = await Promise.all([greedy(onGpuHost, text, 24), greedy(onCpuHost, text, 24)]);
    expect(onGpu.length).toBeGreaterThan(8);
    expect(onGpu).toEqual(onCpu);
  }, 900_000);

  it('fails to load, saying why, when its replica holds a GPU the driver does not offer', async () => {
    // llvmpipe is device 0 only: a host on GPU 3 sees no Vulkan device, so the Vulkan build cannot load there.
    const other = spawnEngineHost({
      id: 'replica.vk#3',
      file: fixture.file,
      gpus: [3],
      load: { ...load, gpu: 'vulkan' },
      loadTimeoutMs: 600_000,
    });
    hosts.push(other);
    const failure = await other.ready().then(
      () => other.capacity(),
      (e: unknown) => e,
    );
    expect(failure).toBeInstanceOf(EngineError);
    expect((failure as EngineError).code).toBe('engine_failed');
    expect((failure as EngineError).message).toMatch(/no usable vulkan build/);
  }, 900_000);
});
