// The worker's command line: plain ws:// only to a control plane on this host unless --insecure, checked before the
// worker token leaves the process.
import { describe, expect, it } from 'vitest';
import { plainTextRefusal } from '../../bin/node-agent-command.ts';
import { runCommand } from '../e2e/harness.ts';

describe('switchyard node-agent', () => {
  it.each([
    ['ws://127.0.0.1:8080/v1/node', false],
    ['ws://localhost:8080/v1/node', false],
    ['ws://[::1]:8080/v1/node', false],
    ['wss://cp.example:8443/v1/node', false],
    ['ws://10.0.0.7:8080/v1/node', true],
    ['ws://cp.example:8080/v1/node', true],
    ['http://127.0.0.1:8080/v1/node', true],
  ])('dials %s without --insecure: refused = %s', (url, refused) => {
    expect(plainTextRefusal(url, false) !== null).toBe(refused);
  });

  it('dials plain ws:// to another host only with --insecure', () => {
    expect(plainTextRefusal('ws://10.0.0.7:8080/v1/node', true)).toBeNull();
    expect(plainTextRefusal('http://10.0.0.7:8080/v1/node', true)).toMatch(/ws:\/\/ or wss:\/\//);
  });

  it('exits with a usage error naming --insecure instead of sending its token in plain text', async () => {
    const r = await runCommand(
      ['node-agent', '--url', 'ws://192.0.2.10:8080/v1/node', '--model-root', '/models'],
      { SWITCHYARD_WORKER_TOKEN: 'x9Kq2mWv7Lr4Tz8Bn3Hc6Yd5' },
      20_000,
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/plain text to another host.*--insecure/);
  });
});
