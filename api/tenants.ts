// Tenants: who a client token belongs to and what that tenant may use. A tokens file (YAML or JSON) maps each token's
// SHA-256 to a tenant with its allowed models and priority classes, its weight in fair queuing, and its limits.
import { createHash } from 'node:crypto';
import { parse as parseYaml } from 'yaml';
import type { TokenSet } from '../transport/ws.ts';
import { arr, dflt, fieldPath, int, num, obj, optional, refine, str, validate } from '../transport/schema.ts';

const name = str({ min: 1, max: 64, pattern: /^[A-Za-z0-9._-]+$/ });

/** One tenant as the tokens file declares it. */
const tenantSchema = obj(
  {
    name,
    /** Hex SHA-256 of each token of this tenant (`printf %s "$TOKEN" | sha256sum`). */
    tokenSha256: arr(str({ min: 64, max: 64, pattern: /^[0-9a-fA-F]{64}$/ }), { min: 1, max: 64 }),
    /** Models it may use; absent: every model. */
    models: optional(arr(str({ min: 1, max: 100 }), { min: 1, max: 64 })),
    /** Priority classes it may use; the first is its default. Absent: every class, the model's first by default. */
    priorities: optional(arr(str({ min: 1, max: 50 }), { min: 1, max: 16 })),
    /** Its share under contention, relative to the other tenants waiting (fair queuing). */
    weight: dflt(num({ min: 0.01, max: 1000 }), 1),
    /** Most requests it may have in flight (waiting or running). */
    maxConcurrent: optional(int({ min: 1, max: 1_000_000 })),
    /** Token rate: prompt plus max tokens per second, refilled continuously, with a bucket of `burstTokens`. */
    tokensPerSecond: optional(num({ min: 1, max: 1e9 })),
    burstTokens: optional(int({ min: 1, max: 1e9 })),
  },
  { strict: true },
);

/** The tokens file: its tenants, names and token hashes unique. */
export const tenantsFileSchema = refine(
  obj({ tenants: arr(tenantSchema, { min: 1, max: 10_000 }) }, { strict: true }),
  (f, refuse) => {
    const names = new Set<string>();
    const hashes = new Set<string>();
    f.tenants.forEach((t, i) => {
      if (names.has(t.name)) refuse(`tenants[${i}].name`, `"${t.name}" is used twice`);
      names.add(t.name);
      for (const h of t.tokenSha256) {
        if (hashes.has(h.toLowerCase())) refuse(`tenants[${i}].tokenSha256`, 'a token hash belongs to two tenants');
        hashes.add(h.toLowerCase());
      }
    });
    return f;
  },
);

/** A tenant: its identity, what it may use and its limits. */
export interface Tenant {
  readonly name: string;
  readonly models: readonly string[] | null;
  readonly priorities: readonly string[] | null;
  readonly weight: number;
  readonly maxConcurrent: number | null;
  readonly tokensPerSecond: number | null;
  readonly burstTokens: number | null;
}

/** The tenants of a server, found by the digest of a token in a map. */
export interface Tenants extends TokenSet {
  /** The tenant presenting `token`, or null. */
  of(token: string | null): Tenant | null;
  list(): readonly Tenant[];
}

/** The tenant plain `--client-token`s map to when a tokens file is also given: no limits, weight 1. */
export const DEFAULT_TENANT = 'default';

const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

/** Parses a tokens file's text (YAML, JSON being YAML); the error names the bad field. */
export function parseTenantsFile(text: string): { ok: true; tenants: Tenant[] } | { ok: false; message: string } {
  let raw: unknown;
  try {
    raw = parseYaml(text, { maxAliasCount: 100 });
  } catch (e) {
    return { ok: false, message: `not YAML or JSON: ${(e as Error).message.split('\n')[0]}` };
  }
  const v = validate(tenantsFileSchema, raw);
  if (!v.ok) return { ok: false, message: `${fieldPath(v.error.path)}: ${v.error.message}` };
  const tenants = v.value.tenants.map((t): Tenant & { hashes: string[] } => ({
    name: t.name,
    models: t.models ?? null,
    priorities: t.priorities ?? null,
    weight: t.weight,
    maxConcurrent: t.maxConcurrent ?? null,
    tokensPerSecond: t.tokensPerSecond ?? null,
    burstTokens: t.burstTokens ?? null,
    hashes: t.tokenSha256.map((h) => h.toLowerCase()),
  }));
  return { ok: true, tenants };
}

/** Builds the tenant table from parsed tenants (with their hashes) and plain tokens for the default tenant. */
export function createTenants(parsed: readonly Tenant[], plainTokens: readonly string[] = []): Tenants {
  // Keyed by the hex SHA-256 of the token: a lookup hashes the presented token and finds its digest in one step
  // (the map's timing depends only on the digest, which says nothing usable about the token).
  const byDigest = new Map<string, Tenant>();
  const list: Tenant[] = [];
  for (const t of parsed) {
    const { hashes, ...tenant } = t as Tenant & { hashes?: string[] };
    list.push(tenant);
    for (const h of hashes ?? []) byDigest.set(h.toLowerCase(), tenant);
  }
  if (plainTokens.length > 0) {
    const dflt: Tenant = {
      name: DEFAULT_TENANT,
      models: null,
      priorities: null,
      weight: 1,
      maxConcurrent: null,
      tokensPerSecond: null,
      burstTokens: null,
    };
    if (!list.some((t) => t.name === DEFAULT_TENANT)) list.push(dflt);
    for (const p of plainTokens) if (p.length > 0) byDigest.set(sha256(p), dflt);
  }
  const of = (token: string | null): Tenant | null => {
    if (token === null || token.length === 0) return null;
    return byDigest.get(sha256(token)) ?? null;
  };
  return { size: byDigest.size, has: (token) => of(token) !== null, of, list: () => list };
}
