// `switchyard chat --model <name> "prompt"`: streams a reply from a running server into the terminal.
import { connectClient, type SwitchyardError } from '../api/client.ts';
import { flag, parseOrUsage } from './args.ts';
import { presentedToken, type TokenSource } from './secrets.ts';

/** Where the client token comes from: the environment or a file, never a flag's value (`ps` shows those). */
const CLIENT_TOKEN: TokenSource = {
  kind: 'client',
  env: 'SWITCHYARD_CLIENT_TOKEN',
  fileFlag: 'token-file',
  valueFlag: 'token',
};

const USAGE = `usage: switchyard chat --model <name> "prompt" [--url http://127.0.0.1:8080] [--token-file F | SWITCHYARD_CLIENT_TOKEN=T]
                      [--max-tokens 64] [--priority interactive] [--json-frames]
`;

const FLAGS = {
  model: flag.str(),
  url: flag.str(),
  token: flag.str(),
  'token-file': flag.str(),
  'max-tokens': flag.intOr(64, { min: 1, max: 1_000_000 }),
  priority: flag.str(),
  version: flag.str(),
  'json-frames': flag.bool(),
};

/** Runs the chat command; resolves with the exit code (0 done, 1 failed, 2 usage). */
export async function runChatCommand(argv: string[]): Promise<number> {
  const args = parseOrUsage('chat', USAGE, argv, FLAGS);
  if (!args) return 2;
  const { model, priority, version } = args.values;
  const prompt = args.positionals.join(' ');
  if (model === undefined || prompt.length === 0) {
    process.stderr.write(USAGE);
    return 2;
  }
  const url = args.values.url ?? process.env['SWITCHYARD_URL'] ?? 'http://127.0.0.1:8080';
  const given = presentedToken(CLIENT_TOKEN, { value: args.values.token, file: args.values['token-file'] });
  if (!given.ok) {
    process.stderr.write(`switchyard chat: ${given.message}\n`);
    return 2;
  }
  const token = given.token;
  let client;
  try {
    client = await connectClient(url, {
      ...(token ? { token } : {}),
      format: args.values['json-frames'] ? 'json' : 'msgpack',
    });
  } catch (e) {
    process.stderr.write(`switchyard chat: cannot connect to ${url}: ${(e as Error).message}\n`);
    return 1;
  }
  const stream = client.stream({
    model,
    prompt,
    maxTokens: args.values['max-tokens'],
    ...(priority !== undefined ? { priority } : {}),
    ...(version !== undefined ? { version } : {}),
  });
  const stop = (): void => stream.cancel();
  process.once('SIGINT', stop);
  try {
    for await (const chunk of stream) process.stdout.write(chunk.text);
    const r = await stream.result;
    if (r.ok)
      process.stderr.write(
        `\n[${r.usage.completionTokens} tokens, ${r.finishReason}; ttft ${r.timings.ttftMs.toFixed(1)} ms, total ${r.timings.e2eMs.toFixed(1)} ms; backend ${client.backend}]\n`,
      );
    return 0;
  } catch (e) {
    const err = e as SwitchyardError;
    const retry = err.retryAfterMs !== undefined ? ` (retry after ${err.retryAfterMs} ms)` : '';
    process.stderr.write(`\nswitchyard chat: ${err.message}${retry}\n`);
    return 1;
  } finally {
    process.off('SIGINT', stop);
    client.close();
  }
}
