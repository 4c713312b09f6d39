// The deployment and scenario file: validated at load, every error naming its field, defaults filled in one place.
import { readFileSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parse } from 'yaml';
import {
  arr,
  bool,
  dflt,
  fieldPath,
  int,
  num,
  obj,
  oneOf,
  optional,
  record,
  refine,
  str,
  validate,
  type Infer,
  type Refuse,
} from '../transport/schema.ts';
import { GPU_PROFILES, MODEL_PROFILES } from './gpu/profiles.ts';
import { applyCalibrations } from './calibration.ts';
import { DEFAULT_EJECTION } from './router/health.ts';
import type { ClassLimits } from './router/router.ts';
import { engineFields, engineOf, prepareModelFiles } from './engine-config.ts';
import { checkPlacementSections, detectionSchema, placementSchema, plannerSchema } from './placement/config.ts';

/** Largest scenario file read (bytes): checked before it is read or parsed. */
export const MAX_SCENARIO_BYTES = 1024 * 1024;
/** Most fault entries in one scenario. */
export const MAX_FAULTS = 1000;

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

const batchingSchema = obj({
  policy: dflt(oneOf('chunked', 'prefill-first', 'static'), 'chunked'),
  maxRunning: dflt(int({ min: 1, max: 100_000 }), 256),
  tokenBudget: dflt(int({ min: 1, max: 1_000_000 }), 2048),
  blockTokens: dflt(int({ min: 1, max: 1024 }), 16),
  /** Default: the profile's own context length. */
  maxContext: optional(int({ min: 16, max: 1_000_000 })),
  watermark: dflt(num({ min: 0, max: 0.5 }), 0.01),
  /** Keep computed blocks for later prompts that start the same way (vLLM's automatic prefix caching). */
  prefixCache: dflt(bool(), false),
  kvBlocks: optional(int({ min: 1 })),
  // Dynamic batching of `kind: stateless` models: batch size, padded tokens, the oldest member's wait, buckets.
  maxBatch: dflt(int({ min: 1, max: 4096 }), 32),
  maxBatchTokens: dflt(int({ min: 1, max: 10_000_000 }), 16_384),
  maxDelayMs: dflt(num({ min: 0, max: 60_000 }), 5),
  /** Input-length buckets, strictly ascending; default: powers of two from 16 up to maxContext. */
  buckets: optional(arr(int({ min: 1, max: 1_000_000 }), { min: 1, max: 64 })),
});

// A Map: a configured class named like an Object.prototype property (`toString`) must not find a default here.
const DEFAULT_CLASSES = new Map<string, Omit<ClassConfig, 'name' | 'rank' | 'shedAt'>>([
  ['interactive', { ttftMs: 2000, tpotMs: 100, maxQueueMs: 10_000, maxQueued: 4096, maxQueuedTokens: 8_000_000 }],
  ['batch', { ttftMs: 60_000, tpotMs: 1000, maxQueueMs: 120_000, maxQueued: 2048, maxQueuedTokens: 4_000_000 }],
]);

/** A model as written, defaults filled; modelSchema's rule turns it into a ModelConfig. */
const modelFields = obj({
  name: str({ min: 1, max: 100, pattern: /^[A-Za-z0-9._-]+$/ }),
  profile: oneOf(...(Object.keys(MODEL_PROFILES) as [string, ...string[]])),
  kind: dflt(oneOf('generate', 'stateless'), 'generate'),
  tp: dflt(int({ min: 1, max: 8 }), 1),
  replicas: dflt(int({ min: 0, max: 64 }), 1),
  versions: dflt(arr(str({ min: 1, max: 50 }), { min: 1, max: 16 }), ['v1']),
  aliases: dflt(record(str({ min: 1, max: 50 }), { max: 16 }), {}),
  split: optional(record(num({ min: 0, max: 1e6 }), { max: 16 })),
  batching: dflt(batchingSchema, {}),
  /** Priority classes in rank order; default: interactive, then batch. */
  classes: optional(record(classSchema, { max: 8 })),
  resume: dflt(obj({ maxResumes: dflt(int({ min: 0, max: 10 }), 1), budgetMs: dflt(pos, 30_000) }), {}),
  estimate: dflt(oneOf('maxTokens', 'oracle'), 'maxTokens'),
  ...engineFields,
  /** Calibrated engine profile (see `switchyard calibrate`): a name in profiles/ next to the config, or a .json path. */
  calibration: optional(str({ min: 1, max: 4096 })),
});

/** A model: everything that can be known from its own entry is checked here (versions, tp against the profile). */
const modelSchema = refine(modelFields, (m, refuse) => {
  for (const [a, ver] of Object.entries(m.aliases)) {
    if (!m.versions.includes(ver))
      refuse(`aliases.${a}`, `names unknown version "${ver}" (versions: ${m.versions.join(', ')})`);
  }
  for (const ver of Object.keys(m.split ?? {})) {
    if (!m.versions.includes(ver)) refuse(`split.${ver}`, `unknown version (versions: ${m.versions.join(', ')})`);
  }
  const profile = MODEL_PROFILES[m.profile]!;
  // The cost model (and a real engine) shards heads across ranks: tp must divide both head counts.
  if (profile.qHeads % m.tp !== 0 || profile.kvHeads % m.tp !== 0) {
    refuse(
      'tp',
      `must divide the query heads (${profile.qHeads}) and KV heads (${profile.kvHeads}) of ${m.profile}; got ${m.tp}`,
    );
  }
  // Names from Object.keys are own keys of m.classes: reading them finds nothing inherited.
  const names = m.classes ? Object.keys(m.classes) : [...DEFAULT_CLASSES.keys()];
  const classes: ClassConfig[] = names.map((name, rank) => {
    const given = m.classes?.[name] ?? {};
    const base = DEFAULT_CLASSES.get(name) ?? DEFAULT_CLASSES.get('interactive')!;
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
  const real = engineOf(m, m.batching, refuse);
  // The cost model's replicas keep a block prefix cache; a llama.cpp engine's keep what each slot's cells hold, for
  // the next sequence in that slot (actors/batcher/slot-prefix.ts). An openai server caches (or not) by itself:
  // asking for it there is refused rather than ignored.
  if (m.engine === 'openai' && m.batching.prefixCache)
    refuse('batching.prefixCache', 'is not supported for engine openai (the server manages its own cache)');
  // A llama.cpp engine's real cache bounds the ledger: slots, cells per sequence, one batch.
  const b = real ? { ...m.batching, ...real.limits } : m.batching;
  const maxContext = b.maxContext ?? profile.maxContext;
  return {
    name: m.name,
    profile: m.profile,
    kind: m.kind,
    tp: m.tp,
    replicas: m.replicas,
    versions: m.versions,
    aliases: m.aliases,
    ...(m.split ? { split: m.split } : {}),
    batching: {
      policy: b.policy,
      maxRunning: b.maxRunning,
      tokenBudget: b.tokenBudget,
      blockTokens: b.blockTokens,
      maxContext,
      watermark: b.watermark,
      prefixCache: b.prefixCache,
      ...(b.kvBlocks ? { kvBlocks: b.kvBlocks } : {}),
      stateless: statelessBatching(b, maxContext, refuse),
    },
    classes,
    resume: m.resume,
    estimate: m.estimate,
    ...(real ? { engine: real.engine, ...(m.generate ? { generate: m.generate } : {}) } : {}),
    /** Path of the calibrated engine profile whose step times, cache and load time replace the roofline's. */
    ...(m.calibration ? { calibration: m.calibration } : {}),
  };
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
  /** Multi-turn conversations with shared system prompts (actors/sim/conversations.ts): arrivals start conversations. */
  conversation: optional(
    obj({
      systemPrompts: dflt(int({ min: 0, max: 1_000_000 }), 4),
      systemTokens: dflt(int({ min: 0, max: 1_000_000 }), 500),
      shared: dflt(num({ min: 0, max: 1 }), 1),
      turns: dflt(obj({ mean: dflt(num({ min: 1, max: 1000 }), 4), max: dflt(int({ min: 1, max: 1000 }), 12) }), {}),
      userTokens: dflt(lengthDist, { mean: 80 }),
      thinkMs: dflt(num({ min: 0, max: 1e9 }), 10_000),
    }),
  ),
});

const faultFields = obj({
  at: pos,
  gpu: int({ min: 0, max: 63 }),
  kind: oneOf('fault', 'hang', 'straggle', 'crash'),
  factor: optional(num({ min: 1, max: 100 })),
  repairAt: optional(pos),
});
const faultSchema = refine(faultFields, (x, refuse) => {
  if (x.repairAt !== undefined && x.repairAt <= x.at)
    refuse('repairAt', `must be after at (${x.at}); got ${x.repairAt}`);
  return x;
});

const ejectionSchema = obj({
  slowFactor: dflt(num({ min: 1, max: 100 }), DEFAULT_EJECTION.slowFactor),
  minSteps: dflt(int({ min: 1, max: 1_000_000 }), DEFAULT_EJECTION.minSteps),
  alpha: dflt(num({ min: 0.001, max: 1 }), DEFAULT_EJECTION.alpha),
  failures: dflt(int({ min: 1, max: 1000 }), DEFAULT_EJECTION.failures),
  baseEjectionMs: dflt(pos, DEFAULT_EJECTION.baseEjectionMs),
  maxEjectionMs: dflt(pos, DEFAULT_EJECTION.maxEjectionMs),
  maxEjectedFraction: dflt(num({ min: 0, max: 1 }), DEFAULT_EJECTION.maxEjectedFraction),
});

/** A scenario file as written, every section and field with its default filled in. */
const scenarioFields = obj({
  name: dflt(str({ max: 200 }), 'scenario'),
  seed: dflt(int({ min: 0, max: 2 ** 31 - 1 }), 1),
  node: dflt(
    obj({
      gpu: dflt(oneOf(...(Object.keys(GPU_PROFILES) as [string, ...string[]])), 'H100-SXM'),
      gpus: dflt(int({ min: 1, max: 64 }), 8),
      repairMs: dflt(pos, 60_000),
    }),
    {},
  ),
  routing: dflt(
    obj({
      policy: dflt(oneOf('cost', 'round-robin', 'least-requests', 'power-of-two'), 'cost'),
      // The cost policy prices a candidate's cached prompt tokens (models with batching.prefixCache) as not prefilled.
      prefix: dflt(bool(), true),
      ejection: dflt(ejectionSchema, {}),
    }),
    {},
  ),
  placement: dflt(placementSchema, {}),
  detection: dflt(detectionSchema, {}),
  planner: dflt(plannerSchema, {}),
  models: arr(modelSchema, { min: 1, max: 16 }),
  traffic: dflt(arr(trafficSchema, { max: 64 }), []),
  faults: dflt(arr(faultSchema, { max: MAX_FAULTS }), []),
  // Version rollouts started at `at` seconds (simulate: from the start of traffic; serve: from start-up).
  rollout: dflt(
    arr(
      obj({
        at: dflt(num({ min: 0, max: 1e7 }), 0),
        model: str({ min: 1, max: 200 }),
        from: str({ min: 1, max: 200 }),
        to: str({ min: 1, max: 200 }),
        steps: optional(int({ min: 1, max: 1024 })),
      }),
      { max: 16 },
    ),
    [],
  ),
  sim: dflt(
    obj({
      checkInvariants: dflt(bool(), true),
      latencyMs: dflt(num({ min: 0, max: 10_000 }), 0.05),
      jitterMs: dflt(num({ min: 0, max: 10_000 }), 0),
      maxSimSeconds: dflt(pos, 36_000),
    }),
    {},
  ),
});

/** The schema of a scenario (or serving config) file: defaults, then every rule across sections. */
export const scenarioSchema = refine(scenarioFields, (f, refuse) => {
  const names = new Set<string>();
  f.models.forEach((m, i) => {
    if (names.has(m.name)) refuse(`models[${i}].name`, `duplicate model "${m.name}"`);
    names.add(m.name);
  });
  const gpus = f.node.gpus;
  f.traffic.forEach((t, i) => checkTraffic(t, `traffic[${i}]`, f.models, refuse));
  const bad = checkPlacementSections(f.models, gpus, f.placement, f.planner);
  if (bad) refuse(bad.path, bad.message);
  f.faults.forEach((x, i) => {
    if (x.gpu >= gpus) refuse(`faults[${i}].gpu`, `the node has ${gpus} GPUs (0-${gpus - 1})`);
  });
  f.rollout.forEach((r, i) => {
    const m = f.models.find((x) => x.name === r.model);
    if (!m) return refuse(`rollout[${i}].model`, `unknown model (models: ${f.models.map((x) => x.name).join(', ')})`);
    for (const k of ['from', 'to'] as const)
      if (!m.versions.includes(r[k]))
        refuse(`rollout[${i}].${k}`, `unknown version (versions: ${m.versions.join(', ')})`);
    if (r.from === r.to) refuse(`rollout[${i}].to`, `the same version as from (${r.from})`);
  });
  return f;
});

/** A scenario with every default filled in. */
export type Scenario = Infer<typeof scenarioSchema>;

/** A model with every default filled in. */
export type ModelConfig = Scenario['models'][number];

/** A priority class with every default filled in: the router's limits, named. */
export interface ClassConfig extends Required<ClassLimits> {
  name: string;
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

/** Validates a parsed scenario object and fills defaults; throws ConfigError naming the field. */
export function normalizeScenario(raw: unknown): Scenario {
  const v = validate(scenarioSchema, raw);
  if (!v.ok) throw new ConfigError(fieldPath(v.error.path), v.error.message);
  return v.value;
}

/** Checks one traffic entry against the models it names. */
function checkTraffic(
  t: Infer<typeof trafficSchema>,
  at: string,
  models: readonly ModelConfig[],
  refuse: Refuse,
): void {
  const m = models.find((x) => x.name === t.model);
  if (!m) refuse(`${at}.model`, `unknown model "${t.model}" (models: ${models.map((x) => x.name).join(', ')})`);
  if (t.priority && !m.classes.some((c) => c.name === t.priority)) {
    refuse(`${at}.priority`, `unknown class "${t.priority}" (classes: ${m.classes.map((c) => c.name).join(', ')})`);
  }
  if (t.conversation) {
    // A conversation's prompts are its turns: only the answers' lengths come from here.
    if (!t.lengths.trace && !t.lengths.output) refuse(`${at}.lengths`, 'give a trace or an output distribution');
    if (t.arrival.process === 'trace' || t.arrival.process === 'burst')
      refuse(`${at}.arrival.process`, 'conversations start by a poisson or gamma process');
  } else if (!t.lengths.trace && !(t.lengths.prompt && t.lengths.output)) {
    refuse(`${at}.lengths`, 'give a trace, or both prompt and output distributions');
  }
  if (t.arrival.process === 'trace' && !t.lengths.trace) {
    refuse(`${at}.arrival.process`, '"trace" arrivals need lengths.trace with timestamps');
  }
  if (t.arrival.process !== 'trace' && t.arrival.rate === undefined) {
    refuse(`${at}.arrival.rate`, `required for ${t.arrival.process} arrivals`);
  }
}

/** Stateless batching settings: the buckets strictly ascending, the smallest within maxBatchTokens. */
function statelessBatching(
  b: { maxBatch: number; maxBatchTokens: number; maxDelayMs: number; buckets?: number[] },
  maxContext: number,
  refuse: Refuse,
): { maxBatch: number; maxBatchTokens: number; maxDelayMs: number; buckets: number[] } {
  const buckets: number[] = [];
  if (b.buckets) {
    if (b.buckets.some((x, k) => k > 0 && x <= b.buckets![k - 1]!))
      refuse('batching.buckets', 'must be strictly ascending');
    buckets.push(...b.buckets);
  } else {
    for (let x = 16; x < maxContext; x *= 2) buckets.push(x);
    buckets.push(maxContext);
  }
  if (buckets[0]! > b.maxBatchTokens) refuse('batching.maxBatchTokens', `is below the smallest bucket (${buckets[0]})`);
  return { maxBatch: b.maxBatch, maxBatchTokens: b.maxBatchTokens, maxDelayMs: b.maxDelayMs, buckets };
}

/**
 * Reads a scenario file's YAML (or JSON), bounded in size before anything is read or parsed: a huge file is refused at
 * once, not after minutes of parsing.
 */
export function readScenarioFile(path: string): unknown {
  let text: string;
  try {
    const size = statSync(path).size;
    if (size > MAX_SCENARIO_BYTES)
      throw new ConfigError('(file)', `${path} is ${size} bytes; a scenario may hold at most ${MAX_SCENARIO_BYTES}`);
    text = readFileSync(path, 'utf8');
  } catch (e) {
    if (e instanceof ConfigError) throw e;
    throw new ConfigError('(file)', `cannot read ${path}: ${(e as Error).message}`);
  }
  if (text.length > MAX_SCENARIO_BYTES)
    throw new ConfigError('(file)', `${path} grew past ${MAX_SCENARIO_BYTES} bytes`);
  try {
    return parse(text, { maxAliasCount: 100 });
  } catch (e) {
    throw new ConfigError('(yaml)', (e as Error).message);
  }
}

/** Engine files resolved against the config's folder and checked, then calibrated profiles applied (unless off). */
export function finishScenario(scenario: Scenario, path: string, opts: { calibrations?: boolean } = {}): Scenario {
  const bad = prepareModelFiles(scenario.models, dirname(resolve(path)));
  if (bad) throw new ConfigError(bad[0], bad[1]);
  return opts.calibrations === false ? scenario : applyCalibrations(scenario, dirname(path));
}

/**
 * Reads and validates a YAML (or JSON) scenario file; its models' calibrated profiles are read too (relative to the
 * file) unless `calibrations` is false (`switchyard calibrate` writes them). A file with a `fleet:` section is a fleet
 * scenario: refused here with a pointer to `--fleet`.
 */
export function loadScenario(path: string, opts: { calibrations?: boolean } = {}): Scenario {
  const raw = readScenarioFile(path);
  if (raw && typeof raw === 'object' && !Array.isArray(raw) && 'fleet' in raw)
    throw new ConfigError('fleet', 'this scenario describes a fleet of nodes: run it with --fleet');
  return finishScenario(normalizeScenario(raw), path, opts);
}
