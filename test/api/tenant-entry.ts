// A tenants-file entry for tests: no limits unless `extra` sets them.
import type { Tenant } from '../../api/tenants.ts';

/** A tenant named `name` whose tokens hash to `hashes`, with no model, class, concurrency or rate limit. */
export function tenantEntry(
  name: string,
  hashes: string[],
  extra: Partial<Tenant> = {},
): Tenant & { hashes: string[] } {
  return {
    name,
    models: null,
    priorities: null,
    weight: 1,
    maxConcurrent: null,
    tokensPerSecond: null,
    burstTokens: null,
    hashes,
    ...extra,
  };
}
