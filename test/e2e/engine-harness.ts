// Helpers of the real-engine end-to-end tests: the tiny model, the engine hosts a worker runs (by pid and GPUs), and
// the text the same engine makes when run directly (greedy), to compare a served stream with.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ensureTinyModel } from '../../actors/engine/tiny-model.ts';
import { loadLlamaEngine } from '../../actors/engine/llama-engine.ts';
import { ROOT } from './harness.ts';

/** Where the tests' tiny model lives (the same cache path scenarios/real-tiny.yaml generates). */
export const TINY = join(ROOT, '.cache/models/tiny.gguf');

/** Writes the tiny model if it is missing. */
export async function tinyModel(): Promise<string> {
  await ensureTinyModel(TINY);
  return TINY;
}

/** An engine host process: its pid and the GPUs it was given (CUDA_VISIBLE_DEVICES). */
export interface HostProc {
  pid: number;
  gpus: string;
}

/** The engine hosts running under a worker process. */
export function enginesOf(workerPid: number): HostProc[] {
  let out = '';
  try {
    out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(workerPid)], { encoding: 'utf8' });
  } catch {
    return []; // ps exits 1 when there is no child
  }
  const hosts: HostProc[] = [];
  for (const line of out.split('\n')) {
    const m = /^\s*(\d+)\s+(.*)$/.exec(line);
    if (!m || !m[2]!.includes('host.ts')) continue;
    const pid = Number(m[1]);
    try {
      const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      const gpus = env.find((e) => e.startsWith('CUDA_VISIBLE_DEVICES='))?.slice('CUDA_VISIBLE_DEVICES='.length);
      hosts.push({ pid, gpus: gpus ?? '' });
    } catch {
      // exited between ps and the read
    }
  }
  return hosts;
}

/** True while a process exists. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Polls `cond` every 100 ms until it holds, or throws after `timeoutMs` naming `what`. */
export async function until(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await cond())) {
    if (performance.now() > end) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The greedy text of `prompt` from the engine run directly (prefill, then decodes), as switchyard streams it. */
export async function directText(
  file: string,
  prompt: string,
  maxTokens: number,
): Promise<{ text: string; n: number; promptTokens: number }> {
  const engine = await loadLlamaEngine(file, { contextTokens: 256, sequences: 1, threads: 1 });
  try {
    const tokens = engine.tokenize(prompt);
    let r = await engine.step({ items: [{ seq: 's', kind: 'prefill', tokens, sample: true }] });
    let text = '';
    let n = 0;
    for (;;) {
      const t = r.sampled[0]!;
      text += t.text;
      n++;
      if (t.finish) return { text, n, promptTokens: tokens.length };
      if (n >= maxTokens) return { text: text + (await engine.free('s')).text, n, promptTokens: tokens.length };
      r = await engine.step({ items: [{ seq: 's', kind: 'decode' }] });
    }
  } finally {
    await engine.unload();
  }
}
