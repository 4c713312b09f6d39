// A bounded HTTP fuzz run in npm test (the long one is `npm run fuzz:http`): a real server process survives every
// case, answers each within its expected class, and a bystander stream keeps streaming throughout.
import { describe, expect, it } from 'vitest';
import { runHttpFuzz } from '../../fuzz/http-fuzz.ts';

describe('the HTTP edge under fuzzing', () => {
  it('survives 1,500 fuzzed requests and connection behaviours with no crash, no 5xx and the bystander intact', async () => {
    const r = await runHttpFuzz({ cases: 1_500, seed: 7, concurrency: 16 });
    expect(r.unexpected).toEqual([]);
    expect(r).toMatchObject({ cases: 1_500, crashes: 0, bystanderBroken: 0 });
    expect(r.maxRssMb).toBeGreaterThan(0);
  }, 120_000);
});
