// The message union and the node protocol's schema describe the same wire messages.
import { describe, expect, expectTypeOf, it } from 'vitest';
import type { NodeProtocolMessage } from '../../machines/messages.ts';
import { nodeMessageSchema, type NodeMessage } from '../../transport/protocol.ts';
import { validate } from '../../transport/schema.ts';

// One message of every protocol type: a type missing here is a compile error.
const samples: { [T in NodeProtocolMessage['type']]: Extract<NodeProtocolMessage, { type: T }> } = {
  'node.register': { type: 'node.register', node: 'node', protocol: 2, gpus: [0, 1], epoch: 0 },
  'node.registered': { type: 'node.registered', node: 'node', epoch: 1, heartbeatMs: 1000 },
  'node.heartbeat': { type: 'node.heartbeat', node: 'node', epoch: 1, t: 5, gpus: [0] },
  'gpu.assign': {
    type: 'gpu.assign',
    gpu: 0,
    replica: 'replica.m@v#0',
    epoch: 1,
    model: 'llama-3-8b',
    gpuType: 'H100-SXM',
    tp: 1,
    loadMs: 100,
    unloadMs: 50,
    slowdown: 1.5,
    engine: { kind: 'llama.cpp', file: '/models/tiny.gguf', contextTokens: 512, sequences: 4, threads: 1 },
    core: {
      gpus: [0],
      owner: 'm@v',
      limits: {
        policy: 'chunked',
        maxRunning: 64,
        tokenBudget: 2048,
        blockTokens: 16,
        blocksTotal: 1000,
        maxContext: 4096,
        watermarkBlocks: 10,
      },
      stateless: {
        maxSize: 32,
        maxTokens: 16384,
        maxMemoryBytes: 1e9,
        maxDelayMs: 5,
        buckets: [16, 32],
        bytesPerToken: 4096,
        maxQueued: 1024,
      },
      check: true,
    },
  },
  'gpu.release': { type: 'gpu.release', gpu: 0, replica: 'replica.m@v#0', epoch: 1 },
  'gpu.loaded': { type: 'gpu.loaded', gpu: 0, replica: 'replica.m@v#0', epoch: 1 },
  'gpu.released': { type: 'gpu.released', gpu: 0, replica: 'replica.m@v#0', epoch: 1 },
  'gpu.ready': { type: 'gpu.ready', gpu: 3 },
  'gpu.failed': { type: 'gpu.failed', gpu: 3, code: 'xid_79', replica: null },
  'gpu.inject': { type: 'gpu.inject', gpu: 3, fault: 'straggle', factor: 2 },
  'gpu.fence': { type: 'gpu.fence', gpu: 3, code: 'missed_heartbeats', fence: 4 },
  'inspect.watch': { type: 'inspect.watch', leaseMs: 5000 },
  'inspect.snapshot': {
    type: 'inspect.snapshot',
    id: 'gpu.3',
    state: 'allocated.serving',
    status: 'active',
    event: 'gpu.loaded',
    replica: 'replica.m@v#0',
    epoch: 1,
    faultCode: null,
  },
  'node.inventory': {
    type: 'node.inventory',
    node: 'node',
    fence: 4,
    loads: 2,
    devices: [
      { gpu: 0, state: 'serving', replica: 'replica.m@v#0', epoch: 3 },
      { gpu: 1, state: 'free' },
    ],
  },
  'seq.submit': {
    type: 'seq.submit',
    replica: 'replica.m@v#0',
    epoch: 1,
    seqs: [
      {
        id: 'req.1',
        priority: 0,
        order: 7,
        promptTokens: 3,
        outputTokens: 16,
        maxTokens: 16,
        estOutputTokens: 16,
        generated: 1,
        atHead: true,
        prompt: [256, 72, 105],
        out: [72],
        sampling: { temperature: 0.7, topP: 0.9, seed: 3, stop: ['\n'] },
      },
    ],
    items: [{ id: 'req.2', tokens: 40, dtype: 'bf16', adapter: null, options: { normalize: true, dim: 256 } }],
  },
  'seq.cancel': { type: 'seq.cancel', replica: 'replica.m@v#0', epoch: 1, ids: ['req.1'] },
  'seq.progress': {
    type: 'seq.progress',
    replica: 'replica.m@v#0',
    epoch: 1,
    at: 120,
    start: 108,
    events: [
      { k: 's', id: 'req.1' },
      { k: 't', id: 'req.1', n: 1, ids: [72], text: 'H' },
      { k: 'g', ids: ['req.0'] },
      { k: 'p', id: 'req.3' },
      { k: 'f', id: 'req.1', reason: 'eos' },
      { k: 'f', id: 'req.2', reason: 'done', result: 0.5, batch: 'b.1', size: 4 },
    ],
    load: {
      waiting: 1,
      running: 2,
      blocksUsed: 10,
      blocksTotal: 100,
      prefillTokensAhead: 30,
      decodeTokensAhead: 40,
      waitingBlocks: 2,
      waitingByClass: [1, 0],
      waitingTokensByClass: [30, 0],
      committedBlocks: 14,
      runningCommittedBlocks: 12,
      runningContext: 900,
      preemptions: 0,
      steps: 9,
      received: 3,
      cancelled: 0,
      queued: 0,
      saturated: false,
      stepCount: 9,
      stepMembers: 20,
      stepTokens: 400,
      stepPredictedMs: 100,
      stepBusyMs: 101.5,
      inflightPredictedMs: 12,
      inflightMs: 3,
    },
    ranks: [0, 1],
  },
};

describe('the message union', () => {
  it('types every message the node protocol validates, and no other protocol message', () => {
    expectTypeOf<NodeMessage>().toMatchTypeOf<NodeProtocolMessage>();
    expectTypeOf<NodeProtocolMessage['type']>().toEqualTypeOf<NodeMessage['type']>();
  });

  it('has every protocol member accepted by the wire schema', () => {
    for (const msg of Object.values(samples))
      expect(validate(nodeMessageSchema, msg)).toEqual({ ok: true, value: msg });
  });
});
