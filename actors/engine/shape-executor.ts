// An executor whose steps run on a real engine: each step's shape (prefill chunks after cached tokens, decodes over
// a total context) becomes one engine batch of that shape over filler sequences, and the step takes what the engine
// took. It times a planned or simulated step stream on the engine itself (what `switchyard calibrate` does over a
// grid), behind the same Executor interface as the cost models, so it passes the same contract
// (test/actors/gpu/executor.contract.ts). Serving real requests goes through an engine host's core instead
// (actors/engine/llama-executor.ts): there the items are the requests' own tokens.
//
// Per step: set-up batches, not timed, give each decoding filler sequence its share of the context and a sampled
// token, and each prefill chunk its cached tokens; then the shaped batch runs (its `ms` is the step's time); then
// every filler sequence is freed. Steps of all GPUs on one engine run one after another (an engine runs one batch at
// a time); a GPU still runs one step at a time, and an aborted step's `done` is never called.
import type { Executor, StepWork } from '../gpu/executor.ts';
import type { StepItem, StepPlan, StepResult } from './engine.ts';

/** What the executor needs of an engine (an in-process Engine). */
export interface ShapeEngine {
  step(plan: StepPlan): Promise<StepResult>;
  free(seq: string): Promise<{ text: string }>;
}

/** An executor over real engines, with a way to wait until every started step has run. */
export interface EngineShapeExecutor extends Executor {
  /** Settles once every step started so far has run (or failed) on its engine. */
  drained(): Promise<void>;
}

/** Filler prompt tokens: printable bytes, valid in any byte-level vocabulary. */
const filler = (n: number, salt: number): number[] => Array.from({ length: n }, (_, i) => 97 + ((i + salt) % 26));

/** The set-up batches and the shaped batch of one step on GPU `gpu`, and the filler sequences they open. */
export function shapeBatches(work: StepWork): { setup: StepPlan[]; step: StepPlan; seqs: string[] } {
  const { shape, gpu } = work;
  const setup: StepPlan[] = [];
  const items: StepItem[] = [];
  const seqs: string[] = [];
  const b = shape.decodeBatch;
  for (let i = 0; i < b; i++) {
    const seq = `shape.${gpu}.d${i}`;
    // The context split as evenly as possible; the decode itself adds the sampled token, so prefill one fewer.
    const context = Math.floor(shape.decodeContext / b) + (i < shape.decodeContext % b ? 1 : 0);
    setup.push({ items: [{ seq, kind: 'prefill', tokens: filler(Math.max(1, context - 1), i), sample: true }] });
    items.push({ seq, kind: 'decode' });
    seqs.push(seq);
  }
  shape.prefill.forEach((chunk, i) => {
    if (chunk.tokens <= 0) return;
    const seq = `shape.${gpu}.p${i}`;
    if (chunk.cached > 0) {
      setup.push({ items: [{ seq, kind: 'prefill', tokens: filler(chunk.cached, i), sample: false }] });
    }
    items.push({ seq, kind: 'prefill', tokens: filler(chunk.tokens, i + 7), sample: true });
    seqs.push(seq);
  });
  return { setup, step: { items }, seqs };
}

/** Creates an executor running each GPU's steps on `engineOf(gpu)` (one engine may serve several GPUs). */
export function createEngineShapeExecutor(engineOf: (gpu: number) => ShapeEngine): EngineShapeExecutor {
  const running = new Map<number, { aborted: boolean }>();
  const busy = new Map<number, number>();
  const tails = new Map<ShapeEngine, Promise<void>>();

  const run = async (engine: ShapeEngine, work: StepWork, token: { aborted: boolean }): Promise<number | null> => {
    const { setup, step, seqs } = shapeBatches(work);
    try {
      if (step.items.length === 0) return 0; // an empty step costs nothing, as in the cost models
      for (const plan of setup) await engine.step(plan);
      const result = await engine.step(step);
      return token.aborted ? null : result.ms;
    } catch {
      // The engine refused the shape or failed: the step never completes.
      return null;
    } finally {
      for (const seq of seqs) await engine.free(seq).catch(() => undefined);
    }
  };

  return {
    name: 'engine-shape',
    start: (work, done) => {
      if (running.has(work.gpu)) throw new Error(`gpu.${work.gpu} is already executing a step`);
      const token = { aborted: false };
      running.set(work.gpu, token);
      const engine = engineOf(work.gpu);
      const next = (tails.get(engine) ?? Promise.resolve()).then(async () => {
        const ms = await run(engine, work, token);
        if (running.get(work.gpu) === token) running.delete(work.gpu);
        if (ms === null || token.aborted) return;
        busy.set(work.gpu, (busy.get(work.gpu) ?? 0) + ms);
        done(ms);
      });
      tails.set(engine, next);
    },
    abort: (gpu) => {
      const token = running.get(gpu);
      if (token) token.aborted = true;
      running.delete(gpu);
    },
    busyMs: (gpu) => busy.get(gpu) ?? 0,
    drained: async () => {
      await Promise.all([...tails.values()]);
    },
  };
}
