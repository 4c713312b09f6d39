// The client commands (node-agent, chat, rollout) take their token from the environment or a file, never from a
// flag's value, which every user of the host sees in `ps`.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { presentedToken } from '../../bin/secrets.ts';
import { runCommand } from '../e2e/harness.ts';

const SECRET = 'a-token-on-the-command-line-0123456789';

describe('the client commands', () => {
  it.each([
    [['node-agent', '--url', 'ws://127.0.0.1:9/v1/node', '--token', SECRET], /SWITCHYARD_WORKER_TOKEN.*--token-file/],
    [['chat', '--model', 'm', 'hi', '--token', SECRET], /SWITCHYARD_CLIENT_TOKEN.*--token-file/],
    [
      ['rollout', '--model', 'm', '--from', 'a', '--to', 'b', '--admin-token', SECRET],
      /SWITCHYARD_ADMIN_TOKEN.*--admin-token-file/,
    ],
  ])('%j refuses the token as a flag value, naming where to give it, and never prints it', async (args, where) => {
    const r = await runCommand(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(where);
    expect(r.stderr + r.stdout).not.toContain(SECRET);
  });

  it('reads the token from the environment (then removed from it) or from a file', () => {
    const src = { kind: 'client', env: 'X_TOKEN', fileFlag: 'token-file', valueFlag: 'token' };
    const env: NodeJS.ProcessEnv = { X_TOKEN: 'from-env' };
    expect(presentedToken(src, {}, env)).toEqual({ ok: true, token: 'from-env' });
    expect(env.X_TOKEN).toBeUndefined();
    const file = join(mkdtempSync(join(tmpdir(), 'switchyard-token-')), 't');
    writeFileSync(file, 'from-file\n');
    expect(presentedToken(src, { file }, {})).toEqual({ ok: true, token: 'from-file' });
    expect(presentedToken(src, {}, {})).toEqual({ ok: true, token: undefined });
    expect(presentedToken(src, { value: 'x' }, {})).toMatchObject({ ok: false });
  });
});
