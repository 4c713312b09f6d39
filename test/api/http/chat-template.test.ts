// Chat requests to a model with a chat template: the messages reach its tokenizer as messages (not `role: text`
// lines), and a template that refuses them refuses that request alone with invalid_request, tenant or not.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../../api/server.ts';
import type { ChatMessage } from '../../../transport/client-protocol.ts';
import { MODEL, sha, startTenantServer, type LiveTenants } from './live-tenants.ts';

const TENANT = 'tenant-with-chat-0123456789';

/** A template in the manner of strict instruct templates: roles must alternate user / assistant after a system. */
function render(messages: readonly ChatMessage[]): string {
  const turns = messages[0]?.role === 'system' ? messages.slice(1) : messages;
  turns.forEach((m, i) => {
    if (m.role !== (i % 2 === 0 ? 'user' : 'assistant')) throw new Error('roles must alternate user/assistant');
  });
  return messages.map((m) => `[${m.role}]${m.content}`).join('') + '[assistant]';
}

const tokenizers = new Map([
  [
    MODEL,
    {
      // One token per character, of the prompt or of the rendered chat.
      tokenize: (text: string) => [...text].map((c) => c.charCodeAt(0)),
      tokenizeChat: (messages: readonly ChatMessage[]) => [...render(messages)].map((c) => c.charCodeAt(0)),
    },
  ],
]);

describe.each([
  ['from a tenant', TENANT],
  ['without tenants', null],
] as const)('a chat request to a model with a chat template, %s', (_name, token) => {
  let live: LiveTenants;
  let server: RunningServer;

  beforeAll(async () => {
    const tenants = `tenants:\n  - { name: t, tokenSha256: [${sha(TENANT)}] }\n`;
    live = await startTenantServer(tenants, token === null ? { tokenizers, tenants: undefined } : { tokenizers });
    server = live.server;
  }, 30_000);

  afterAll(async () => {
    await live?.stop();
  });

  const chat = async (messages: unknown[]): Promise<{ status: number; body: Record<string, unknown> }> => {
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token !== null ? { authorization: `Bearer ${token}` } : {}) },
      body: JSON.stringify({ model: MODEL, messages, max_tokens: 1 }),
    });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };

  it('counts the prompt as the template renders the messages', async () => {
    const messages = [
      { role: 'developer', content: 'Be brief.' },
      { role: 'user', content: 'Hi' },
    ];
    const r = await chat(messages);
    expect(r.status).toBe(200);
    const rendered = render([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hi' },
    ]);
    expect(r.body.usage).toMatchObject({ prompt_tokens: rendered.length });
  });

  it('refuses messages the template refuses with invalid_request, and serves the next request', async () => {
    const r = await chat([
      { role: 'user', content: 'a' },
      { role: 'user', content: 'b' },
    ]);
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({
      code: 'invalid_request',
      message: "messages: the model's chat template refused them: roles must alternate user/assistant",
    });
    expect((await chat([{ role: 'user', content: 'a' }])).status).toBe(200);
  });
});
