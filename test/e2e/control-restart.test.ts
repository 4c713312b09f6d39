// A control-plane restart with real processes: `serve --no-worker` and a separate `node-agent` process. The control
// plane is killed with SIGKILL while its eight replicas are loaded and a request streams; a new one starts on the
// same port, config and state file. The worker registers again and the new control plane adopts every replica at
// its epoch: the worker's own load counter does not move, the admin change made before the kill is restored from the
// state file, and new requests stream. (The time to ready is printed by `npm run bench:placement`, not asserted.)
import { describe, expect, it } from 'vitest';
import { runRestart } from '../../bench/lib/restart.ts';

describe('a control-plane restart (kill -9) with the worker in its own process', () => {
  it('adopts every loaded replica (no reload, same epochs), restores operator state, and serves again', async () => {
    const r = await runRestart();
    expect(r.streamCut).toBe(true);
    expect(r.loadsBefore).toBe(8);
    expect(r.reloadsAfterRestart).toBe(0);
    expect(r.replicasAfter).toEqual(r.replicasBefore);
    expect(r.adoption.filter((a) => a.startsWith('replica.adopted'))).toHaveLength(8);
    expect(r.adoption.some((a) => a.startsWith('gpu.reclaimed'))).toBe(false);
    expect(r.routingAfter).toBe('round-robin');
    expect(r.newRequestTokens).toBeGreaterThan(0);
    expect(r.workerPidSame).toBe(true);
    process.stdout.write(`restart: ready ${r.restartReadyS} s after the new control plane listened\n`);
  }, 180_000);
});
