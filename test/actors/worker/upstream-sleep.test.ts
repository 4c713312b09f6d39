// The worker's parking lot of sleeping upstream servers: keyed by server and GPUs, taken once, bounded, cleared from a
// faulted GPU; a parked server's exit takes it out, and a server taken from the lot reports its exit to its taker.
import { describe, expect, it } from 'vitest';
import {
  dropAllParked,
  dropParkedOn,
  MAX_PARKED,
  park,
  parkedServers,
  parkingKey,
  unpark,
  type ParkedServer,
} from '../../../actors/worker/upstream/sleep.ts';
import type { WireUpstreamSpec } from '../../../machines/messages.ts';
import type { UpstreamHttp } from '../../../actors/worker/upstream/http.ts';

const spec = (model: string): WireUpstreamSpec => ({
  model,
  command: ['vllm', 'serve', model, '--port', '{port}'],
  health: '/health',
  metrics: '/metrics',
  gauges: { waiting: [], running: [], kvUsage: [] },
  prompt: 'ids',
  tokenIds: false,
  startTimeoutMs: 1000,
  hangMs: 1000,
  maxErrors: 3,
  queue: 4,
  sleep: true,
  logLines: 10,
});

/** A parked server whose process records the signals it gets. */
function server(model: string, gpus: number[], pid: number): ParkedServer & { signals: string[] } {
  const signals: string[] = [];
  const http = {
    base: '',
    call: async () => ({ error: 'unused' }),
    stream: () => () => undefined,
    close: () => undefined,
  };
  return {
    key: parkingKey(spec(model), gpus),
    gpus,
    proc: { pid, log: { push: () => undefined, lines: () => [] }, signal: (s) => void signals.push(s) },
    route: { exit: () => undefined },
    base: 'http://127.0.0.1:1',
    http: http as UpstreamHttp,
    asleep: Promise.resolve({ ms: 5 }),
    signals,
  };
}

describe('parked upstream servers', () => {
  it('wakes only the same server on the same GPUs, once', () => {
    dropAllParked();
    const a = server('small', [0], 100);
    park(a);
    expect(unpark(parkingKey(spec('small'), [1]))).toBeUndefined();
    expect(unpark(parkingKey(spec('other'), [0]))).toBeUndefined();
    expect(unpark(parkingKey(spec('small'), [0]))).toBe(a);
    expect(unpark(parkingKey(spec('small'), [0]))).toBeUndefined();
    expect(a.signals).toEqual([]);
  });

  it('takes a parked server out when it exits, and hands a taken one’s exit to its taker', () => {
    dropAllParked();
    const a = server('small', [0], 101);
    park(a);
    a.route.exit(0, null);
    expect(parkedServers()).toEqual([]);
    const b = server('small', [0], 102);
    park(b);
    const taken = unpark(b.key)!;
    let heard = '';
    taken.route.exit = (_code, signal) => (heard = String(signal));
    b.route.exit(null, 'SIGKILL');
    expect(heard).toBe('SIGKILL');
  });

  it('stops the longest parked beyond its bound, and every server parked on a faulted GPU', () => {
    dropAllParked();
    const all = Array.from({ length: MAX_PARKED + 1 }, (_, i) => server(`m${i}`, [i % 8], 200 + i));
    for (const s of all) park(s);
    expect(all[0]!.signals).toEqual(['SIGKILL']);
    expect(parkedServers()).toHaveLength(MAX_PARKED);
    dropParkedOn(3);
    const on3 = all.filter((s, i) => i > 0 && s.gpus.includes(3));
    expect(on3.length).toBeGreaterThan(0);
    for (const s of on3) expect(s.signals).toEqual(['SIGKILL']);
    expect(parkedServers()).toHaveLength(MAX_PARKED - on3.length);
    dropAllParked();
    expect(parkedServers()).toEqual([]);
  });
});
