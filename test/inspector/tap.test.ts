import { describe, expect, it } from 'vitest';
import type { InspectionEvent } from 'xstate';
import { createTap, statePath } from '../../inspector/tap.ts';
import type { Frame, StateFrame } from '../../inspector/protocol.ts';

/** A synthetic snapshot inspection event: the tap reads only the actor's id and machine, the event and the snapshot. */
const snap = (
  id: string,
  machine: string,
  value: unknown,
  event: Record<string, unknown>,
  context: Record<string, unknown> = {},
  status = 'active',
): InspectionEvent =>
  ({
    type: '@xstate.snapshot',
    rootId: id,
    actorRef: { id, logic: { id: machine } },
    event,
    snapshot: { value, status, context },
  }) as unknown as InspectionEvent;

const tapWith = (explain?: (id: string) => readonly unknown[] | undefined) => {
  const frames: Frame[] = [];
  let t = 0;
  const tap = createTap({ now: () => t++, emit: (f) => frames.push(f), ...(explain ? { explain } : {}) });
  return { tap, frames };
};

describe('the inspection tap', () => {
  it('names nested states as dotted paths', () => {
    expect(statePath('idle')).toBe('idle');
    expect(statePath({ ready: 'busy' })).toBe('ready.busy');
    expect(statePath({ allocated: { loading: {} } })).toBe('allocated.loading');
  });

  it('announces an actor once and emits a frame for each change of state', () => {
    const { tap, frames } = tapWith();
    tap.observe(snap('replica.a#0', 'replica', 'placing', { type: 'xstate.init' }));
    tap.observe(snap('replica.a#0', 'replica', 'loading', { type: 'replica.start' }));
    tap.observe(snap('replica.a#0', 'replica', { ready: 'idle' }, { type: 'gpu.loaded', gpu: 0, epoch: 1 }));
    expect(frames.map((f) => f.k)).toEqual(['actor', 'state', 'state', 'state']);
    expect((frames as StateFrame[]).slice(1).map((f) => f.s)).toEqual(['placing', 'loading', 'ready.idle']);
    expect((frames[3] as StateFrame).ev).toEqual({ type: 'gpu.loaded', gpu: 0, epoch: 1 });
  });

  it('drops hot-path events (work handed to a busy core, a repeated saturation) unless they change the state', () => {
    const { tap, frames } = tapWith();
    const busy = { ready: 'busy' };
    const saturated = { ready: 'saturated' };
    tap.observe(snap('replica.a#0', 'replica', busy, { type: 'xstate.init' }));
    for (let i = 0; i < 100; i++) tap.observe(snap('replica.a#0', 'replica', busy, { type: 'work.available' }));
    tap.observe(snap('replica.a#0', 'replica', saturated, { type: 'work.saturated' }));
    tap.observe(snap('replica.a#0', 'replica', saturated, { type: 'work.saturated' }));
    tap.observe(snap('replica.a#0', 'replica', { ready: 'idle' }, { type: 'work.idle' }));
    expect(frames.filter((f) => f.k === 'state').map((f) => (f as StateFrame).ev['type'])).toEqual([
      'xstate.init',
      'work.saturated',
      'work.idle',
    ]);
    expect(tap.stats.seen).toBe(104);
    expect(tap.stats.emitted).toBe(4);
  });

  it('keeps events that matter even without a change of state', () => {
    const { tap, frames } = tapWith();
    tap.observe(snap('replica.a#0', 'replica', 'failed', { type: 'xstate.init' }));
    tap.observe(snap('replica.a#0', 'replica', 'failed', { type: 'gpu.released', gpu: 2, epoch: 1 }));
    expect(frames.filter((f) => f.k === 'state')).toHaveLength(2);
  });

  it('never copies prompt or output text, whatever field carries it', () => {
    const { tap, frames } = tapWith();
    tap.observe(
      snap(
        'req.1',
        'request',
        'received',
        {
          type: 'request.admitted',
          replica: 'r',
          prompt: 'SECRET-1',
          text: 'SECRET-2',
          messages: [{ role: 'user', content: 'SECRET-3' }],
          extra: { content: 'SECRET-4', output: 'SECRET-5' },
        },
        { model: 'm', prompt: 'SECRET-6', output: 'SECRET-7', tokens: 3 },
      ),
    );
    const json = JSON.stringify(frames);
    expect(json).not.toMatch(/SECRET/);
    expect((frames[1] as StateFrame).ctx).toEqual({ model: 'm', tokens: 3 });
    expect((frames[1] as StateFrame).ev['replica']).toBe('r');
  });

  it('bounds long strings and arrays', () => {
    const { tap, frames } = tapWith();
    tap.observe(
      snap('req.1', 'request', 'failed', {
        type: 'request.failed',
        message: 'x'.repeat(5000),
        gpus: Array.from({ length: 500 }, (_, i) => i),
      }),
    );
    const ev = (frames[1] as StateFrame).ev;
    expect((ev['message'] as string).length).toBeLessThanOrEqual(201);
    expect(ev['gpus']).toHaveLength(64);
  });

  it("sends a request's decision trace when it appears, and again when a resume adds a decision", () => {
    const traces: unknown[] = [
      { kind: 'admit', outcome: 'routed', chosen: 'replica.a#0', reason: 'cost', prompt: 'SECRET' },
    ];
    const { tap, frames } = tapWith(() => traces);
    tap.observe(snap('req.1', 'request', 'received', { type: 'xstate.init' }));
    tap.observe(snap('req.1', 'request', 'queued', { type: 'request.admitted', replica: 'replica.a#0' }));
    traces.push({ kind: 'resume', outcome: 'routed', chosen: 'replica.b#0', reason: 'resumed after replica_failed' });
    tap.observe(snap('req.1', 'request', 'requeued', { type: 'request.interrupted', code: 'replica_failed' }));
    const sent = frames.filter((f) => f.k === 'trace');
    expect(sent).toHaveLength(2);
    expect(sent[1]).toMatchObject({
      id: 'req.1',
      trace: [{ kind: 'admit' }, { kind: 'resume', chosen: 'replica.b#0' }],
    });
    expect(JSON.stringify(sent)).not.toMatch(/SECRET/);
  });

  it('marks a final state and forgets the actor', () => {
    const { tap, frames } = tapWith();
    tap.observe(snap('req.1', 'request', 'decoding', { type: 'xstate.init' }));
    tap.observe(snap('req.1', 'request', 'done', { type: 'request.finished', tokens: 4 }, {}, 'done'));
    expect(frames.at(-1)).toMatchObject({ k: 'state', s: 'done', done: true });
    tap.observe(snap('req.1', 'request', 'received', { type: 'xstate.init' }));
    expect(frames.at(-2)).toMatchObject({ k: 'actor', id: 'req.1' });
  });

  it('ignores machines the page does not show and inspection events other than snapshots', () => {
    const { tap, frames } = tapWith();
    tap.observe(snap('agent', 'node-agent', 'serving', { type: 'xstate.init' }));
    tap.observe({
      type: '@xstate.event',
      rootId: 'x',
      actorRef: { id: 'gpu.1', logic: { id: 'gpu' } },
      event: { type: 'gpu.fault' },
      sourceRef: undefined,
    } as unknown as InspectionEvent);
    tap.observe({
      type: '@xstate.action',
      rootId: 'x',
      actorRef: { id: 'gpu.1', logic: { id: 'gpu' } },
      action: { type: 'probe', params: {} },
    } as unknown as InspectionEvent);
    expect(frames).toEqual([]);
  });
});
