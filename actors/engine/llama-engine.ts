// The llama.cpp engine (node-llama-cpp): runs each planned step as one llama_decode over exactly the planned tokens.
//
// Iteration-level control: the context's batching `dispatchSchedule` does nothing, so node-llama-cpp only queues
// what each sequence's `controlledEvaluate` asks for; `dispatchPendingBatch()` then evaluates the whole queue as one
// batch (first in, first out: whole items, in the order queued). Logits are requested only where a token is sampled.
//
// Passes. With one cache stream per sequence (the addon's kv_unified = false), llama.cpp splits a batch into
// micro-batches (`split_equal(…, sequential)`) that only group sequences whose ids rise by one in batch order; each
// micro-batch reads all the weights once. Each sequence runs in the slot (llama.cpp sequence id) its item names —
// the batcher's, which keeps the running sequences in the lowest slots — and a step's items are queued in ascending
// slot order, so sequences in consecutive slots share a pass: 8 decodes in slots 0…7 are one pass. The passes are
// counted as llama.cpp splits the batch (actors/batcher/slots.ts) and reported with the step; the batcher counts the
// same from the same slots, and the calibrated cost model prices them. Context shifting is made impossible twice
// over: every plan is checked against the cells left before anything is queued, and the sequences' shift strategy
// throws.
//
// Prefix reuse. A freed sequence's cells stay in its slot (its llama.cpp sequence keeps its context tokens). The item
// that opens a sequence may name a `prefix`, the first tokens the scheduler expects the slot to hold
// (actors/batcher/slot-prefix.ts): the engine compares them with the slot's own token ids, keeps the cells that match,
// erases the rest, and evaluates what did not match itself before the step's batch (a guess that was wrong costs a
// recompute, never wrong text). An item without `prefix` starts from an empty slot.
import { setImmediate as nextMacrotask } from 'node:timers/promises';
import {
  getLlama,
  LlamaLogLevel,
  type ControlledEvaluateInputItem,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaModel,
  type Token,
} from 'node-llama-cpp';
import {
  EngineError,
  type Engine,
  type EngineCapacity,
  type EngineLoadOptions,
  type EngineOffload,
  type SampledToken,
  type SamplingParams,
  type StepPlan,
  type StepResult,
  type TokenLogprob,
} from './engine.ts';
import { checkModelFile } from './model-file.ts';
import { passes as passesOf } from '../batcher/slots.ts';
import { createTextStream, type TextStream } from './text-stream.ts';
import { chooseConstrained, createGrammars, logprobOf, type Constraint } from './constrained.ts';

/** One live sequence: its llama.cpp sequence, the sampled token not yet in the cache, and its text stream. */
interface Live {
  sequence: LlamaContextSequence;
  /** The llama.cpp sequence id (slot): creation order of the context's sequences. */
  slot: number;
  sampling: SamplingParams;
  stream: TextStream;
  pending: number | undefined;
  finished: boolean;
  /** The JSON grammar's state, when the sequence asked for JSON (constrained.ts). */
  constraint?: Constraint;
}

/** Mixes a seed with a token position (murmur3 finaliser) so each sampled position gets its own stream. */
export function positionSeed(seed: number, position: number): number {
  let h = (Math.imul(seed >>> 0, 0x9e3779b1) ^ position) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

const refuse = (message: string): never => {
  throw new EngineError('invalid_request', message);
};

/** What the plan validation found: the new sequences it needs and the step's token count. */
interface PlanCheck {
  fresh: string[];
  tokens: number;
}

/** Checks an item's slot: within the engine's, its own when the sequence is open, else free and not claimed twice. */
function checkSlot(item: StepPlan['items'][number], state: Live | undefined, pool: Pool, claimed: Set<number>): void {
  if (item.slot === undefined) return;
  const slot = item.slot;
  if (!Number.isInteger(slot) || slot < 0 || slot >= pool.length) refuse(`slot ${slot} of ${item.seq} is no slot`);
  if (state) {
    if (state.slot !== slot) refuse(`sequence ${item.seq} runs in slot ${state.slot}, not ${slot}`);
    return;
  }
  if (pool[slot] === null || claimed.has(slot)) refuse(`slot ${slot} for ${item.seq} is in use`);
  claimed.add(slot);
}

/** Validates a plan against the cache before any work; throws invalid_request naming the first problem. */
function checkPlan(plan: StepPlan, live: Map<string, Live>, cap: EngineCapacity, vocab: number, pool: Pool): PlanCheck {
  const seen = new Set<string>();
  const claimed = new Set<number>();
  const fresh: string[] = [];
  let tokens = 0;
  if (plan.items.length === 0) refuse('a step needs at least one item');
  for (const item of plan.items) {
    if (seen.has(item.seq)) refuse(`sequence ${item.seq} appears twice in one step`);
    seen.add(item.seq);
    const state = live.get(item.seq);
    checkSlot(item, state, pool, claimed);
    const prefix = item.kind === 'prefill' ? item.prefix : undefined;
    if (state && prefix !== undefined) refuse(`sequence ${item.seq} is open: only the item opening it names a prefix`);
    const held = state?.sequence.nextTokenIndex ?? prefix?.length ?? 0;
    if (item.kind === 'decode') {
      if (!state || state.pending === undefined) refuse(`sequence ${item.seq} has no sampled token to decode`);
      if (state!.finished) refuse(`sequence ${item.seq} has finished`);
      if (held + 1 > cap.cellsPerSequence) {
        refuse(`sequence ${item.seq} would exceed its ${cap.cellsPerSequence} cells by decoding`);
      }
      tokens += 1;
      continue;
    }
    if (item.tokens.length === 0) refuse(`prefill of ${item.seq} has no tokens`);
    if (state?.pending !== undefined) refuse(`sequence ${item.seq} is decoding; free it before prefilling again`);
    for (const list of [item.tokens, item.streamed, prefix]) {
      for (const t of list ?? []) {
        if (!Number.isInteger(t) || t < 0 || t >= vocab) refuse(`prefill of ${item.seq} holds invalid token ${t}`);
      }
    }
    if ((item.streamed?.length ?? 0) > cap.cellsPerSequence) refuse(`prefill of ${item.seq} replays too many tokens`);
    if (held + item.tokens.length > cap.cellsPerSequence) {
      refuse(
        `context overflow: sequence ${item.seq} would hold ${held + item.tokens.length} tokens, ` +
          `more than its ${cap.cellsPerSequence} cells`,
      );
    }
    if (!state) fresh.push(item.seq);
    tokens += item.tokens.length;
  }
  if (fresh.length > cap.freeSequences) refuse(`step opens ${fresh.length} sequences, ${cap.freeSequences} are free`);
  if (tokens > cap.batchTokens) refuse(`step holds ${tokens} tokens, more than the batch of ${cap.batchTokens}`);
  return { fresh, tokens };
}

/** A recomputed sequence's text stream, brought to where it was: its streamed tokens pushed, their text dropped. */
const replayed = (stream: TextStream, item: StepPlan['items'][number]): TextStream => {
  if (item.kind === 'prefill') for (const t of item.streamed ?? []) stream.push(t);
  return stream;
};

const samplerOptions = (s: SamplingParams, position: number) => ({
  temperature: s.temperature ?? 0,
  topP: s.topP ?? 1,
  topK: 0,
  minP: 0,
  seed: positionSeed(s.seed ?? 0, position),
});

/** The tokens an item evaluates (a decode: its pending sampled token), sampling after the last when it samples. */
function evaluationInput(
  item: StepPlan['items'][number],
  state: Live,
): { input: ControlledEvaluateInputItem[]; sampleAt: number; seed: number } {
  const input: ControlledEvaluateInputItem[] = (
    item.kind === 'decode' ? [state.pending!] : [...item.tokens]
  ) as Token[];
  const last = input.length - 1;
  if (item.kind === 'prefill' && !item.sample) return { input, sampleAt: -1, seed: 0 };
  const options = samplerOptions(state.sampling, state.sequence.nextTokenIndex + input.length);
  // A constrained sequence is sampled from every logit here (constrained.ts); one asking for log-probabilities gets
  // every logit beside llama.cpp's sampled token.
  const generateNext = state.constraint
    ? { logits: true as const }
    : state.sampling.logprobs !== undefined
      ? { token: true, options, logits: true as const }
      : { token: true, options };
  input[last] = [input[last] as Token, { generateNext }];
  return { input, sampleAt: last, seed: options.seed };
}

/** The token a step sampled for a sequence (chosen under its grammar when it has one) and its log-probability. */
function sampledToken(
  out: { next?: { token?: number | null; logits?: Map<Token, number> } } | undefined,
  state: Live,
  seed: number,
  textOf: (token: number) => string,
): { token: number | null; logprob?: TokenLogprob } {
  const logits = out?.next?.logits;
  let token = out?.next?.token ?? null;
  if (state.constraint) {
    token = logits ? chooseConstrained(logits, state.constraint, state.sampling.temperature ?? 0, seed) : null;
    if (token !== null) state.constraint.accept(token);
  }
  const k = state.sampling.logprobs;
  return token !== null && k !== undefined && logits
    ? { token, logprob: logprobOf(logits, token, k, textOf) }
    : { token };
}

/** One sequence's part of a step's results: its sampled token and text, and whether it ended (into `ended`). */
function takeSampled(
  o: { seq: string; state: Live; sampleAt: number; seed: number; last: boolean },
  result: unknown[],
  model: LlamaModel,
  eog: readonly number[],
  ended: string[],
  sampled: SampledToken[],
): void {
  const { seq, state, sampleAt, seed, last } = o;
  if (sampleAt < 0) return;
  const { token, logprob } = sampledToken(result[sampleAt] as Parameters<typeof sampledToken>[0], state, seed, (t) =>
    model.detokenize([t as Token]).slice(0, 256),
  );
  const lp = logprob ? { logprob } : {};
  if (token === null && state.constraint) {
    // The grammar allows no token at all: the output ends where it is.
    state.finished = true;
    ended.push(seq);
    sampled.push({ seq, token: eog[0] ?? 0, text: state.stream.flush(), finish: 'stop' });
    return;
  }
  if (token === null) throw new EngineError('engine_failed', `no token sampled for ${seq}`, true);
  state.pending = token;
  if (model.isEogToken(token as Token)) {
    state.finished = true;
    ended.push(seq);
    sampled.push({ seq, token, text: state.stream.flush(), finish: 'eos', ...lp });
    return;
  }
  const { text, stopped } = state.stream.push(token);
  // A JSON output is complete once the grammar allows it to end: it ends there, as at a stop string.
  const done = stopped || state.constraint?.complete() === true;
  if (done || last) {
    state.finished = true;
    ended.push(seq);
  }
  if (done) sampled.push({ seq, token, text: text + state.stream.flush(), finish: 'stop', ...lp });
  else sampled.push({ seq, token, text: last ? text + state.stream.flush() : text, ...lp });
}

/** Loads a GGUF file into llama.cpp; a missing, unreadable or invalid file is refused with invalid_model_file. */
export async function loadLlamaEngine(file: string, opts: EngineLoadOptions): Promise<Engine> {
  const threads = opts.threads ?? 1;
  if (!Number.isInteger(opts.sequences) || opts.sequences < 1) refuse(`sequences must be a positive integer`);
  if (!Number.isInteger(opts.contextTokens) || opts.contextTokens < 2) refuse(`contextTokens must be an integer >= 2`);
  await checkModelFile(file);
  const gpu = opts.gpu === undefined || opts.gpu === false || opts.gpu === 'cpu' ? false : opts.gpu;
  const llama = await getLlama({
    gpu,
    build: 'never',
    skipDownload: true,
    progressLogs: false,
    maxThreads: threads,
    logLevel: LlamaLogLevel.error,
  }).catch((err: unknown) => {
    // node-llama-cpp test-loads a backend's build before using it: no driver, or no device it may see, fails it.
    throw new EngineError(
      'engine_failed',
      `no usable ${gpu || 'cpu'} build of llama.cpp here: ${String(err)}`,
      false,
      err,
    );
  });
  let model: LlamaModel | undefined;
  try {
    // A GPU build offloads every layer unless told how many: `auto` would fit layers to free memory, which on a node
    // shared with other replicas answers differently from one load to the next.
    model = await llama.loadModel({ modelPath: file, gpuLayers: llama.gpu === false ? 0 : (opts.gpuLayers ?? 'max') });
  } catch (err) {
    await model?.dispose().catch(() => undefined);
    await llama.dispose().catch(() => undefined);
    if (err instanceof EngineError) throw err;
    throw new EngineError('invalid_model_file', `model file ${file} could not be loaded: ${String(err)}`, false, err);
  }
  return createLlamaEngine(file, llama, model, opts, await offloadOf(llama, model));
}

/** Where a loaded model's layers run, as node-llama-cpp reports it. */
async function offloadOf(llama: Llama, model: LlamaModel): Promise<EngineOffload> {
  return {
    backend: llama.gpu === false ? 'cpu' : llama.gpu,
    devices: llama.gpu === false ? [] : await llama.getGpuDeviceNames(),
    gpuLayers: model.gpuLayers,
    totalLayers: model.fileInsights.totalLayers,
  };
}

/** The engine's llama.cpp context: its cache, threads and batch, dispatched by switchyard's steps (through `gate`). */
function contextOf(model: LlamaModel, opts: EngineLoadOptions, gate: DispatchGate): Promise<LlamaContext> {
  return model.createContext({
    contextSize: opts.contextTokens,
    sequences: opts.sequences,
    threads: opts.threads ?? 1,
    batchSize: opts.batchTokens ?? opts.contextTokens,
    batching: {
      itemPrioritizationStrategy: 'firstInFirstOut',
      // Switchyard dispatches each step itself; only a decode queued after that dispatch is let through here.
      dispatchSchedule: (dispatch) => {
        if (gate.armed) {
          gate.late += 1;
          dispatch();
        }
      },
    },
  });
}

/** The engine's sequences by slot (llama.cpp sequence id): the idle ones, null where a live sequence holds it. */
type Pool = (LlamaContextSequence | null)[];

/** Takes the sequence of `slot` (the lowest free one when absent) out of the pool. */
function takeSlot(pool: Pool, slot: number | undefined): { sequence: LlamaContextSequence; slot: number } {
  const at = slot ?? pool.findIndex((s) => s !== null);
  const sequence = pool[at]!;
  pool[at] = null;
  return { sequence, slot: at };
}

/** Lets a late-queued evaluation through at once (counted) instead of hanging; see the file header. */
interface DispatchGate {
  armed: boolean;
  late: number;
}

/** Readies a slot's cells for a sequence opened in it whose first tokens are `prefix` (the file header's prefix
 * reuse): keeps the cells holding them, erases the rest (all of them without a prefix), and evaluates what they did
 * not hold as a batch of its own; resolves to the cells kept. */
function slotCells(context: LlamaContext, gate: DispatchGate, file: string) {
  // Armed: an evaluation queued here is dispatched at once (were llama.cpp unable to drop cells alone, node-llama-cpp
  // would evaluate what stays again).
  const armed = async (op: () => Promise<void>): Promise<void> => {
    gate.armed = true;
    try {
      await op();
    } finally {
      gate.armed = false;
    }
  };
  const ready = async (sequence: LlamaContextSequence, prefix: readonly number[]): Promise<number> => {
    const have = sequence.nextTokenIndex;
    const kept =
      prefix.length === 0 || have === 0
        ? 0
        : Math.min(prefix.length, sequence.compareContextTokens(prefix as Token[]).firstDifferentIndex);
    if (kept < have)
      await armed(() =>
        kept === 0 ? sequence.clearHistory() : sequence.eraseContextTokenRanges([{ start: kept, end: have }]),
      );
    if (kept < prefix.length) {
      await armed(async () => {
        const done = sequence.evaluateWithoutGeneratingNewTokens(prefix.slice(kept) as Token[]);
        await nextMacrotask();
        context.dispatchPendingBatch();
        await done;
      });
    }
    return kept;
  };
  return (sequence: LlamaContextSequence, prefix: readonly number[], slot: number): Promise<number> =>
    ready(sequence, prefix).catch((err: unknown) => {
      throw new EngineError('engine_failed', `slot ${slot} of ${file} could not be readied: ${String(err)}`, true, err);
    });
}

async function createLlamaEngine(
  file: string,
  llama: Llama,
  model: LlamaModel,
  opts: EngineLoadOptions,
  offload: EngineOffload,
) {
  const gate: DispatchGate = { armed: false, late: 0 };
  const context = await contextOf(model, opts, gate);
  const adopt = slotCells(context, gate, file);
  const grammars = createGrammars(llama, model);
  /** A JSON sequence's grammar, brought to where a recomputed sequence was (its streamed tokens accepted). */
  const constraintOf = (schema: string, item: StepPlan['items'][number]): Promise<Constraint> =>
    grammars.constraint(schema, item.kind === 'prefill' ? (item.streamed ?? []) : []);
  const overflow = (): never => {
    throw new EngineError('invalid_request', 'context overflow: llama.cpp asked to shift the context');
  };
  // A fresh context hands out sequence ids 0, 1, 2, … in order: the index here is the llama.cpp sequence id.
  const pool: Pool = [];
  for (let slot = 0; slot < opts.sequences; slot++) {
    pool.push(context.getSequence({ contextShift: { strategy: overflow } }));
  }
  const idleCount = (): number => pool.reduce((n, s) => n + (s === null ? 0 : 1), 0);
  const live = new Map<string, Live>();
  const vocab = (model.fileInfo.metadata as { tokenizer?: { ggml?: { tokens?: readonly string[] } } }).tokenizer?.ggml
    ?.tokens?.length;
  const detokenize = (tokens: readonly number[]): string => model.detokenize(tokens as readonly Token[]);
  let tail: Promise<unknown> = Promise.resolve();
  let unloaded = false;
  const serial = <T>(op: () => Promise<T>): Promise<T> => {
    const run = tail.then(() => {
      if (unloaded) throw new EngineError('not_loaded', `engine for ${file} is unloaded`);
      return op();
    });
    tail = run.catch(() => undefined);
    return run;
  };

  const capacity = (): EngineCapacity => {
    const used: Record<string, number> = {};
    for (const [id, s] of live) used[id] = s.sequence.nextTokenIndex;
    return {
      sequences: opts.sequences,
      // node-llama-cpp keeps one cell of each sequence free: it shifts once nextTokenIndex reaches contextSize - 1.
      cellsPerSequence: context.contextSize - 1,
      totalCells: context.getAllocatedContextSize(),
      batchTokens: context.batchSize,
      freeSequences: idleCount(),
      used,
      offload,
    };
  };

  const runStep = async (plan: StepPlan): Promise<StepResult> => {
    const { tokens } = checkPlan(plan, live, capacity(), vocab ?? Number.MAX_SAFE_INTEGER, pool);
    let kept = 0;
    let refilled = 0;
    let refills = 0;
    const evaluations: Promise<unknown[]>[] = [];
    const order: { seq: string; state: Live; sampleAt: number; seed: number; last: boolean }[] = [];
    const queued: { item: StepPlan['items'][number]; state: Live }[] = [];
    for (const item of plan.items) {
      let state = live.get(item.seq);
      if (!state) {
        const sampling = item.kind === 'prefill' ? (item.sampling ?? {}) : {};
        // A grammar is built before the sequence takes a slot: a schema refused leaves the engine as it was.
        const constraint = sampling.jsonSchema ? await constraintOf(sampling.jsonSchema, item) : undefined;
        const stream = replayed(createTextStream(detokenize, sampling.stop), item);
        state = { ...takeSlot(pool, item.slot), sampling, stream, pending: undefined, finished: false };
        if (constraint) state.constraint = constraint;
        live.set(item.seq, state);
        const prefix = item.kind === 'prefill' ? (item.prefix ?? []) : [];
        const got = await adopt(state.sequence, prefix, state.slot);
        kept += got;
        refilled += prefix.length - got;
        if (got < prefix.length) refills++;
      } else if (item.kind === 'prefill' && item.sampling) {
        state.sampling = item.sampling;
        state.stream = replayed(createTextStream(detokenize, item.sampling.stop), item);
      }
      queued.push({ item, state });
    }
    // Ascending slots: sequences in consecutive slots share a micro-batch (a pass over the weights; header).
    queued.sort((a, b) => a.state.slot - b.state.slot);
    const passes = passesOf(
      queued.map((q) => q.state.slot),
      queued.map((q) => (q.item.kind === 'decode' ? 1 : q.item.tokens.length)),
      queued.length,
    );
    for (const { item, state } of queued) {
      const { input, sampleAt, seed } = evaluationInput(item, state);
      if (item.kind === 'decode') state.pending = undefined;
      order.push({ seq: item.seq, state, sampleAt, seed, last: item.last === true });
      evaluations.push(state.sequence.controlledEvaluate(input));
    }
    const lateBefore = gate.late;
    const started = performance.now();
    // controlledEvaluate queues its decode after a lock and a microtask or two: one macrotask lets all of them queue.
    await nextMacrotask();
    gate.armed = true;
    let results: unknown[][];
    try {
      context.dispatchPendingBatch();
      results = await Promise.all(evaluations);
    } catch (err) {
      throw new EngineError('engine_failed', `step failed in ${file}: ${String(err)}`, true, err);
    } finally {
      gate.armed = false;
    }
    const ms = performance.now() - started;
    const sampled: SampledToken[] = [];
    const ended: string[] = [];
    for (let i = 0; i < order.length; i++) takeSampled(order[i]!, results[i]!, model, grammars.eog, ended, sampled);
    // A sequence that ended (by itself, or its last token taken) is freed now: no separate free() for it.
    for (const seq of ended) await freeSeq(seq);
    // Reported in the plan's order, whatever order the batch ran in.
    const rank = new Map(plan.items.map((item, i) => [item.seq, i]));
    sampled.sort((a, b) => rank.get(a.seq)! - rank.get(b.seq)!);
    const reuse = kept > 0 || refilled > 0 ? { kept, refilled } : {};
    return { sampled, ms, tokens, dispatches: 1 + refills + gate.late - lateBefore, passes, ...reuse };
  };

  const freeSeq = async (seq: string): Promise<{ text: string }> => {
    const state = live.get(seq);
    if (!state) return { text: '' };
    live.delete(seq);
    const text = state.finished ? '' : state.stream.flush();
    // Its cells stay: the slot's next sequence may start with the same tokens (the file header).
    pool[state.slot] = state.sequence;
    return { text };
  };

  const engine: Engine = {
    file,
    tokenize: (text, o) => {
      const bos = (o?.bos ?? true) && model.tokens.shouldPrependBosToken && model.tokens.bos != null;
      const body = model.tokenize(text);
      return bos ? [model.tokens.bos!, ...body] : body;
    },
    detokenize,
    capacity,
    step: (plan) => serial(() => runStep(plan)),
    free: (seq) => serial(() => freeSeq(seq)),
    unload: () =>
      unloaded
        ? Promise.resolve()
        : serial(async () => {
            unloaded = true;
            live.clear();
            await context.dispose();
            await model.dispose();
            await llama.dispose();
          }),
  };
  return engine;
}
