// Graceful stop with real processes: SIGTERM during streaming turns readiness false and refuses new work at once,
// gives every client exactly one terminal event, stops the worker, and exits 0. Also: secrets are never echoed.
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { connectClient } from '../../api/client.ts';
import { runCommand, serve } from './harness.ts';

const MODEL = 'llama-3-8b';

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('serve on SIGTERM', () => {
  it('drains: every streaming client gets one terminal event, readiness turns false, exit 0, no orphan worker', async () => {
    const s = await serve(['--time-scale', '1', '--drain-ms', '1500']);
    try {
      await s.waitReady(MODEL);
      const client = await connectClient(s.wsUrl, {});
      // Long enough that the drain deadline, not completion, ends most of them.
      const streams = Array.from({ length: 12 }, (_, i) =>
        client.stream({ model: MODEL, prompt: `client ${i}`, maxTokens: i < 4 ? 20 : 5_000 }),
      );
      const ends = streams.map((st) => {
        let events = 0;
        const outcome = st.result.then(
          (r) => (events++, r.ok ? 'done' : r.error.code),
          (e: Error & { code?: string }) => (events++, e.code ?? 'error'),
        );
        return { outcome, events: () => events };
      });
      await new Promise((r) => setTimeout(r, 400));
      const exited = new Promise<number | null>((r) => s.proc.once('exit', (code) => r(code)));
      s.proc.kill('SIGTERM');
      await s.waitForLine(/shutting down/);
      const ready = await s.get('/readyz').catch(() => null);
      if (ready) expect(ready.status).toBe(503);
      const late = await s.post('/v1/completions', { model: MODEL, prompt: 'late', max_tokens: 2 }).catch(() => null);
      if (late) {
        expect(late.status).toBe(503);
        expect(late.headers.get('retry-after')).not.toBeNull();
      }
      const outcomes = await Promise.all(ends.map((e) => e.outcome));
      expect(await exited).toBe(0);
      for (const e of ends) expect(e.events()).toBe(1);
      // The short ones finished within the deadline; the long ones were given a typed terminal event.
      expect(outcomes.slice(0, 4)).toEqual(['done', 'done', 'done', 'done']);
      for (const o of outcomes.slice(4)) expect(['done', 'cancelled', 'model_unavailable']).toContain(o);
      client.close();
      await new Promise((r) => setTimeout(r, 500));
      for (const pid of s.workerPids()) expect(alive(pid)).toBe(false);
    } finally {
      await s.stop();
    }
  }, 90_000);

  it('never prints a supplied token, prints a generated one once, and writes it 0600 when asked', async () => {
    const given = 'supplied-admin-token-0123456789';
    const s = await serve(['--no-worker'], { SWITCHYARD_ADMIN_TOKEN: given });
    try {
      expect(s.lines.join('\n')).not.toContain(given);
      expect(s.adminToken).toBeUndefined();
      const occurrences = s.lines.filter((l) => l.includes(s.workerToken)).length;
      expect(occurrences).toBe(1);
    } finally {
      await s.stop();
    }
    const file = join(mkdtempSync(join(tmpdir(), 'switchyard-secrets-')), 'secrets.json');
    const t = await serve(['--no-worker', '--secrets-file', file]);
    try {
      const secrets = JSON.parse(readFileSync(file, 'utf8')) as { adminToken: string; workerToken: string };
      expect(statSync(file).mode & 0o777).toBe(0o600);
      expect(t.lines.join('\n')).not.toContain(secrets.adminToken);
      expect(t.lines.join('\n')).not.toContain(secrets.workerToken);
    } finally {
      await t.stop();
    }
  }, 60_000);

  it('refuses a supplied token shorter than 16 characters, naming its source', async () => {
    const r = await runCommand(['serve', '--port', '0', '--no-worker'], { SWITCHYARD_CLIENT_TOKENS: 'short' });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/client token from SWITCHYARD_CLIENT_TOKENS is shorter than 16 characters/);
  }, 30_000);
});
