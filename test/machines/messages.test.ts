// The message union and the node protocol's schema describe the same wire messages.
import { describe, expect, expectTypeOf, it } from 'vitest';
import type { NodeProtocolMessage } from '../../machines/messages.ts';
import { nodeMessageSchema, type NodeMessage } from '../../transport/protocol.ts';
import { validate } from '../../transport/schema.ts';

// One message of every protocol type: a type missing here is a compile error.
const samples: { [T in NodeProtocolMessage['type']]: Extract<NodeProtocolMessage, { type: T }> } = {
  'node.register': { type: 'node.register', node: 'node', protocol: 1, gpus: [0, 1], epoch: 0 },
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
  },
  'gpu.release': { type: 'gpu.release', gpu: 0, replica: 'replica.m@v#0', epoch: 1 },
  'gpu.loaded': { type: 'gpu.loaded', gpu: 0, replica: 'replica.m@v#0', epoch: 1 },
  'gpu.released': { type: 'gpu.released', gpu: 0, replica: 'replica.m@v#0', epoch: 1 },
  'gpu.ready': { type: 'gpu.ready', gpu: 3 },
  'gpu.failed': { type: 'gpu.failed', gpu: 3, code: 'xid_79', replica: null },
  'gpu.inject': { type: 'gpu.inject', gpu: 3, fault: 'straggle', factor: 2 },
  'gpu.fence': { type: 'gpu.fence', gpu: 3, code: 'missed_heartbeats', fence: 4 },
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
  'step.execute': {
    type: 'step.execute',
    replica: 'replica.m@v#0',
    epoch: 1,
    step: 7,
    gpus: [0],
    shape: { prefill: [[128, 0]], decodeBatch: 4, decodeContext: 900 },
    open: [{ seq: 'req.1', tokens: [256, 72, 105], left: 16, temperature: 0.7, topP: 0.9, seed: 3, stop: ['\n'] }],
    items: [
      { seq: 'req.1', from: 0, n: 3, sample: true },
      { seq: 'req.0', from: 9, n: 0, sample: true },
    ],
  },
  'step.completed': {
    type: 'step.completed',
    gpu: 0,
    replica: 'replica.m@v#0',
    epoch: 1,
    step: 7,
    busyMs: 12,
    ranks: [0],
    sampled: [{ seq: 'req.1', token: 72, text: 'H', finish: 'eos' }],
    cache: { sequences: 4, cellsPerSequence: 511 },
  },
  'seq.free': { type: 'seq.free', replica: 'replica.m@v#0', epoch: 1, seqs: ['req.1'] },
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
