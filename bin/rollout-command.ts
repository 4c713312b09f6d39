// `switchyard rollout`: starts a version rollout on a running server through its admin API (`POST /admin/rollout`)
// and prints what the server answered; a refusal (unknown model or version, one already running) exits 1.
import { flag, parseOrUsage } from './args.ts';
import { presentedToken, type TokenSource } from './secrets.ts';

const USAGE = `usage: switchyard rollout --model M --from v1 --to v2 [--steps N] [--url http://127.0.0.1:8080]
                         [--admin-token-file F | SWITCHYARD_ADMIN_TOKEN=T]
`;

const FLAGS = {
  url: flag.strOr('http://127.0.0.1:8080'),
  model: flag.str(),
  from: flag.str(),
  to: flag.str(),
  steps: flag.int({ min: 1, max: 1024 }),
  'admin-token': flag.str(),
  'admin-token-file': flag.str(),
};

/** Where the admin token comes from: the environment or a file, never a flag's value (`ps` shows those). */
const ADMIN_TOKEN: TokenSource = {
  kind: 'admin',
  env: 'SWITCHYARD_ADMIN_TOKEN',
  fileFlag: 'admin-token-file',
  valueFlag: 'admin-token',
};

/** Runs the rollout command; resolves with the exit code. */
export async function runRolloutCommand(argv: string[]): Promise<number> {
  const args = parseOrUsage('rollout', USAGE, argv, FLAGS, { maxPositionals: 0 });
  if (!args) return 2;
  const { url, model, from, to, steps } = args.values;
  const given = presentedToken(ADMIN_TOKEN, {
    value: args.values['admin-token'],
    file: args.values['admin-token-file'],
  });
  if (!given.ok) {
    process.stderr.write(`switchyard rollout: ${given.message}\n`);
    return 2;
  }
  const token = given.token;
  if (!model || !from || !to || !token) {
    process.stderr.write(`switchyard rollout: --model, --from, --to and an admin token are required\n${USAGE}`);
    return 2;
  }
  let res: Response;
  try {
    res = await fetch(`${url.replace(/\/$/, '')}/admin/rollout`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ model, from, to, ...(steps !== undefined ? { steps } : {}) }),
      signal: AbortSignal.timeout(10_000),
    });
  } catch (e) {
    process.stderr.write(`switchyard rollout: cannot reach ${url}: ${(e as Error).message}\n`);
    return 1;
  }
  const text = await res.text();
  if (res.status !== 202) {
    process.stderr.write(`switchyard rollout: refused (HTTP ${res.status}): ${text}\n`);
    return 1;
  }
  process.stdout.write(`${text}\n`);
  return 0;
}
