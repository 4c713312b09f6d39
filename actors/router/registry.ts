// Model and version resolution: exact versions, aliases (`stable`, `latest`) and weighted splits (canaries).
import type { Rng } from '../runtime/rng.ts';
import { failure, type Failure } from '../outcomes.ts';

/** A model as the router knows it. */
export interface ModelEntry {
  name: string;
  versions: readonly string[];
  aliases: Readonly<Record<string, string>>;
  /** Weighted split for requests that name no version (canary); defaults to the `stable` alias or the first version. */
  split?: Readonly<Record<string, number>>;
}

/** A resolved model@version, or a typed failure. */
export type Resolution = { ok: true; model: string; version: string } | { ok: false; failure: Failure };

/** The router's model table. */
export interface Registry {
  resolve(model: string, version: string | undefined, rng: Rng): Resolution;
  models(): readonly ModelEntry[];
  get(model: string): ModelEntry | undefined;
}

/** Creates a registry; validates that aliases and splits name real versions. */
export function createRegistry(entries: readonly ModelEntry[]): Registry {
  const byName = new Map<string, ModelEntry & { cumulative: [string, number][] }>();
  for (const e of entries) {
    for (const [alias, v] of Object.entries(e.aliases)) {
      if (!e.versions.includes(v)) throw new Error(`models.${e.name}.aliases.${alias}: unknown version "${v}"`);
    }
    const cumulative: [string, number][] = [];
    let total = 0;
    for (const [v, w] of Object.entries(e.split ?? {})) {
      if (!e.versions.includes(v)) throw new Error(`models.${e.name}.split.${v}: unknown version`);
      if (!(w >= 0)) throw new Error(`models.${e.name}.split.${v}: weight must be >= 0`);
      total += w;
      cumulative.push([v, total]);
    }
    byName.set(e.name, { ...e, cumulative });
  }
  const listing = (): string => [...byName.values()].map((e) => `${e.name}@{${e.versions.join(',')}}`).join(', ');
  return {
    models: () => [...byName.values()],
    get: (m) => byName.get(m),
    resolve: (model, version, rng) => {
      const e = byName.get(model);
      if (!e) return { ok: false, failure: failure('model_not_found', `unknown model "${model}"; known: ${listing()}`) };
      if (version !== undefined) {
        const v = e.aliases[version] ?? version;
        if (!e.versions.includes(v)) {
          const names = [...e.versions, ...Object.keys(e.aliases)].join(', ');
          return { ok: false, failure: failure('model_not_found', `unknown version "${version}" of ${model}; known: ${names}`) };
        }
        return { ok: true, model, version: v };
      }
      const last = e.cumulative[e.cumulative.length - 1];
      if (last && last[1] > 0) {
        const x = rng.next() * last[1];
        for (const [v, c] of e.cumulative) if (x < c) return { ok: true, model, version: v };
      }
      return { ok: true, model, version: e.aliases['stable'] ?? e.versions[0]! };
    },
  };
}
