// HTTP plumbing shared by the routes: bounded JSON bodies, JSON replies, and failures mapped to status codes in the
// OpenAI error shape (429 carries Retry-After, 503 the reason).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { OUTCOME_CODES, failure, type Failure } from '../../machines/outcomes.ts';
import { fieldPath, validate, type Schema } from '../../transport/schema.ts';

/** Largest request body accepted (bytes). */
export const MAX_BODY_BYTES = 1024 * 1024;

/** Reads a JSON body of at most `limit` bytes; resolves with the value or a failure, never rejects. */
export function readJson(
  req: IncomingMessage,
  limit = MAX_BODY_BYTES,
): Promise<{ ok: true; value: unknown } | { ok: false; failure: Failure; status: number }> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (v: { ok: true; value: unknown } | { ok: false; failure: Failure; status: number }): void => {
      if (done) return;
      done = true;
      resolve(v);
    };
    const bad = (status: number, message: string): void =>
      finish({ ok: false, status, failure: { code: 'invalid_request', message, retryable: false } });
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        bad(413, `body exceeds ${limit} bytes`);
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('error', () => bad(400, 'request body could not be read'));
    req.on('end', () => {
      if (size === 0) return finish({ ok: true, value: {} });
      try {
        finish({ ok: true, value: JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown });
      } catch (e) {
        bad(400, `body is not JSON: ${(e as Error).message}`);
      }
    });
  });
}

/** Reads a JSON body and checks it against `schema` (an empty body is `{}`); failures name the field. */
export async function readBody<T>(
  req: IncomingMessage,
  schema: Schema<T>,
  limit = MAX_BODY_BYTES,
): Promise<{ ok: true; value: T } | { ok: false; failure: Failure; status: number }> {
  const body = await readJson(req, limit);
  if (!body.ok) return body;
  const v = validate(schema, body.value);
  if (v.ok) return v;
  return {
    ok: false,
    status: 400,
    failure: failure('invalid_request', `${fieldPath(v.error.path)}: ${v.error.message}`),
  };
}

/** Sends a JSON reply. */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

/** The HTTP status of a failure. */
export function statusOf(f: Failure): number {
  // A code that came over a wire may be any string: only the table's own codes are looked up in it.
  return Object.hasOwn(OUTCOME_CODES, f.code) ? OUTCOME_CODES[f.code].http : 500;
}

/** The OpenAI-style error body of a failure. */
export function errorBody(f: Failure): {
  error: { message: string; type: string; code: string; param: null; retryable: boolean; retry_after_ms?: number };
} {
  return {
    error: {
      message: f.message,
      type: f.code === 'invalid_request' || f.code === 'model_not_found' ? 'invalid_request_error' : f.code,
      code: f.code,
      param: null,
      retryable: f.retryable,
      ...(f.retryAfterMs !== undefined ? { retry_after_ms: f.retryAfterMs } : {}),
    },
  };
}

/** Sends a failure with its status; overload adds Retry-After in whole seconds (rounded up, at least 1). */
export function sendFailure(res: ServerResponse, f: Failure, status = statusOf(f)): void {
  const headers: Record<string, string> = {};
  if (f.retryAfterMs !== undefined || status === 429 || status === 503) {
    headers['Retry-After'] = String(Math.max(1, Math.ceil((f.retryAfterMs ?? 1000) / 1000)));
  }
  if (status === 401) headers['WWW-Authenticate'] = 'Bearer';
  sendJson(res, status, errorBody(f), headers);
}
