// The one table of outcome codes: every rejection and failure a client can see, with whether retrying helps.

/** Every typed outcome code switchyard returns. */
export const OUTCOME_CODES = {
  overloaded: {
    retryable: true,
    http: 429,
    meaning:
      'the predicted wait exceeds the request’s queue budget, its class’s queue is full or being shed, or no replica has KV headroom for it; retry after retryAfterMs',
  },
  model_unavailable: {
    retryable: true,
    http: 503,
    meaning:
      'no replica of the model can exist now (e.g. the large model with fewer than eight healthy GPUs); the reason says why',
  },
  model_not_found: { retryable: false, http: 404, meaning: 'unknown model or version; the message lists what exists' },
  invalid_request: {
    retryable: false,
    http: 400,
    meaning: 'bad parameters, or too long for the model’s context; never counts against a replica',
  },
  expired: {
    retryable: true,
    http: 504,
    meaning: 'the request waited its whole queue budget (or its deadline) without being served',
  },
  cancelled: { retryable: false, http: 499, meaning: 'the client cancelled the request' },
  replica_failed: {
    retryable: true,
    http: 502,
    meaning: 'the replica serving it failed and it could not be resumed elsewhere within its budget',
  },
  unauthorized: { retryable: false, http: 401, meaning: 'missing or wrong credentials' },
  internal: {
    retryable: true,
    http: 500,
    meaning: 'the server failed while handling this request; it alone ended, and what it held was released',
  },
} as const;

/** A typed outcome code. */
export type OutcomeCode = keyof typeof OUTCOME_CODES;

/** A failure as data: what crossed the boundary, whether retrying can help, and why. */
export interface Failure {
  code: OutcomeCode;
  message: string;
  retryable: boolean;
  retryAfterMs?: number;
  cause?: unknown;
}

/** Builds a Failure with the code's retryability. */
export function failure(
  code: OutcomeCode,
  message: string,
  extra: { retryAfterMs?: number; cause?: unknown } = {},
): Failure {
  return { code, message, retryable: OUTCOME_CODES[code].retryable, ...extra };
}

/** The outcome table as Markdown (docs/outcomes.md embeds it; a test keeps the two in step). */
export function outcomesMarkdown(): string {
  const rows = Object.entries(OUTCOME_CODES).map(
    ([code, o]) => `| \`${code}\` | ${o.http} | ${o.retryable ? 'yes' : 'no'} | ${o.meaning} |`,
  );
  return ['| code | HTTP | retryable | meaning |', '|---|---|---|---|', ...rows].join('\n') + '\n';
}
