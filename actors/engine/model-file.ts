// Checks a model file before any engine starts: it must exist, be readable and begin with a GGUF header.
import { open } from 'node:fs/promises';
import { EngineError } from './engine.ts';

const GGUF_MAGIC = 'GGUF';

/** Checks that `file` exists, is readable and starts with a GGUF v2/v3 header; throws invalid_model_file naming it. */
export async function checkModelFile(file: string): Promise<void> {
  let handle;
  try {
    handle = await open(file, 'r');
  } catch (err) {
    const why = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'does not exist' : 'cannot be read';
    throw new EngineError('invalid_model_file', `model file ${file} ${why}`, false, err);
  }
  try {
    const head = Buffer.alloc(8);
    const { bytesRead } = await handle.read(head, 0, 8, 0);
    if (bytesRead < 8 || head.toString('latin1', 0, 4) !== GGUF_MAGIC) {
      throw new EngineError('invalid_model_file', `model file ${file} is not a GGUF file`);
    }
    const version = head.readUInt32LE(4);
    if (version !== 2 && version !== 3) {
      throw new EngineError('invalid_model_file', `model file ${file} has unsupported GGUF version ${version}`);
    }
  } catch (err) {
    if (err instanceof EngineError) throw err;
    throw new EngineError('invalid_model_file', `model file ${file} cannot be read`, false, err);
  } finally {
    await handle.close();
  }
}
