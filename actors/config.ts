// The deployment and scenario file: validated at load, every error naming its field, defaults filled in one place.
import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { parse } from 'yaml';
import { arr, bool, int, num, obj, oneOf, optional, record, str, validate, type Infer } from '../transport/schema.ts';
import { GPU_PROFILES, MODEL_PROFILES } from './gpu/profiles.ts';
import { applyCalibrations } from './calibration.ts';
import { DEFAULT_EJECTION, type EjectionConfig } from './router/health.ts';
import type { ClassLimits } from './router/router.ts';
import {
  checkPlacementSections,
  detectionDefaults,
  detectionSchema,
  placementDefaults,
  placementSchema,
  plannerDefaults,
  plannerSchema,
  type DetectionConfig,
  type PlacementConfig,
  type PlannerConfig,
} from './placement/config.ts';

const pos = num({ min: 0, max: 1e12 });
const classSchema = obj({
  ttftMs: optional(pos),
  tpotMs: optional(pos),
  maxQueueMs: optional(pos),
  maxQueued: optional(int({ min: 0 })),
  maxQueuedTokens: optional(int({ min: 0 })),
  shedAt: optional(num({ min: 0, max: 1 })),
});
const lengthDist = obj({
  mean: num({ min: 1, max: 1e6 }),
  cv: optional(num({ min: 0, max: 10 })),
  max: optional(int({ min: 1 })),
});

const modelSchema = obj({
  name: str({ min: 1, max: 100, pattern: /^[A-Za-z0-9._-]+$/ }),
  profile: oneOf(...(Object.keys(MODEL_PROFILES) as [string, ...string[]])),
  kind: optional(oneOf('generate', 'stateless')),
  tp: optional(int({ min: 1, max: 8 })),
  replicas: optional(int({ min: 0, max: 64 })),
  versions: optional(arr(str({ min: 1, max: 50 }), { min: 1, max: 16 })),
  aliases: optional(record(str({ min: 1, max: 50 }), { max: 16 })),
  split: optional(record(num({ min: 0, max: 1e6 }), { max: 16 })),
  batching: optional(
    obj({
      policy: optional(oneOf('chunked', 'prefill-first', 'static')),
      maxRunning: optional(int({ min: 1, max: 100_000 })),
      tokenBudget: optional(int({ min: 1, max: 1_000_000 })),
      blockTokens: optional(int({ min: 1, max: 1024 })),
      maxContext: optional(int({ min: 16, max: 1_000_000 })),
      watermark: optional(num({ min: 0, max: 0.5 })),
      kvBlocks: optional(int({ min: 1 })),
      // Dynamic batching of `kind: stateless` models.
      maxBatch: optional(int({ min: 1, max: 4096 })),
      maxBatchTokens: optional(int({ min: 1, max: 10_000_000 })),
      maxDelayMs: optional(num({ min: 0, max: 60_000 })),
      buckets: optional(arr(int({ min: 1, max: 1_000_000 }), { min: 1, max: 64 })),
    }),
  ),
  classes: optional(record(classSchema, { max: 8 })),
  resume: optional(obj({ maxResumes: optional(int({ min: 0, max: 10 })), budgetMs: optional(pos) })),
  estimate: optional(oneOf('maxTokens', 'oracle')),
  /** What runs the steps: the roofline in time (default) or llama.cpp on `file`. */
  engine: optional(oneOf('cost-model', 'llama.cpp')),
  /** GGUF model file of a llama.cpp engine. */
  file: optional(str({ min: 1, max: 4096 })),
  /** Calibrated engine profile (see `switchyard calibrate`): a name in profiles/ next to the config, or a .json path. */
  calibration: optional(str({ min: 1, max: 4096 })),
});

const trafficSchema = obj({
  model: str({ min: 1, max: 100 }),
  version: optional(str({ min: 1, max: 50 })),
  priority: optional(str({ min: 1, max: 50 })),
  requests: int({ min: 0, max: 10_000_000 }),
  lengths: obj({
    trace: optional(oneOf('splitwise_conv', 'splitwise_code', 'arxiv_summarization')),
    maxTotalTokens: optional(int({ min: 2 })),
    prompt: optional(lengthDist),
    output: optional(lengthDist),
    maxTokens: optional(int({ min: 1 })),
  }),
  arrival: obj({
    process: oneOf('trace', 'poisson', 'gamma', 'burst'),
    rate: optional(num({ min: 0, max: 1e7 })),
    cv: optional(num({ min: 0, max: 100 })),
    start: optional(pos),
    timeScale: optional(num({ min: 1e-6, max: 1e6 })),
  }),
  deadlineMs: optional(pos),
});

const faultSchema = obj({
  at: pos,
  gpu: int({ min: 0, max: 63 }),
  kind: oneOf('fault', 'hang', 'straggle', 'crash'),
  factor: optional(num({ min: 1, max: 100 })),
  repairAt: optional(pos),
});

/** The schema of a scenario (or serving config) file. */
export const scenarioSchema = obj({
  name: optional(str({ max: 200 })),
  seed: optional(int({ min: 0, max: 2 ** 31 - 1 })),
  node: optional(
    obj({
      gpu: optional(oneOf(...(Object.keys(GPU_PROFILES) as [string, ...string[]]))),
      gpus: optional(int({ min: 1, max: 64 })),
      repairMs: optional(pos),
    }),
  ),
  routing: optional(
    obj({
      policy: optional(oneOf('cost', 'round-robin', 'least-requests', 'power-of-two')),
      ejection: optional(
        obj({
          slowFactor: optional(num({ min: 1, max: 100 })),
          minSteps: optional(int({ min: 1, max: 1_000_000 })),
          alpha: optional(num({ min: 0.001, max: 1 })),
          failures: optional(int({ min: 1, max: 1000 })),
          baseEjectionMs: optional(pos),
          maxEjectionMs: optional(pos),
          maxEjectedFraction: optional(num({ min: 0, max: 1 })),
        }),
      ),
    }),
  ),
  placement: optional(placementSchema),
  detection: optional(detectionSchema),
  planner: optional(plannerSchema),
  models: arr(modelSchema, { min: 1, max: 16 }),
  traffic: optional(arr(trafficSchema, { max: 64 })),
  faults: optional(arr(faultSchema, { max: 1000 })),
  sim: optional(
    obj({
      checkInvariants: optional(bool()),
      latencyMs: optional(num({ min: 0, max: 10_000 })),
      jitterMs: optional(num({ min: 0, max: 10_000 })),
      maxSimSeconds: optional(pos),
    }),
  ),
});

/** A scenario file as written. */
export type ScenarioFile = Infer<typeof scenarioSchema>;

/** A priority class with every default filled in: the router's limits, named. */
export interface ClassConfig extends Required<ClassLimits> {
  name: string;
}

/** A model with every default filled in. */
export interface ModelConfig {
  name: string;
  profile: string;
  kind: 'generate' | 'stateless';
  tp: number;
  replicas: number;
  versions: string[];
  aliases: Record<string, string>;
  split?: Record<string, number>;
  batching: {
    policy: 'chunked' | 'prefill-first' | 'static';
    maxRunning: number;
    tokenBudget: number;
    blockTokens: number;
    maxContext: number;
    watermark: number;
    kvBlocks?: number;
    /** Dynamic batching of a stateless model: batch size, padded tokens, the oldest member's wait, input-length buckets. */
    stateless: { maxBatch: number; maxBatchTokens: number; maxDelayMs: number; buckets: number[] };
  };
  classes: ClassConfig[];
  resume: { maxResumes: number; budgetMs: number };
  estimate: 'maxTokens' | 'oracle';
  engine: 'cost-model' | 'llama.cpp';
  file?: string;
  /** Path of the calibrated engine profile whose step times, cache and load time replace the roofline's. */
  calibration?: string;
}

/** A scenario with every default filled in. */
export interface Scenario {
  name: string;
  seed: number;
  node: { gpu: string; gpus: number; repairMs: number };
  routing: { policy: 'cost' | 'round-robin' | 'least-requests' | 'power-of-two'; ejection: EjectionConfig };
  placement: PlacementConfig;
  detection: DetectionConfig;
  planner: PlannerConfig;
  models: ModelConfig[];
  traffic: NonNullable<ScenarioFile['traffic']>;
  faults: NonNullable<ScenarioFile['faults']>;
  sim: { checkInvariants: boolean; latencyMs: number; jitterMs: number; maxSimSeconds: number };
}

/** A config error that names the bad field. */
export class ConfigError extends Error {
  constructor(
    readonly path: string,
    message: string,
  ) {
    super(`${path}: ${message}`);
    this.name = 'ConfigError';
  }
}

const DEFAULT_CLASSES: Record<string, Omit<ClassConfig, 'name' | 'rank' | 'shedAt'>> = {
  interactive: { ttftMs: 2000, tpotMs: 100, maxQueueMs: 10_000, maxQueued: 4096, maxQueuedTokens: 8_000_000 },
  batch: { ttftMs: 60_000, tpotMs: 1000, maxQueueMs: 120_000, maxQueued: 2048, maxQueuedTokens: 4_000_000 },
};

/** Validates a parsed scenario object and fills defaults; throws ConfigError naming the field. */
export function normalizeScenario(raw: unknown): Scenario {
  const v = validate(scenarioSchema, raw);
  if (!v.ok) throw new ConfigError(v.error.path.replace(/^\$\.?/, '') || '(root)', v.error.message);
  const f = v.value;
  const models: ModelConfig[] = f.models.map((m, i) => {
    const versions = m.versions ?? ['v1'];
    const aliases = { ...(m.aliases ?? {}) };
    for (const [a, ver] of Object.entries(aliases)) {
      if (!versions.includes(ver))
        throw new ConfigError(
          `models[${i}].aliases.${a}`,
          `names unknown version "${ver}" (versions: ${versions.join(', ')})`,
        );
    }
    for (const ver of Object.keys(m.split ?? {})) {
      if (!versions.includes(ver))
        throw new ConfigError(`models[${i}].split.${ver}`, `unknown version (versions: ${versions.join(', ')})`);
    }
    const profile = MODEL_PROFILES[m.profile]!;
    const classNames = Object.keys(m.classes ?? DEFAULT_CLASSES);
    const classes = classNames.map((name, rank) => {
      const given = m.classes?.[name] ?? {};
      const base = DEFAULT_CLASSES[name] ?? DEFAULT_CLASSES['interactive']!;
      return {
        name,
        rank,
        ttftMs: given.ttftMs ?? base.ttftMs,
        tpotMs: given.tpotMs ?? base.tpotMs,
        maxQueueMs: given.maxQueueMs ?? base.maxQueueMs,
        maxQueued: given.maxQueued ?? base.maxQueued,
        maxQueuedTokens: given.maxQueuedTokens ?? base.maxQueuedTokens,
        shedAt: given.shedAt ?? (rank === 0 ? 1 : 0.5),
      };
    });
    const tp = m.tp ?? 1;
    return {
      name: m.name,
      profile: m.profile,
      kind: m.kind ?? 'generate',
      tp,
      replicas: m.replicas ?? 1,
      versions,
      aliases,
      ...(m.split ? { split: m.split } : {}),
      batching: {
        policy: m.batching?.policy ?? 'chunked',
        maxRunning: m.batching?.maxRunning ?? 256,
        tokenBudget: m.batching?.tokenBudget ?? 2048,
        blockTokens: m.batching?.blockTokens ?? 16,
        maxContext: m.batching?.maxContext ?? profile.maxContext,
        watermark: m.batching?.watermark ?? 0.01,
        ...(m.batching?.kvBlocks ? { kvBlocks: m.batching.kvBlocks } : {}),
        stateless: statelessBatching(m.batching ?? {}, m.batching?.maxContext ?? profile.maxContext, i),
      },
      classes,
      resume: { maxResumes: m.resume?.maxResumes ?? 1, budgetMs: m.resume?.budgetMs ?? 30_000 },
      estimate: m.estimate ?? 'maxTokens',
      engine: m.engine ?? 'cost-model',
      ...(m.file ? { file: m.file } : {}),
      ...(m.calibration ? { calibration: m.calibration } : {}),
    };
  });
  const names = new Set<string>();
  models.forEach((m, i) => {
    if (m.engine === 'llama.cpp' && !m.file) throw new ConfigError(`models[${i}].file`, 'required by engine llama.cpp');
    if (names.has(m.name)) throw new ConfigError(`models[${i}].name`, `duplicate model "${m.name}"`);
    names.add(m.name);
  });
  const gpus = f.node?.gpus ?? 8;
  (f.traffic ?? []).forEach((t, i) => {
    const m = models.find((x) => x.name === t.model);
    if (!m)
      throw new ConfigError(`traffic[${i}].model`, `unknown model "${t.model}" (models: ${[...names].join(', ')})`);
    if (t.priority && !m.classes.some((c) => c.name === t.priority)) {
      throw new ConfigError(
        `traffic[${i}].priority`,
        `unknown class "${t.priority}" (classes: ${m.classes.map((c) => c.name).join(', ')})`,
      );
    }
    if (!t.lengths.trace && !(t.lengths.prompt && t.lengths.output)) {
      throw new ConfigError(`traffic[${i}].lengths`, 'give a trace, or both prompt and output distributions');
    }
    if (t.arrival.process === 'trace' && !t.lengths.trace) {
      throw new ConfigError(`traffic[${i}].arrival.process`, '"trace" arrivals need lengths.trace with timestamps');
    }
    if (t.arrival.process !== 'trace' && t.arrival.rate === undefined) {
      throw new ConfigError(`traffic[${i}].arrival.rate`, `required for ${t.arrival.process} arrivals`);
    }
  });
  const planner = plannerDefaults(f.planner);
  const bad = checkPlacementSections(models, gpus, planner);
  if (bad) throw new ConfigError(bad.path, bad.message);
  (f.faults ?? []).forEach((x, i) => {
    if (x.gpu >= gpus) throw new ConfigError(`faults[${i}].gpu`, `the node has ${gpus} GPUs (0-${gpus - 1})`);
  });
  return {
    name: f.name ?? 'scenario',
    seed: f.seed ?? 1,
    node: { gpu: f.node?.gpu ?? 'H100-SXM', gpus, repairMs: f.node?.repairMs ?? 60_000 },
    routing: {
      policy: f.routing?.policy ?? 'cost',
      ejection: { ...DEFAULT_EJECTION, ...definedOnly(f.routing?.ejection ?? {}) },
    },
    placement: placementDefaults(f.placement),
    detection: detectionDefaults(f.detection),
    planner,
    models,
    traffic: f.traffic ?? [],
    faults: f.faults ?? [],
    sim: {
      checkInvariants: f.sim?.checkInvariants ?? true,
      latencyMs: f.sim?.latencyMs ?? 0.05,
      jitterMs: f.sim?.jitterMs ?? 0,
      maxSimSeconds: f.sim?.maxSimSeconds ?? 36_000,
    },
  };
}

/** The fields of `o` that are set (so an explicit undefined never overrides a default). */
function definedOnly<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** Stateless batching settings with defaults: 32 per batch, 16k padded tokens, 5 ms delay, power-of-two buckets. */
function statelessBatching(
  b: { maxBatch?: number; maxBatchTokens?: number; maxDelayMs?: number; buckets?: number[] },
  maxContext: number,
  i: number,
): ModelConfig['batching']['stateless'] {
  const buckets: number[] = [];
  if (b.buckets) {
    if (b.buckets.some((x, k) => k > 0 && x <= b.buckets![k - 1]!))
      throw new ConfigError(`models[${i}].batching.buckets`, 'must be strictly ascending');
    buckets.push(...b.buckets);
  } else {
    for (let x = 16; x < maxContext; x *= 2) buckets.push(x);
    buckets.push(maxContext);
  }
  const maxBatchTokens = b.maxBatchTokens ?? 16_384;
  if (buckets[0]! > maxBatchTokens)
    throw new ConfigError(`models[${i}].batching.maxBatchTokens`, `is below the smallest bucket (${buckets[0]})`);
  return { maxBatch: b.maxBatch ?? 32, maxBatchTokens, maxDelayMs: b.maxDelayMs ?? 5, buckets };
}

/**
 * Reads and validates a YAML (or JSON) scenario file; its models' calibrated profiles are read too (relative to the
 * file) unless `calibrations` is false (`switchyard calibrate` writes them).
 */
export function loadScenario(path: string, opts: { calibrations?: boolean } = {}): Scenario {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new ConfigError('(file)', `cannot read ${path}: ${(e as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = parse(text, { maxAliasCount: 100 });
  } catch (e) {
    throw new ConfigError('(yaml)', (e as Error).message);
  }
  const scenario = normalizeScenario(raw);
  return opts.calibrations === false ? scenario : applyCalibrations(scenario, dirname(path));
}
