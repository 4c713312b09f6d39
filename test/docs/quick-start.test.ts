// README.md's quick start, run as shown against a fresh clone's layout: the committed tree (no build output, no
// generated models, no caches) with this checkout's installed node_modules beside them. Every shell command of the
// quick start's code blocks is classified here; a command this test does not know fails it, so a new one cannot
// slip in untested. Servers are started on a free port (`--port 0`) instead of 8080 and the commands that talk to
// them get that URL; `npm ci` and `npm test` are what CI itself runs around this test, and `calibrate` (a timed grid
// of minutes) is checked to exist and to refuse a bad config, not run through.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, serve, type Served } from '../e2e/harness.ts';

/** The shell commands of the quick start's `sh` blocks (comments and blank lines dropped). */
export function quickStartCommands(readme: string): string[] {
  const section = readme.split(/^## /m).find((s) => s.startsWith('Quick start'));
  if (!section) throw new Error('README.md has no "## Quick start" section');
  const out: string[] = [];
  for (const block of section.matchAll(/```sh\n([\s\S]*?)```/g))
    for (const line of block[1]!.split('\n')) {
      const cmd = line.replace(/\s+#.*$/, '').trim();
      if (cmd && !cmd.startsWith('#')) out.push(cmd);
    }
  return out;
}

let fresh: string;

/** A fresh clone's layout: the committed tree (`git archive HEAD`, as a clone checks it out), node_modules linked. */
function freshLayout(): string {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-clone-'));
  const tar = spawnSync('sh', ['-c', `git archive HEAD | tar -x -C '${dir}'`], { cwd: ROOT, encoding: 'utf8' });
  if (tar.status !== 0) throw new Error(`git archive failed: ${tar.stderr}`);
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  return dir;
}

/** Runs a shell command in the fresh layout with the server's URL in place of the default one. */
function run(cmd: string, url: string): { status: number | null; out: string } {
  const r = spawnSync('sh', ['-c', cmd.replaceAll('http://127.0.0.1:8080', url)], {
    cwd: fresh,
    encoding: 'utf8',
    env: { ...process.env, SWITCHYARD_URL: url },
    timeout: 60_000,
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

const servers: Served[] = [];
let commands: string[] = [];

beforeAll(() => {
  fresh = freshLayout();
  commands = quickStartCommands(readFileSync(join(fresh, 'README.md'), 'utf8'));
}, 60_000);
afterAll(async () => {
  for (const s of servers) await s.stop();
  rmSync(fresh, { recursive: true, force: true });
});

describe("README.md's quick start on a fresh clone's layout", () => {
  it('shows the commands this test runs, and nothing it does not know', () => {
    expect(commands.length).toBeGreaterThanOrEqual(5);
    const known = [
      /^npm ci$/,
      /^npm test$/,
      /^npm start$/,
      /^npx tsx bin\/switchyard\.ts chat /,
      /^curl /,
      /^npx tsx bin\/switchyard\.ts serve --config \S+$/,
      /^npx tsx bin\/switchyard\.ts calibrate --config \S+$/,
    ];
    for (const c of commands)
      expect(
        known.some((k) => k.test(c)),
        `unknown quick-start command: ${c}`,
      ).toBe(true);
    // What CI runs around this test: installed from the lock file, and the test script is vitest.
    expect(existsSync(join(fresh, 'package-lock.json'))).toBe(true);
    const pkg = JSON.parse(readFileSync(join(fresh, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    expect(pkg.scripts['test']).toMatch(/^vitest run/);
  });

  it('serves the embedded default with `npm start`, and the chat and curl commands get answers', async () => {
    expect(commands).toContain('npm start');
    const s = await serve([], {}, { cwd: fresh, command: ['npm', 'start', '--'] });
    servers.push(s);
    await s.waitReady('llama-3-8b', true, 60_000);
    for (const c of commands.filter((x) => /^(npx tsx bin\/switchyard\.ts chat |curl )/.test(x))) {
      if (c.startsWith('curl ') && spawnSync('sh', ['-c', 'command -v curl']).status !== 0) continue;
      const r = run(c, s.url);
      expect(r.status, `${c}\n${r.out}`).toBe(0);
      expect(r.out.length).toBeGreaterThan(0);
      if (c.startsWith('curl ')) expect(JSON.parse(r.out)).toMatchObject({ object: 'chat.completion' });
    }
  }, 120_000);

  it('serves the real engine config as shown (its model generated on first use)', async () => {
    for (const c of commands.filter((x) => x.startsWith('npx tsx bin/switchyard.ts serve --config '))) {
      const config = c.split(' ').at(-1)!;
      const s = await serve(
        ['--config', config],
        {},
        { cwd: fresh, command: ['npx', 'tsx', 'bin/switchyard.ts', 'serve'] },
      );
      servers.push(s);
      const scenario = readFileSync(join(fresh, config), 'utf8');
      const model = /^\s+- name: (\S+)/m.exec(scenario)![1]!;
      await s.waitReady(model, true, 90_000);
      const res = await fetch(`${s.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, prompt: 'switch yards', max_tokens: 4 }),
      });
      expect(res.status).toBe(200);
      await s.stop();
    }
  }, 180_000);

  it('has the calibrate command it shows (run through by test/e2e/calibrate.test.ts)', () => {
    for (const c of commands.filter((x) => x.includes(' calibrate --config '))) {
      const config = c.split(' ').at(-1)!;
      expect(existsSync(join(fresh, config))).toBe(true);
      const r = run(c.replace(config, 'no-such-file.yaml'), 'http://127.0.0.1:1');
      expect(r.status, r.out).toBe(2);
    }
  }, 60_000);
});
