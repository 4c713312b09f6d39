// Synthetic and trace-driven request arrivals for the simulator, reproducible from the seed.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Rng } from '../../runtime/rng.ts';
import type { PromptSegment } from '../batcher/block-hash.ts';
import { createConversationStream } from './conversations.ts';
import type { Scenario } from '../config.ts';

/** One row of a trace: arrival (s, when the trace has it), prompt and output lengths. */
export interface TraceRow {
  t: number;
  prompt: number;
  output: number;
}

/** A request the traffic generator produces. */
export interface Arrival {
  t: number;
  stream: number;
  model: string;
  version?: string;
  priority: string;
  promptTokens: number;
  outputTokens: number;
  maxTokens: number;
  deadlineMs?: number;
  /** What its prompt and answer are made of (conversation traffic), for a model with a prefix cache. */
  segments?: PromptSegment[];
}

const traceDir = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'traces');
const traces = new Map<string, TraceRow[]>();

/** Loads a trace from traces/<name>.csv (cached). */
export function loadTrace(name: string): TraceRow[] {
  const cached = traces.get(name);
  if (cached) return cached;
  const lines = readFileSync(join(traceDir, `${name}.csv`), 'utf8')
    .trim()
    .split('\n');
  const header = lines[0]!.split(',');
  const iT = header.indexOf('arrived_at');
  const iP = header.indexOf('num_prefill_tokens');
  const iD = header.indexOf('num_decode_tokens');
  const rows: TraceRow[] = [];
  for (let i = 1; i < lines.length; i++) {
    const c = lines[i]!.split(',');
    const prompt = Number(c[iP]);
    const output = Number(c[iD]);
    if (!(prompt >= 1) || !(output >= 1)) continue;
    rows.push({ t: iT >= 0 ? Number(c[iT]) : 0, prompt, output });
  }
  traces.set(name, rows);
  return rows;
}

/** A pull-based stream of arrivals in time order for one traffic entry. */
export interface ArrivalStream {
  next(): Arrival | null;
}

/** Creates the arrival stream of `scenario.traffic[index]`. */
export function createArrivalStream(scenario: Scenario, index: number, rng: Rng): ArrivalStream {
  const spec = scenario.traffic[index]!;
  const lengthsRng = rng.fork(`lengths:${index}`);
  const arrivalRng = rng.fork(`arrivals:${index}`);
  const cap = spec.lengths.maxTotalTokens ?? Infinity;
  const rows = spec.lengths.trace ? loadTrace(spec.lengths.trace).filter((r) => r.prompt + r.output <= cap) : [];
  if (spec.lengths.trace && rows.length === 0)
    throw new Error(`traffic[${index}]: no trace rows within maxTotalTokens ${cap}`);
  const start = (spec.arrival.start ?? 0) * 1000;
  const scale = spec.arrival.timeScale ?? 1;
  const model = scenario.models.find((m) => m.name === spec.model)!;
  const priority = spec.priority ?? model.classes[0]!.name;
  const rate = spec.arrival.rate ?? 1;
  let produced = 0;
  let t = start;
  let traceStart = 0;

  const drawLength = (d: { mean: number; cv?: number; max?: number }): number => {
    const x = Math.max(1, Math.round(lengthsRng.gamma(d.mean, d.cv ?? 1)));
    return d.max ? Math.min(d.max, x) : x;
  };
  if (spec.conversation) {
    // Arrivals start conversations; each turn's answer length is drawn like any output.
    const turns = createConversationStream({
      spec: spec.conversation,
      requests: spec.requests,
      start,
      startGapMs: () =>
        spec.arrival.process === 'gamma'
          ? arrivalRng.gamma(1000 / rate, spec.arrival.cv ?? 1)
          : arrivalRng.exponential(1000 / rate),
      outputTokens: () =>
        rows.length > 0 ? rows[lengthsRng.int(rows.length)]!.output : drawLength(spec.lengths.output ?? { mean: 200 }),
      rng: rng.fork(`conversations:${index}`),
    });
    return {
      next: () => {
        const turn = turns.next();
        if (!turn) return null;
        const maxTokens = spec.lengths.maxTokens ?? turn.outputTokens;
        return {
          t: turn.t,
          stream: index,
          model: spec.model,
          ...(spec.version ? { version: spec.version } : {}),
          priority,
          promptTokens: turn.promptTokens,
          outputTokens: Math.min(turn.outputTokens, maxTokens),
          maxTokens,
          ...(spec.deadlineMs !== undefined ? { deadlineMs: spec.deadlineMs } : {}),
          segments: turn.segments,
        };
      },
    };
  }

  return {
    next: () => {
      if (produced >= spec.requests) return null;
      let row: TraceRow;
      if (spec.arrival.process === 'trace') {
        row = rows[produced % rows.length]!;
        if (produced === 0) traceStart = row.t;
        const lap = Math.floor(produced / rows.length) * (rows[rows.length - 1]!.t - rows[0]!.t + 1);
        t = start + ((row.t - traceStart + lap) * 1000) / scale;
      } else {
        row =
          rows.length > 0
            ? rows[lengthsRng.int(rows.length)]!
            : { t: 0, prompt: drawLength(spec.lengths.prompt!), output: drawLength(spec.lengths.output!) };
        if (produced > 0) {
          const mean = 1000 / rate;
          if (spec.arrival.process === 'poisson') t += arrivalRng.exponential(mean);
          else if (spec.arrival.process === 'gamma') t += arrivalRng.gamma(mean, spec.arrival.cv ?? 1);
        }
      }
      produced++;
      const maxTokens = spec.lengths.maxTokens ?? row.output;
      return {
        t,
        stream: index,
        model: spec.model,
        ...(spec.version ? { version: spec.version } : {}),
        priority,
        promptTokens: row.prompt,
        outputTokens: Math.min(row.output, maxTokens),
        maxTokens,
        ...(spec.deadlineMs !== undefined ? { deadlineMs: spec.deadlineMs } : {}),
      };
    },
  };
}
