// A model's own tokenizer without its weights: the control plane counts prompt tokens (routing, admission, usage) and
// turns prompts into the token ids that travel to the worker, with exactly the vocabulary the engine uses.
//
// Why in the control plane and not a question to the worker: admission is synchronous and happens before any replica
// is chosen (or exists: a held request is admitted against a replica still loading), and a context overflow must be
// refused before any work. A vocab-only llama.cpp model loads the GGUF's metadata and vocabulary only (no tensors).
import {
  getLlama,
  GeneralChatWrapper,
  LlamaLogLevel,
  resolveChatWrapper,
  type ChatHistoryItem,
  type ChatWrapper,
  type Llama,
  type LlamaModel,
} from 'node-llama-cpp';
import type { ChatMessage } from '../../transport/client-protocol.ts';
import { EngineError } from './engine.ts';
import { checkModelFile } from './model-file.ts';

/** Prompt text to token ids, as the model's engine would tokenize it (with BOS when the model wants one). */
export interface Tokenizer {
  readonly file: string;
  tokenize(text: string): number[];
  /** Chat messages rendered by the model's chat template (see chatWrapperOf), ending where the assistant's reply
   * begins, as token ids (the template's own BOS and special tokens included). */
  tokenizeChat(messages: readonly ChatMessage[]): number[];
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
  const chat = chatWrapperOf(model);
  const bos = model.tokens.shouldPrependBosToken && model.tokens.bos != null ? model.tokens.bos : null;
  return {
    file,
    tokenize: (text) => {
      const body = model.tokenize(text) as number[];
      return bos === null ? body : [bos, ...body];
    },
    tokenizeChat: (messages) => {
      const { contextText } = chat.generateContextState({ chatHistory: chatHistory(messages) });
      return contextText.tokenize(model.tokenizer) as number[];
    },
    detokenize: (tokens) => model.detokenize(tokens as Parameters<LlamaModel['detokenize']>[0]),
    dispose: () => model.dispose(),
  };
}

/**
 * The chat template a model's requests are rendered by: its GGUF's `tokenizer.chat_template` through node-llama-cpp
 * (a Jinja template, or the built-in wrapper it renders the same as, e.g. ChatML); a file without one gets the wrapper
 * node-llama-cpp recognises from its name and architecture, else its general `### User` / `### Assistant` format.
 */
export function chatWrapperOf(model: LlamaModel): ChatWrapper {
  return resolveChatWrapper(model, { warningLogs: false }) ?? new GeneralChatWrapper();
}

/** OpenAI chat messages as node-llama-cpp's chat history, ending in the assistant's empty reply (the generation
 * prompt). */
function chatHistory(messages: readonly ChatMessage[]): ChatHistoryItem[] {
  const items: ChatHistoryItem[] = messages.map((m) =>
    m.role === 'assistant' ? { type: 'model', response: [m.content] } : { type: m.role, text: m.content },
  );
  items.push({ type: 'model', response: [] });
  return items;
}
