// The `fleet:` section of a scenario file: pools of 8-GPU nodes, the cluster router, node losses and rescheduling.
// Validated with the project's one schema library; an error names the field (`fleet.pools[1].models[0]: …`).
import { arr, int, num, obj, oneOf, optional, str, validate, type Infer } from '../../transport/schema.ts';
import { ConfigError, finishScenario, normalizeScenario, readScenarioFile, type Scenario } from '../config.ts';

const fleetSchema = obj({
  router: optional(oneOf('gie-like', 'predicted')),
  scrapeMs: optional(num({ min: 1, max: 60_000 })),
  rescheduleS: optional(num({ min: 0, max: 3600 })),
  maxNodesPerPool: optional(int({ min: 1, max: 256 })),
  pools: arr(
    obj({
      name: str({ min: 1, max: 40, pattern: /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/ }),
      models: arr(str({ min: 1, max: 100 }), { min: 1, max: 8 }),
      nodes: int({ min: 0, max: 256 }),
      placement: optional(oneOf('exclusive', 'switch')),
    }),
    { min: 1, max: 16 },
  ),
  nodeLoss: optional(
    arr(obj({ at: num({ min: 0, max: 1e6 }), pool: str({ min: 1, max: 40 }), node: int({ min: 0 }) })),
  ),
});

/** A fleet with every default filled in. */
export interface FleetSpec {
  router: 'gie-like' | 'predicted';
  /** How often the gie-like router scrapes each node's gauges (ms): its view is up to one interval stale. */
  scrapeMs: number;
  /** Seconds from a node's loss until its replacement pod starts booting (it then loads its models). */
  rescheduleS: number;
  /** The planner's limit when it sizes pools. */
  maxNodesPerPool: number;
  pools: { name: string; models: string[]; nodes: number; placement: 'exclusive' | 'switch' }[];
  nodeLoss: { at: number; pool: string; node: number }[];
}

/** A scenario file's fleet section as written. */
export type FleetFile = Infer<typeof fleetSchema>;

/** Validates a scenario file with a `fleet:` section: the node scenario and the fleet, each error naming its field. */
export function normalizeFleetScenario(raw: unknown): { scenario: Scenario; fleet: FleetSpec } {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new ConfigError('(root)', 'expected a mapping');
  const { fleet: rawFleet, ...rest } = raw as Record<string, unknown>;
  if (rawFleet === undefined) throw new ConfigError('fleet', 'is required for a fleet run');
  const scenario = normalizeScenario(rest);
  const v = validate(fleetSchema, rawFleet);
  if (!v.ok) throw new ConfigError(`fleet${v.error.path.replace(/^\$/, '')}`, v.error.message);
  const f = v.value;
  const names = new Set(scenario.models.map((m) => m.name));
  const poolNames = new Set<string>();
  f.pools.forEach((p, i) => {
    if (poolNames.has(p.name)) throw new ConfigError(`fleet.pools[${i}].name`, `duplicate pool ${p.name}`);
    poolNames.add(p.name);
    p.models.forEach((m, j) => {
      if (!names.has(m))
        throw new ConfigError(
          `fleet.pools[${i}].models[${j}]`,
          `unknown model ${m} (models: ${[...names].join(', ')})`,
        );
    });
  });
  for (const m of names)
    if (!f.pools.some((p) => p.models.includes(m))) throw new ConfigError('fleet.pools', `no pool serves ${m}`);
  (f.nodeLoss ?? []).forEach((l, i) => {
    const pool = f.pools.find((p) => p.name === l.pool);
    if (!pool) throw new ConfigError(`fleet.nodeLoss[${i}].pool`, `unknown pool ${l.pool}`);
    if (l.node >= pool.nodes)
      throw new ConfigError(
        `fleet.nodeLoss[${i}].node`,
        `pool ${l.pool} has ${pool.nodes} nodes (0-${pool.nodes - 1})`,
      );
  });
  return {
    scenario,
    fleet: {
      router: f.router ?? 'predicted',
      scrapeMs: f.scrapeMs ?? 50,
      rescheduleS: f.rescheduleS ?? 30,
      maxNodesPerPool: f.maxNodesPerPool ?? 16,
      pools: f.pools.map((p) => ({ ...p, placement: p.placement ?? 'exclusive' })),
      nodeLoss: f.nodeLoss ?? [],
    },
  };
}

/** Reads and validates a fleet scenario file (size-bounded like every scenario; engine files and profiles checked). */
export function loadFleetScenario(path: string): { scenario: Scenario; fleet: FleetSpec } {
  const { scenario, fleet } = normalizeFleetScenario(readScenarioFile(path));
  return { scenario: finishScenario(scenario, path), fleet };
}
