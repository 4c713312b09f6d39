// The semantic cases of the HTTP fuzzer (`npm run fuzz:http -- --semantic`): well-framed requests whose meaning is
// hostile. Every body field the OpenAI routes read (from their own schemas, so a field added there is fuzzed here),
// the chat messages inside, the headers the edge reads (Authorization, Host, Origin, Content-Type), /v1/models, and
// the admin routes as a client without the admin token meets them, take values from the hostile dictionary. A body
// the route's own parser refuses must get 400; one it accepts may be served or refused with a typed status; none may
// get 500 or leave its request live.
import { chatBody, completionBody, parseChat, parseCompletion } from '../../api/http/openai.ts';
import type { Rng } from '../../runtime/rng.ts';
import type { Framed } from './http-cases.ts';
import { FUZZ_MODEL } from './live.ts';
import { HOSTILE, PROTO_NAMES, brief, jsonText, mutate, type FieldSpec } from './hostile.ts';

const NEAR: Readonly<Record<string, readonly unknown[]>> = {
  model: [FUZZ_MODEL, 'LLAMA-3-8B', `${FUZZ_MODEL} `, `${FUZZ_MODEL}@v1`, 'gpt-4'],
  max_tokens: [1, 2, 16, 8192, 1_000_000, null],
  max_completion_tokens: [1, 16, 8192, null],
  stream: [true, false, null, 'true', 1],
  n: [1, 2, null, '1'],
  stream_options: [{ include_usage: true }, { include_usage: 'yes' }, null, {}],
  priority: ['interactive', 'batch', 'Interactive', 'realtime', 'default'],
  deadline_ms: [0, 1, 1e9, 1e9 + 1],
  temperature: [0, 2, 2.0001, null],
  top_p: [0, 1, 1.0001, null],
  seed: [0, 2 ** 32 - 1, 2 ** 32, null],
  stop: ['\n', ['\n'], [], ['a', 'b', 'c', 'd', 'e'], '', null],
  logprobs: [true, false, 0, 5, 6, -1, 'yes', null],
  top_logprobs: [0, 20, 21, -1, null],
  response_format: [
    null,
    { type: 'text' },
    { type: 'json_object' },
    { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } },
    { type: 'json_schema', json_schema: { schema: { type: 'nope', constructor: {} } } },
    { type: 'xml' },
    'json',
  ],
  prompt: ['', 'hi', ['hi'], [], ['a', 'b'], 'x'.repeat(20_000)],
  messages: [[], [{ role: 'user' }], [{ role: 'user', content: null }], [{ content: 'hi' }]],
};

const specsOf = (fields: readonly string[], extra: readonly FieldSpec[]): FieldSpec[] => [
  ...fields.map((f) => {
    const near = NEAR[f];
    if (near === undefined) throw new Error(`http-semantic: no near values for the body field ${f}`);
    return { path: [f], near };
  }),
  ...extra,
];
const includeUsage: FieldSpec = { path: ['stream_options', 'include_usage'], near: [true, false, null] };
/** Every field /v1/completions reads. */
const COMPLETION_SPECS = specsOf(Object.keys(completionBody.fields!), [includeUsage]);
/** Every field /v1/chat/completions reads, the messages' own fields included. */
const CHAT_SPECS = specsOf(Object.keys(chatBody.fields!), [
  includeUsage,
  { path: ['messages', 0, 'role'], near: ['user', 'system', 'assistant', 'tool', ''] },
  { path: ['messages', 0, 'content'], near: ['hi', '', null, [], [{ type: 'text', text: 'hi' }], [{}]] },
  { path: ['messages', 0, 'content', 0, 'type'], near: ['text', 'image_url'] },
  { path: ['messages', 0, 'content', 0, 'text'], near: ['hi', ''] },
  { path: ['messages', 1], near: [{ role: 'user', content: 'more' }, {}] },
]);

/**
 * Hostile header values: the dictionary's strings and prototype names as tokens. Control characters are left out:
 * node's parser refuses them and drops the connection with every request pipelined on it (the raw cases cover that).
 */
const HEADER_VALUES: readonly string[] = [
  ...HOSTILE.filter((v): v is string => typeof v === 'string' && v.length < 5000 && !/[\u0000-\u001f\u007f]/.test(v)),
  ...PROTO_NAMES.map((p) => `Bearer ${p}`),
  'Bearer ',
  'Bearer',
  `Bearer ${'a'.repeat(4000)}`,
  'Basic Zm9vOmJhcg==',
  'application/json; charset=toString',
  'application/constructor+json',
  'http://127.0.0.1',
  'null',
];
const HEADERS = ['Authorization', 'Host', 'Origin', 'Content-Type'] as const;

/** A status outside the client's typed answers: 500 (or a closed socket, a stall) is never expected. */
const served = (s: number): boolean => [200, 400, 404, 429, 503, 504].includes(s);
const refused = (s: number): boolean => s === 400;
/** Header cases: the edge may refuse (403 Host or Origin, 415 content type) besides the route's own answers. */
const edged = (s: number): boolean => served(s) || s === 403 || s === 415;

/** A request's bytes; the Host header is left out when `headers` has one. */
function request(method: string, path: string, headers: Record<string, string>, body: string | null): string {
  let head = `${method} ${path} HTTP/1.1\r\n`;
  if (!('Host' in headers)) head += 'Host: 127.0.0.1\r\n';
  for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`;
  if (body === null) return `${head}\r\n`;
  return `${head}Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

/** What the route's own parser makes of a body's text: 400 unless it parses and validates. */
function bodyExpectation(text: string, chat: boolean): (s: number) => boolean {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return refused;
  }
  const p = chat ? parseChat(value) : parseCompletion(value);
  return 'code' in p ? refused : served;
}

/** Every UTF-8 byte of `s` percent-encoded (a lone surrogate too, as U+FFFD). */
const percent = (s: string): string => [...Buffer.from(s)].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('');

const pick = <T>(r: Rng, xs: readonly T[]): T => xs[r.int(xs.length)]!;

function framed(kind: string, bytes: string, closes: boolean, ok: (s: number) => boolean, what: string): Framed {
  return { type: 'framed', kind, bytes, head: false, closes, ok, what };
}

/** A completion or chat body with hostile fields. */
function drawBody(r: Rng): Framed {
  const chat = r.int(2) === 0;
  const base: Record<string, unknown> = chat
    ? { model: FUZZ_MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 + r.int(16) }
    : { model: FUZZ_MODEL, prompt: 'hi', max_tokens: 1 + r.int(16) };
  if (r.int(4) === 0) base['stream'] = true;
  const m = mutate(base, chat ? CHAT_SPECS : COMPLETION_SPECS, r);
  const text = jsonText(m.value);
  const path = chat ? '/v1/chat/completions' : '/v1/completions';
  return framed(
    chat ? 'chat' : 'completion',
    request('POST', path, {}, text),
    false,
    bodyExpectation(text, chat),
    m.changes.join(', '),
  );
}

/** A valid completion (or GET /v1/models) with one header the edge reads set to a hostile value. */
function drawHeader(r: Rng): Framed {
  const name = HEADERS[r.int(HEADERS.length)]!;
  const value = HEADER_VALUES[r.int(HEADER_VALUES.length)]!;
  const what = `${name}: ${brief(value)}`;
  if (name === 'Content-Type' || r.int(3) > 0) {
    const body = `{"model":"${FUZZ_MODEL}","prompt":"hi","max_tokens":${1 + r.int(8)}}`;
    let bytes = request('POST', '/v1/completions', name === 'Content-Type' ? {} : { [name]: value }, body);
    if (name === 'Content-Type') bytes = bytes.replace('Content-Type: application/json', `Content-Type: ${value}`);
    return framed('header', bytes, false, edged, what);
  }
  return framed('models', request('GET', '/v1/models', { [name]: value }, null), false, edged, what);
}

/** An admin route as a client without the admin token reaches it: hostile paths, bodies and tokens, all 401. */
function drawAdmin(r: Rng): Framed {
  const hostile = HOSTILE[r.int(HOSTILE.length)];
  // Short segments only: a long path is refused by node itself (431), which drops the connection.
  const seg = percent(typeof hostile === 'string' && hostile.length < 200 ? hostile : brief(hostile)) || 'x';
  const body = jsonText(
    pick(r, [{ policy: hostile }, { deadlineMs: hostile }, { model: hostile, from: 'v1', to: 'v2', steps: hostile }]),
  );
  const path = pick(r, [
    '/admin/status',
    '/admin/routing',
    '/admin/placement',
    '/admin/rollout',
    `/admin/replicas/${seg}/drain`,
    `/admin/gpus/${r.int(10)}/fail`,
    `/admin/gpus/0/${seg}`,
  ]);
  const token = pick(r, HEADER_VALUES);
  const headers: Record<string, string> = r.int(4) === 0 ? {} : { Authorization: token };
  const bytes = request(
    path === '/admin/status' ? 'GET' : 'POST',
    path,
    headers,
    path === '/admin/status' ? null : body,
  );
  return framed('admin', bytes, false, (s) => s === 401, `${path} ${brief(token)} ${body.slice(0, 60)}`);
}

/** Draws the next semantic case: bodies mostly, then headers, then the admin routes. */
export function drawSemantic(r: Rng): Framed {
  const roll = r.int(10);
  if (roll < 7) return drawBody(r);
  if (roll < 9) return drawHeader(r);
  return drawAdmin(r);
}
