import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../actors/config.ts';
import { simulate } from '../../actors/sim/simulate.ts';
import { startRecording, writeRecording, type Recorder } from '../../inspector/record.ts';
import type { Frame, Recording, StateFrame } from '../../inspector/protocol.ts';

const scenario = normalizeScenario({
  name: 'record-small',
  seed: 3,
  models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 2 }],
  traffic: [
    {
      model: 'llama-3-8b',
      requests: 40,
      lengths: { prompt: { mean: 300 }, output: { mean: 60 }, maxTokens: 128 },
      arrival: { process: 'poisson', rate: 20 },
    },
  ],
  faults: [{ at: 1, gpu: 1, kind: 'fault' }],
});

const record = (): { rec: Recording; report: string } => {
  let recorder: Recorder | null = null;
  const report = simulate(scenario, { onStart: (cp) => (recorder = startRecording(cp, { seed: 3, summaryMs: 200 })) });
  return { rec: (recorder as unknown as Recorder).finish(), report: JSON.stringify(report) };
};

describe('recording a simulation for replay', () => {
  it('does not change the simulation: the report is byte-identical with and without recording', () => {
    const plain = JSON.stringify(simulate(scenario));
    expect(record().report).toBe(plain);
  });

  it('writes a versioned stream that starts with hello and the machines, in time order', () => {
    const { rec } = record();
    expect(rec.format).toBe('switchyard.inspect');
    expect(rec.v).toBe(1);
    expect(rec.dropped).toBe(0);
    expect(rec.frames[0]).toMatchObject({ k: 'hello', v: 1, mode: 'replay', gpus: 8, scenario: 'record-small' });
    const hello = rec.frames[0] as Extract<Frame, { k: 'hello' }>;
    expect(Object.keys(hello.machines).sort()).toEqual(['gpu', 'placement', 'replica', 'request']);
    for (let i = 1; i < rec.frames.length; i++) expect(rec.frames[i]!.t).toBeGreaterThanOrEqual(rec.frames[i - 1]!.t);
  });

  it('holds what the replay shows: replicas loading and failing, every request to its end, GPUs and placement', () => {
    const { rec } = record();
    const states = rec.frames.filter((f): f is StateFrame => f.k === 'state');
    const replica1 = states.filter((f) => f.m === 'replica' && (f.ctx['gpus'] as number[]).includes(1));
    expect(replica1.map((f) => f.s)).toEqual(expect.arrayContaining(['loading', 'ready.idle', 'stopped']));
    // A one-GPU replica passes through `failed` within one macrostep; its last frame says which GPU failed it.
    expect(replica1.at(-1)).toMatchObject({
      s: 'stopped',
      done: true,
      ev: { type: 'gpu.failed', gpu: 1 },
      ctx: { failedGpus: [1] },
    });
    const ended = new Set(states.filter((f) => f.m === 'request' && f.done).map((f) => f.id));
    expect(ended.size).toBe(40);
    expect(rec.frames.filter((f) => f.k === 'trace').length).toBeGreaterThanOrEqual(40);
    expect(rec.frames.some((f) => f.k === 'place' && f.ev['kind'] === 'gpu.failed' && f.ev['gpu'] === 1)).toBe(true);
    const last = rec.frames.at(-1)!;
    expect(last.k).toBe('node');
    if (last.k === 'node') {
      expect(last.gpus).toHaveLength(8);
      expect(last.gpus[1]).toMatchObject({ state: 'failed', healthy: false });
    }
  });

  it('round-trips through the file format', () => {
    const { rec } = record();
    const file = join(mkdtempSync(join(tmpdir(), 'switchyard-rec-')), 'out.json');
    writeRecording(file, rec);
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual(rec);
  });

  it('keeps the newest frames within its bound and says how many it dropped', () => {
    let recorder: Recorder | null = null;
    simulate(scenario, { onStart: (cp) => (recorder = startRecording(cp, { seed: 3, maxFrames: 50 })) });
    const rec = (recorder as unknown as Recorder).finish();
    expect(rec.frames).toHaveLength(52);
    expect(rec.frames[1]).toMatchObject({ k: 'dropped' });
    expect(rec.dropped).toBeGreaterThan(0);
  });
});
