// Headless Chromium for the browser tests: Debian's package driven by playwright-core, with flags that keep it off
// the network (no updates, no sync, no background fetches). Screenshots go to test-artifacts/.
import { existsSync, mkdirSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';

/** The repository root. */
export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** Where screenshots are written (gitignored). */
export const ARTIFACTS = join(ROOT, 'test-artifacts');
/** Debian's chromium. */
export const CHROMIUM = process.env['CHROMIUM_PATH'] ?? '/usr/bin/chromium';
/** Flags that work offline and in a container. */
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--no-first-run',
  '--disable-sync',
];

/** Launches headless Chromium; fails with the install command when it is missing. */
export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM))
    throw new Error(`${CHROMIUM} not found: install it with \`apt-get install -y chromium\` (or set CHROMIUM_PATH)`);
  return chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
}

/** Opens a page that records console errors and uncaught exceptions into `errors`. */
export async function openPage(browser: Browser, errors: string[]): Promise<Page> {
  const page = await browser.newPage({ viewport: { width: 1500, height: 1100 } });
  page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`console: ${m.text()}`);
  });
  return page;
}

/** Saves a screenshot under test-artifacts/ (and, with UPDATE_DOCS_SCREENSHOTS=1, copies it to docs/img/). */
export async function screenshot(page: Page, name: string, docs = false): Promise<string> {
  mkdirSync(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  if (docs && process.env['UPDATE_DOCS_SCREENSHOTS'] === '1') {
    mkdirSync(join(ROOT, 'docs/img'), { recursive: true });
    copyFileSync(path, join(ROOT, 'docs/img', `${name}.png`));
  }
  return path;
}
