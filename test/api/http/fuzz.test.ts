// A bounded HTTP fuzz run in npm test (the long one is `npm run fuzz:http`): a real server process survives every
// case, answers each within its expected class, cuts idle and slow connections, answers /healthz after every small
// group of cases (no batch goes out until it has), and a bystander stream keeps streaming throughout. The semantic
// mode's hostile field and header values each get a typed status and leave no request live.
import { describe, expect, it } from 'vitest';
import { runHttpFuzz } from '../../fuzz/http-fuzz.ts';

describe('the HTTP edge under fuzzing', () => {
  it('survives 3,000 fuzzed requests and connection behaviours, /healthz after every 10, the bystander intact', async () => {
    const r = await runHttpFuzz({ cases: 3_000, seed: 7, connections: 8, pipeline: 4, checkEvery: 10, gated: true });
    expect(r.unexpected).toEqual([]);
    expect(r).toMatchObject({ cases: 3_000, crashes: 0, bystanderBroken: 0, healthFailed: 0 });
    // One check per group of ten, none skipped, and one at the end.
    expect(r.healthChecks).toBe(301);
    expect(r.bystanders).toBeGreaterThan(0);
    // Every kind of case ran: framed requests and each connection behaviour.
    for (const kind of ['path', 'method', 'header', 'body', 'chunked', 'half-closed', 'encoding', 'garbage'])
      expect(r.byKind[kind], kind).toBeGreaterThan(0);
    for (const kind of ['idle', 'slow-headers', 'slow-body', 'slow-complete'])
      expect(r.byKind[kind], kind).toBeGreaterThan(0);
    expect(r.maxRssMb).toBeGreaterThan(0);
  }, 120_000);
});

describe('the HTTP API under semantic fuzzing', () => {
  it('answers 3,000 requests with hostile fields and headers with typed statuses and leaks no request', async () => {
    const r = await runHttpFuzz({ cases: 3_000, seed: 7, semantic: true, batch: 500, connections: 8, pipeline: 4 });
    expect(r.unexpected).toEqual([]);
    expect(r).toMatchObject({ cases: 3_000, crashes: 0, bystanderBroken: 0, leakedRequests: 0, healthFailed: 0 });
    for (const kind of ['completion', 'chat', 'header', 'models', 'admin'])
      expect(r.byKind[kind], kind).toBeGreaterThan(0);
    expect(r.bystanders).toBeGreaterThan(0);
  }, 120_000);
});
