// Identifiers: deterministic, so two runs with the same seed name things the same way.

/** Generates sequential ids with a prefix (`req.1`, `req.2`, ...). */
export interface IdGen {
  next(prefix: string): string;
}

/** Creates an id generator whose counters start at 1 per prefix. */
export function createIdGen(): IdGen {
  const counters = new Map<string, number>();
  return {
    next: (prefix) => {
      const n = (counters.get(prefix) ?? 0) + 1;
      counters.set(prefix, n);
      return `${prefix}.${n}`;
    },
  };
}

/** The stable system id of a replica: `replica.<model>@<version>#<k>`. */
export const replicaId = (model: string, version: string, k: number): string => `replica.${model}@${version}#${k}`;

/** The stable system id of a GPU: `gpu.<n>`. */
export const gpuId = (n: number): string => `gpu.${n}`;
