// A bounded WebSocket fuzz run in npm test (the long one is `npm run fuzz:ws`): hostile submits and cancels over JSON
// and msgpack, every frame answered as its bytes decode, no request left live after any batch, the bystander intact.
import { describe, expect, it } from 'vitest';
import { runWsFuzz } from '../fuzz/ws-fuzz.ts';

describe('the WebSocket API under structure-aware fuzzing', () => {
  it('answers 3,000 hostile frames with typed errors or whole streams and leaks no request', async () => {
    const r = await runWsFuzz({ cases: 3_000, seed: 7, connections: 8, batch: 500 });
    expect(r.notes).toEqual([]);
    expect(r).toMatchObject({ cases: 3_000, crashes: 0, unexpected: 0, leakedRequests: 0, bystanderBroken: 0 });
    // One check after each batch; streams were accepted, cancelled and run to their end.
    expect(r.healthChecks).toBe(6);
    expect(r.accepted).toBeGreaterThan(0);
    expect(r.cancelled).toBeGreaterThan(0);
    expect(r.streamed).toBeGreaterThan(0);
    expect(r.bystanders).toBeGreaterThan(0);
    expect(r.maxRssMb).toBeGreaterThan(0);
  }, 120_000);
});
