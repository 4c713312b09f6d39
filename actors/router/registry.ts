// Model and version resolution: exact versions, aliases (`stable`, `latest`) and weighted splits (canaries).
// The table can change while serving (a rollout moves an alias or a split); every change is validated.
import type { Rng } from '../../runtime/rng.ts';
import { failure, type Failure } from '../../machines/outcomes.ts';

/** A model as the router knows it. */
export interface ModelEntry {
  name: string;
  versions: readonly string[];
  /** Aliases to versions; `latest` defaults to the last version and `stable` to the first when not given. */
  aliases: Readonly<Record<string, string>>;
  /** Weighted split for requests that name no version (canary); without one they go to `stable`. */
  split?: Readonly<Record<string, number>>;
}

/** How a version was chosen: named exactly (`pinned`), through an alias, a weighted split, or the default. */
export type ResolvedBy = 'exact' | 'alias' | 'split' | 'default';

/** A resolved model@version, or a typed failure. */
export type Resolution =
  | {
      ok: true;
      model: string;
      version: string;
      by: ResolvedBy;
      /** Versions acceptable instead when `version` has no ready replica. */ fallbacks: readonly string[];
    }
  | { ok: false; failure: Failure };

/** The router's model table. */
export interface Registry {
  resolve(model: string, version: string | undefined, rng: Rng): Resolution;
  /** Refuses a model, or a version or alias of it, that the table does not know (model_not_found); draws nothing. */
  check(model: string, version: string | undefined): Failure | null;
  models(): readonly ModelEntry[];
  get(model: string): ModelEntry | undefined;
  /** Points an alias at a version (a rollout promoting a version); returns a failure if either is unknown. */
  setAlias(model: string, alias: string, version: string): Failure | null;
  /** Replaces the weighted split of a model (null removes it). */
  setSplit(model: string, split: Readonly<Record<string, number>> | null): Failure | null;
}

interface Entry {
  name: string;
  versions: readonly string[];
  /** Alias names come from clients and the admin API: a Map, never an object's properties. */
  aliases: Map<string, string>;
  split?: Readonly<Record<string, number>>;
  cumulative: [string, number][];
  /** Fallbacks per chosen version, computed once (admission asks per request); cleared when aliases or split
   * change. */
  fallbacks: Map<string, readonly string[]>;
}

const NONE: readonly string[] = Object.freeze([]);

/** Cumulative weights of a split, validated against the versions; throws naming the bad entry. */
function cumulativeOf(
  name: string,
  versions: readonly string[],
  split: Readonly<Record<string, number>> | undefined,
): [string, number][] {
  const out: [string, number][] = [];
  let total = 0;
  for (const [v, w] of Object.entries(split ?? {})) {
    if (!versions.includes(v)) throw new Error(`models.${name}.split.${v}: unknown version`);
    if (!(w >= 0) || !Number.isFinite(w))
      throw new Error(`models.${name}.split.${v}: weight must be a finite number >= 0`);
    if (w === 0) continue;
    total += w;
    out.push([v, total]);
  }
  return out;
}

/** Creates a registry; validates that aliases and splits name real versions. */
export function createRegistry(entries: readonly ModelEntry[]): Registry {
  const byName = new Map<string, Entry>();
  for (const e of entries) {
    if (e.versions.length === 0) throw new Error(`models.${e.name}.versions: at least one version`);
    const aliases = new Map<string, string>([
      ['stable', e.versions[0]!],
      ['latest', e.versions[e.versions.length - 1]!],
      ...Object.entries(e.aliases),
    ]);
    for (const [alias, v] of aliases) {
      if (!e.versions.includes(v)) throw new Error(`models.${e.name}.aliases.${alias}: unknown version "${v}"`);
    }
    const cumulative = cumulativeOf(e.name, e.versions, e.split);
    byName.set(e.name, {
      name: e.name,
      versions: e.versions,
      aliases,
      ...(e.split ? { split: e.split } : {}),
      cumulative,
      fallbacks: new Map(),
    });
  }
  const listing = (): string => [...byName.values()].map((e) => `${e.name}@{${e.versions.join(',')}}`).join(', ');
  // Unpinned requests may go to any version the model is advertising (split members, then aliases), in that order.
  const fallbacksOf = (e: Entry, chosen: string): readonly string[] => {
    const known = e.fallbacks.get(chosen);
    if (known) return known;
    const out: string[] = [];
    for (const [v] of e.cumulative) if (v !== chosen && !out.includes(v)) out.push(v);
    for (const a of ['stable', 'latest']) {
      const v = e.aliases.get(a);
      if (v !== undefined && v !== chosen && !out.includes(v)) out.push(v);
    }
    e.fallbacks.set(chosen, Object.freeze(out));
    return out;
  };

  const entryOf = (e: Entry): ModelEntry => ({
    name: e.name,
    versions: e.versions,
    aliases: Object.fromEntries(e.aliases),
    ...(e.split ? { split: e.split } : {}),
  });
  // The model's entry and, for a request naming a version, that version (itself or an alias's); or what is unknown.
  const lookup = (model: string, version: string | undefined): Failure | { e: Entry; pinned: string | undefined } => {
    const e = byName.get(model);
    if (!e) return failure('model_not_found', `unknown model "${model}"; known: ${listing()}`);
    if (version === undefined || e.versions.includes(version)) return { e, pinned: version };
    const v = e.aliases.get(version);
    if (v !== undefined) return { e, pinned: v };
    const names = [...e.versions, ...e.aliases.keys()].join(', ');
    return failure('model_not_found', `unknown version "${version}" of ${model}; known: ${names}`);
  };

  return {
    models: () => [...byName.values()].map(entryOf),
    get: (m) => {
      const e = byName.get(m);
      return e ? entryOf(e) : undefined;
    },
    check: (model, version) => {
      const found = lookup(model, version);
      return 'code' in found ? found : null;
    },
    resolve: (model, version, rng) => {
      const found = lookup(model, version);
      if ('code' in found) return { ok: false, failure: found };
      const { e, pinned } = found;
      if (pinned !== undefined) {
        if (pinned === version) return { ok: true, model, version, by: 'exact', fallbacks: NONE };
        return { ok: true, model, version: pinned, by: 'alias', fallbacks: fallbacksOf(e, pinned) };
      }
      const last = e.cumulative[e.cumulative.length - 1];
      if (last) {
        const x = rng.next() * last[1];
        for (const [v, c] of e.cumulative)
          if (x < c) return { ok: true, model, version: v, by: 'split', fallbacks: fallbacksOf(e, v) };
      }
      const v = e.aliases.get('stable')!;
      return { ok: true, model, version: v, by: 'default', fallbacks: fallbacksOf(e, v) };
    },
    setAlias: (model, alias, version) => {
      const e = byName.get(model);
      if (!e) return failure('model_not_found', `unknown model "${model}"`);
      if (!e.versions.includes(version)) return failure('model_not_found', `unknown version "${version}" of ${model}`);
      if (e.versions.includes(alias))
        return failure('invalid_request', `alias "${alias}" would shadow a version of ${model}`);
      e.aliases.set(alias, version);
      e.fallbacks.clear();
      return null;
    },
    setSplit: (model, split) => {
      const e = byName.get(model);
      if (!e) return failure('model_not_found', `unknown model "${model}"`);
      try {
        e.cumulative = cumulativeOf(model, e.versions, split ?? undefined);
      } catch (err) {
        return failure('invalid_request', (err as Error).message);
      }
      if (split) e.split = split;
      else delete e.split;
      e.fallbacks.clear();
      return null;
    },
  };
}
