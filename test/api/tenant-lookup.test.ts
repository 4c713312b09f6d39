// Tenant lookup: a presented token is hashed once and its digest found in a map, never compared against every tenant.
import { createHash } from 'node:crypto';
import type * as Crypto from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';

const compared = vi.hoisted(() => ({ n: 0 }));
vi.mock('node:crypto', async (importOriginal) => {
  const real = await importOriginal<typeof Crypto>();
  return {
    ...real,
    timingSafeEqual: (a: NodeJS.ArrayBufferView, b: NodeJS.ArrayBufferView): boolean => {
      compared.n++;
      return real.timingSafeEqual(a, b);
    },
  };
});

const { createTenants, parseTenantsFile } = await import('../../api/tenants.ts');

const hash = (t: string): string => createHash('sha256').update(t).digest('hex');

describe('tenant lookup', () => {
  it('finds one tenant among 5,000 without comparing the token against each of them', () => {
    const lines = ['tenants:'];
    for (let i = 0; i < 5_000; i++) lines.push(`  - { name: t${i}, tokenSha256: [${hash(`token-of-tenant-${i}`)}] }`);
    const parsed = parseTenantsFile(lines.join('\n'));
    expect(parsed.ok).toBe(true);
    if (!parsed.ok) return;
    const tenants = createTenants(parsed.tenants, ['a-plain-client-token-9f8e7d']);
    compared.n = 0;
    expect(tenants.of('token-of-tenant-4321')?.name).toBe('t4321');
    expect(tenants.of('a-plain-client-token-9f8e7d')?.name).toBe('default');
    expect(tenants.of('nobody-has-this-token')).toBeNull();
    expect(tenants.has('token-of-tenant-0')).toBe(true);
    // Four lookups: a linear scan makes 5,001 comparisons each.
    expect(compared.n).toBeLessThanOrEqual(4);
  });
});
