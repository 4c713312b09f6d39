// A model's own tokenizer without its weights: the control plane counts prompt tokens (routing, admission, usage) and
// turns prompts into the token ids that travel to the worker, with exactly the vocabulary the engine uses.
//
// Why in the control plane and not a question to the worker: admission is synchronous and happens before any replica
// is chosen (or exists: a held request is admitted against a replica still loading), and a context overflow must be
// refused before any work. A vocab-only llama.cpp model loads the GGUF's metadata and vocabulary only (no tensors).
import { getLlama, LlamaLogLevel, type Llama, type LlamaModel } from 'node-llama-cpp';
import { EngineError } from './engine.ts';
import { checkModelFile } from './model-file.ts';

/** Prompt text to token ids, as the model's engine would tokenize it (with BOS when the model wants one). */
export interface Tokenizer {
  readonly file: string;
  tokenize(text: string): number[];
  detokenize(tokens: readonly number[]): string;
  dispose(): Promise<void>;
}

let shared: Promise<Llama> | null = null;
// One llama.cpp binding per process: every tokenizer shares it (its start-up test-loads the binary once).
const binding = (): Promise<Llama> =>
  (shared ??= getLlama({
    gpu: false,
    build: 'never',
    skipDownload: true,
    progressLogs: false,
    maxThreads: 1,
    logLevel: LlamaLogLevel.error,
  }));

/** Loads the tokenizer of a GGUF file; a missing, unreadable or invalid file is refused with invalid_model_file. */
export async function loadTokenizer(file: string): Promise<Tokenizer> {
  await checkModelFile(file);
  let model: LlamaModel;
  try {
    model = await (await binding()).loadModel({ modelPath: file, vocabOnly: true });
  } catch (err) {
    throw new EngineError('invalid_model_file', `model file ${file} has no usable vocabulary: ${String(err)}`, false);
  }
  const bos = model.tokens.shouldPrependBosToken && model.tokens.bos != null ? model.tokens.bos : null;
  return {
    file,
    tokenize: (text) => {
      const body = model.tokenize(text) as number[];
      return bos === null ? body : [bos, ...body];
    },
    detokenize: (tokens) => model.detokenize(tokens as Parameters<LlamaModel['detokenize']>[0]),
    dispose: () => model.dispose(),
  };
}
