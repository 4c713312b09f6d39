// The prefix-reuse counters of /metrics: prompt and cached tokens of scheduled requests of prefix-cache models.
import { describe, expect, it } from 'vitest';
import { createBoundedCollector } from '../../api/bounded-collector.ts';
import { createServerMetrics } from '../../api/metrics.ts';
import { normalizeScenario } from '../../actors/config.ts';
import type { ControlPlane } from '../../actors/control-plane.ts';
import type { NodeLink } from '../../actors/node-link.ts';
import type { RequestRecord } from '../../actors/metrics/collector.ts';

const scenario = normalizeScenario({
  name: 'prefix-metrics',
  node: { gpu: 'H100-SXM', gpus: 2 },
  placement: { policy: 'exclusive' },
  models: [
    { name: 'cached', profile: 'llama-3-8b', tp: 1, replicas: 1, batching: { prefixCache: true } },
    { name: 'plain', profile: 'llama-3-8b', tp: 1, replicas: 1 },
  ],
});

const record = (model: string, promptTokens: number, cachedTokens: number, scheduled = true): RequestRecord => ({
  ...{ id: `r${promptTokens}`, model, priority: 'interactive', outcome: 'done', code: null, receivedAt: 0 },
  ...{ firstScheduledAt: scheduled ? 1 : -1, firstTokenAt: 2, finishedAt: 3, tokens: 1, budgetMs: 1000 },
  ...{ resumes: 0, preemptions: 0, promptTokens, cachedTokens },
});

/** A control plane with nothing placed, its collector bounded as a server's is. */
function fakePlane(keep: number): ControlPlane {
  return {
    scenario,
    collector: createBoundedCollector(keep),
    placement: { replicas: new Map(), gpus: new Map(), events: [] },
    live: () => 0,
    profileFits: { all: () => [] },
  } as unknown as ControlPlane;
}

const node = { connected: () => true, status: () => ({ registrations: 1 }) } as unknown as NodeLink;

const value = (text: string, name: string, model: string): number | null => {
  const m = new RegExp(`^${name}\\{model="${model}"\\} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : null;
};

describe('prefix metrics', () => {
  it('count the prompt and cached tokens of scheduled requests of prefix-cache models, past the records kept', async () => {
    const cp = fakePlane(2);
    const metrics = createServerMetrics(cp, node);
    cp.collector.record(record('cached', 100, 0));
    cp.collector.record(record('cached', 120, 96));
    let text = await metrics.text();
    expect(value(text, 'switchyard_prefix_prompt_tokens_total', 'cached')).toBe(220);
    expect(value(text, 'switchyard_prefix_cached_tokens_total', 'cached')).toBe(96);
    // More requests than the collector keeps records of, one never scheduled: the totals still count every scheduled one.
    cp.collector.record(record('cached', 140, 112));
    cp.collector.record(record('cached', 50, 0, false));
    cp.collector.record(record('cached', 160, 128));
    text = await metrics.text();
    expect(value(text, 'switchyard_prefix_prompt_tokens_total', 'cached')).toBe(520);
    expect(value(text, 'switchyard_prefix_cached_tokens_total', 'cached')).toBe(336);
    expect(cp.collector.prefix('cached')).toMatchObject({ requests: 4, promptTokens: 520, cachedTokens: 336 });
  });

  it('have no series for a model without a prefix cache', async () => {
    const cp = fakePlane(10);
    const metrics = createServerMetrics(cp, node);
    const text = await metrics.text();
    expect(value(text, 'switchyard_prefix_prompt_tokens_total', 'cached')).toBe(0);
    expect(value(text, 'switchyard_prefix_prompt_tokens_total', 'plain')).toBeNull();
  });
});
