import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { OUTCOME_CODES, failure, outcomesMarkdown } from '../../../machines/outcomes.ts';

describe('outcomes', () => {
  it('documents the one table of codes in docs/outcomes.md, word for word', () => {
    const doc = readFileSync(new URL('../../../docs/outcomes.md', import.meta.url), 'utf8');
    const embedded = doc.split('<!-- outcomes:begin -->')[1]?.split('<!-- outcomes:end -->')[0];
    expect(embedded?.trim()).toBe(outcomesMarkdown().trim());
  });

  it('includes every code the issue requires', () => {
    for (const code of [
      'overloaded',
      'model_unavailable',
      'model_not_found',
      'invalid_request',
      'expired',
      'cancelled',
      'replica_failed',
    ]) {
      expect(OUTCOME_CODES).toHaveProperty(code);
    }
  });

  it('builds failures whose retryability comes from the table', () => {
    expect(failure('overloaded', 'busy', { retryAfterMs: 20 })).toEqual({
      code: 'overloaded',
      message: 'busy',
      retryable: true,
      retryAfterMs: 20,
    });
    expect(failure('invalid_request', 'bad').retryable).toBe(false);
  });
});
