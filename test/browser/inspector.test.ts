// The inspector in real headless Chromium: the live page on a running `switchyard serve` (with its node-agent process),
// a GPU failure through the admin API, a request's decision trace, and the replay of a recorded simulation.
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, Page } from 'playwright-core';
import { normalizeScenario } from '../../actors/config.ts';
import { startReplayServer } from '../../inspector/replay-server.ts';
import { startServer, type RunningServer } from '../../api/server.ts';
import { runCommand, serve, writeConfig, type Served } from '../e2e/harness.ts';
import { ARTIFACTS, launchChromium, openPage, ROOT, screenshot } from './chromium.ts';

const CONFIG = `
name: inspector-live
node: { gpu: H100-SXM, gpus: 8 }
placement: { policy: exclusive }
models:
  - name: llama-3-70b
    profile: llama-3-70b
    tp: 8
    replicas: 1
    resume: { maxResumes: 1, budgetMs: 3000 }
`;

/** A text that must never reach the inspector: the prompt of the request whose trace is checked. */
const CANARY = 'PROMPT-CANARY-7f3a9 please describe the rail yard';

const tileStates = (page: Page): Promise<string[]> =>
  page
    .locator('[data-testid=gpu-tile]')
    .evaluateAll((els) => els.map((e) => (e as HTMLElement).dataset['state'] ?? ''));

const setSlider = (page: Page, t: number): Promise<void> =>
  page.evaluate((v) => {
    const s = document.getElementById('slider') as HTMLInputElement;
    s.value = String(v);
    s.dispatchEvent(new Event('input'));
  }, t);

describe('the inspector page in Chromium', () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await launchChromium();
  });
  afterAll(async () => {
    await browser?.close();
  });

  describe('live on a serving node', () => {
    let s: Served;
    let page: Page;
    const errors: string[] = [];
    const received: string[] = [];

    beforeAll(async () => {
      s = await serve(['--config', writeConfig(CONFIG), '--time-scale', '0.1']);
      await s.waitReady('llama-3-70b');
      page = await openPage(browser, errors);
      page.on('websocket', (ws) => ws.on('framereceived', (f) => received.push(String(f.payload))));
      await page.goto(`${s.url}/inspector/#token=${s.adminToken}`);
    });
    afterAll(async () => {
      await page?.close();
      await s?.stop();
    });

    it('loads from the control plane and shows eight GPU tiles serving the large model', async () => {
      await page.waitForFunction(
        () => document.querySelectorAll('[data-testid=gpu-tile][data-state=serving]').length === 8,
        null,
        { timeout: 10_000 },
      );
      expect(await tileStates(page)).toEqual(Array(8).fill('serving'));
      expect(await page.locator('[data-testid=connection]').textContent()).toBe('live');
      const replica = page.locator('[data-testid=replica][data-id="replica.llama-3-70b@v1#0"]');
      await expect.poll(() => replica.getAttribute('data-state')).toMatch(/^ready/);
      expect(await page.locator('[data-testid=gpu-tile][data-gpu="0"]').textContent()).toContain('llama-3-70b');
      await screenshot(page, 'inspector-live');
    });

    it("shows a request's decision trace, and never its prompt or output text", async () => {
      const res = await fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'llama-3-70b', messages: [{ role: 'user', content: CANARY }], max_tokens: 12 }),
      });
      expect(res.status).toBe(200);
      const reply = ((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
      const row = page.locator('[data-testid=request-row][data-state=done]').first();
      await row.waitFor({ timeout: 5_000 });
      await row.click();
      const trace = page.locator('[data-testid=decision-trace]');
      await trace.waitFor();
      const decision = trace.locator('[data-testid=decision]').first();
      expect(await decision.textContent()).toMatch(/admit · routed to replica\.llama-3-70b@v1#0 at .*predicted wait/);
      expect(await page.locator('[data-testid=statechart] svg').getAttribute('data-active')).toBe('done');
      expect(await page.content()).not.toContain('PROMPT-CANARY');
      expect(await page.content()).not.toContain(reply);
      expect(received.join('\n')).not.toContain('PROMPT-CANARY');
      expect(received.join('\n')).not.toContain(reply);
    });

    it('turns GPU 3 failed and the large replica failed within one second of failing GPU 3 through the admin API', async () => {
      // A long request in flight, so the failure interrupts something the page can explain.
      const inflight = fetch(`${s.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'llama-3-70b', prompt: 'a long story', max_tokens: 4000, stream: true }),
      }).then((r) => r.text());
      await page.locator('[data-testid=request-row][data-state=decoding]').first().waitFor({ timeout: 10_000 });
      const id = await page.locator('[data-testid=request-row][data-state=decoding]').first().getAttribute('data-id');

      const t0 = performance.now();
      const r = await s.post('/admin/gpus/3/fail', {}, s.adminToken);
      expect(r.status).toBe(202);
      await page.locator('[data-testid=gpu-tile][data-gpu="3"][data-state=failed]').waitFor({ timeout: 1_000 });
      await page
        .locator('[data-testid=replica][data-id="replica.llama-3-70b@v1#0"][data-failed=true]')
        .waitFor({ timeout: Math.max(1, 1_000 - (performance.now() - t0)) });
      const elapsed = performance.now() - t0;
      expect(elapsed).toBeLessThan(1_000);
      writeFileSync(
        join(ARTIFACTS, 'inspector-failure-latency.json'),
        `${JSON.stringify({ gpuFailedToPageMs: Math.round(elapsed) })}\n`,
      );

      await page.locator(`[data-testid=request-row][data-id="${id}"]`).click();
      const story = page.locator('[data-testid=story]');
      await story.waitFor({ timeout: 5_000 });
      expect(await story.textContent()).toMatch(/interrupted at .* replica_failed/);
      // The header follows placement's next status push, which may come a moment after the replica's failure.
      const gang = page.locator('[data-testid=gang]', { hasText: /llama-3-70b unavailable: .*7/ });
      await gang.waitFor({ timeout: 5_000 });
      expect(await gang.textContent()).toMatch(/llama-3-70b unavailable: .*7/);
      await screenshot(page, 'inspector-gpu-failure', true);
      await inflight;
      expect(errors).toEqual([]);
    });
  });

  describe('replay of a recorded simulation', () => {
    let trace: string;
    beforeAll(async () => {
      trace = join(mkdtempSync(join(tmpdir(), 'switchyard-trace-')), 'gang-failure.json');
      const run = await runCommand(
        ['simulate', join(ROOT, 'test/browser/fixtures/gang-failure.yaml'), '--trace', trace],
        {},
        60_000,
      );
      expect(run.stderr).toMatch(/recorded \d+ inspection frames/);
    });

    it('opens a recording with the file picker and scrubs through the GPU failure with the time slider', async () => {
      const s = await startReplayServer();
      const errors: string[] = [];
      const page = await openPage(browser, errors);
      try {
        await page.goto(s.pageUrl);
        await page.setInputFiles('[data-testid=open-recording]', trace);
        await page.locator('[data-testid=replay-bar]').waitFor({ state: 'visible' });
        const rec = JSON.parse(readFileSync(trace, 'utf8')) as {
          frames: { k: string; t: number; ev?: { kind?: string; gpu?: number } }[];
        };
        const failedAt = rec.frames.find((f) => f.k === 'place' && f.ev?.kind === 'gpu.failed')!.t;
        await setSlider(page, failedAt - 1_000);
        expect(await tileStates(page)).toEqual(Array(8).fill('serving'));
        await setSlider(page, failedAt + 100);
        await page.locator('[data-testid=gpu-tile][data-gpu="3"][data-state=failed]').waitFor({ timeout: 2_000 });
        await page.locator('[data-testid=replica][data-failed=true]').first().waitFor({ timeout: 2_000 });
        await page.locator('[data-testid=replica][data-failed=true]').first().click();
        expect(await page.locator('[data-testid=statechart] svg').getAttribute('data-active')).toBe('failed');
        await screenshot(page, 'inspector-replay');
        // Back before the failure: the view is rebuilt from the start of the recording (rendered on the next frame).
        await setSlider(page, failedAt - 1_000);
        await page.locator('[data-testid=gpu-tile][data-gpu="3"][data-state=serving]').waitFor({ timeout: 2_000 });
        expect(await tileStates(page)).toEqual(Array(8).fill('serving'));
        expect(errors).toEqual([]);
      } finally {
        await page.close();
        await s.close();
      }
    });

    it('opens a recording named in the URL and plays it to the end', async () => {
      const s = await startReplayServer({ file: trace });
      const page = await openPage(browser, []);
      try {
        await page.goto(s.url);
        await page.locator('[data-testid=replay-bar]').waitFor({ state: 'visible' });
        await setSlider(page, 0);
        await page.selectOption('#speed', '60');
        await page.click('[data-testid=play]');
        await page.waitForFunction(() => document.getElementById('play')?.textContent?.includes('play'), null, {
          timeout: 20_000,
        });
        expect(await page.locator('[data-testid=replay-time]').textContent()).toMatch(/frame (\d+) of \1/);
      } finally {
        await page.close();
        await s.close();
      }
    });
  });

  describe('authentication', () => {
    let server: RunningServer;
    beforeAll(async () => {
      const scenario = normalizeScenario({
        name: 'inspector-auth',
        models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 1 }],
      });
      server = await startServer({
        scenario,
        port: 0,
        clientTokens: ['client-token-1'],
        workerTokens: ['w'],
        adminTokens: ['a'],
      });
    });
    afterAll(async () => {
      await server?.close();
    });

    it('refuses the stream without the admin token and accepts it from the page fragment', async () => {
      const page = await openPage(browser, []);
      try {
        await page.goto(`${server.url}/inspector`);
        // The server refuses before the WebSocket upgrade completes (401); the page asks why and says so, and stops
        // retrying (it used to show "disconnected, retrying…" forever).
        await expect
          .poll(() => page.locator('[data-testid=connection]').textContent(), { timeout: 5_000 })
          .toMatch(/^refused: the inspector needs the admin or the inspector token.*not retrying$/);
        expect(await page.locator('[data-testid=gpu-tile]').count()).toBe(0);
        // Still refused well after the first retry would have run (250 ms): a retry would show "connecting…".
        await new Promise((r) => setTimeout(r, 1_500));
        expect(await page.locator('[data-testid=connection]').textContent()).toMatch(/^refused:/);
        await page.goto(`${server.url}/inspector/#token=wrong-token`);
        await page.reload();
        await expect
          .poll(() => page.locator('[data-testid=connection]').textContent(), { timeout: 5_000 })
          .toMatch(/^refused: the token in the address.*not accepted/);
        // A client's token never opens the stream: it shows every tenant's requests.
        await page.goto(`${server.url}/inspector/#token=client-token-1`);
        await page.reload();
        await expect
          .poll(() => page.locator('[data-testid=connection]').textContent(), { timeout: 5_000 })
          .toMatch(/^refused: the token in the address.*not accepted/);
        await page.goto(`${server.url}/inspector/#token=a`);
        await page.reload();
        await expect
          .poll(() => page.locator('[data-testid=connection]').textContent(), { timeout: 5_000 })
          .toBe('live');
        await expect.poll(() => page.locator('[data-testid=gpu-tile]').count()).toBe(8);
      } finally {
        await page.close();
      }
    });
  });
});
