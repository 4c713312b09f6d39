// Helpers of the `engine: openai` end-to-end tests: a switchyard `serve` of the tiny llama model is the upstream model
// server (it speaks the OpenAI API and the model-server gauges), started by the front's worker once per replica.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, writeConfig } from './harness.ts';

/** An upstream server process under a worker: its pid and port. */
export interface UpstreamProc {
  pid: number;
  port: number;
  gpus: string;
}

/** The upstream servers (switchyard serve processes) a worker started. */
export function upstreamsOf(workerPid: number): UpstreamProc[] {
  let out = '';
  try {
    out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(workerPid)], { encoding: 'utf8' });
  } catch {
    return [];
  }
  const found: UpstreamProc[] = [];
  for (const line of out.split('\n')) {
    const m = /^\s*(\d+)\s+.*switchyard\.ts serve .*--port (\d+)/.exec(line);
    if (!m) continue;
    let gpus = '';
    try {
      const env = readFileSync(`/proc/${m[1]}/environ`, 'utf8').split('\0');
      gpus = env.find((e) => e.startsWith('CUDA_VISIBLE_DEVICES='))?.slice(21) ?? '';
    } catch {
      // exited
    }
    found.push({ pid: Number(m[1]), port: Number(m[2]), gpus });
  }
  return found;
}

/** The upstream's own config: one llama.cpp replica of `file` named `name`. */
export function upstreamConfig(file: string, name = 'tiny'): string {
  return writeConfig(`
name: upstream-${name}
node: { gpu: H100-SXM, gpus: 1 }
placement: { policy: exclusive }
models:
  - name: ${name}
    profile: llama-3-8b
    replicas: 1
    engine: llama.cpp
    file: ${file}
    threads: 1
    contextTokens: 512
    sequences: 4
    batching: { tokenBudget: 256 }
    classes: { interactive: { maxQueueMs: 120000 } }
`);
}

/** A model entry of the front's config whose replicas are upstream servers running `upstreamFile`'s config. */
export function openaiModel(o: {
  name: string;
  file: string;
  upstreamFile: string;
  upstreamModel?: string;
  replicas: number;
  /** GPUs of each replica (default 1): a gang's server gets all of them. */
  tp?: number;
  hangMs?: number;
  extra?: string;
}): string {
  const argv = [process.execPath, '--import', 'tsx', join(ROOT, 'bin/switchyard.ts'), 'serve'];
  const command = [...argv, '--config', o.upstreamFile, '--port', '{port}'].map((a) => JSON.stringify(a)).join(', ');
  return `
  - name: ${o.name}
    profile: llama-3-8b
    tp: ${o.tp ?? 1}
    replicas: ${o.replicas}
    engine: openai
    file: ${o.file}
    contextTokens: 511
    sequences: 4
    batching: { tokenBudget: 256 }
    resume: { maxResumes: 1, budgetMs: 60000 }
    classes: { interactive: { maxQueueMs: 120000 } }
    upstream:
      model: ${o.upstreamModel ?? 'tiny'}
      command: [${command}]
      cwd: ${ROOT}
      health: /readyz
      server: switchyard
      prompt: text
      hangMs: ${o.hangMs ?? 4000}
      startTimeoutMs: 120000
${o.extra ?? ''}`;
}

/** The environment that lets the front's worker start node (the upstream servers). */
export const UPSTREAM_ENV = { SWITCHYARD_UPSTREAM_COMMANDS: process.execPath };
