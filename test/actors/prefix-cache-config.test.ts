// batching.prefixCache per engine: the cost model keeps a block cache, a llama.cpp engine keeps its slots' cells
// (accepted, and handed to the replica's core as its limits say), an openai server manages its own cache (refused).
import { describe, expect, it } from 'vitest';
import { ConfigError, normalizeScenario } from '../../actors/config.ts';

const withEngine = (model: Record<string, unknown>) =>
  normalizeScenario({
    name: 't',
    node: { gpus: 1 },
    models: [{ name: 'm', profile: 'llama-3-8b', batching: { prefixCache: true }, ...model }],
  });

describe('batching.prefixCache', () => {
  it('is accepted for the cost model and for a llama.cpp engine', () => {
    expect(withEngine({}).models[0]!.batching.prefixCache).toBe(true);
    const llama = withEngine({ engine: 'llama.cpp', file: 'm.gguf', generate: 'tiny' });
    expect(llama.models[0]!.batching.prefixCache).toBe(true);
  });

  it('is refused for an openai server, naming the field', () => {
    const openai = () =>
      withEngine({
        engine: 'openai',
        file: 'm.gguf',
        upstream: { model: 'x', url: 'http://127.0.0.1:9/v1' },
      });
    expect(openai).toThrow(ConfigError);
    expect(openai).toThrow(/batching\.prefixCache.*engine openai/);
  });
});
