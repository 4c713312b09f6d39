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

/** The fixture model server (test/fixtures/openai-server.ts): vLLM's API, gauges and sleep mode, in miniature. */
export const FIXTURE = join(ROOT, 'test/fixtures/openai-server.ts');

/** A model entry whose replicas are fixture servers started by the worker (prompt ids, token ids, vLLM's names). */
export function fixtureModel(o: {
  name: string;
  file: string;
  replicas: number;
  tp?: number;
  sequences?: number;
  queue?: number;
  sleep?: boolean;
  args?: readonly string[];
}): string {
  const argv = [process.execPath, '--import', 'tsx', FIXTURE, '--port', '{port}', '--model', o.name, ...(o.args ?? [])];
  return `
  - name: ${o.name}
    profile: llama-3-8b
    tp: ${o.tp ?? 1}
    replicas: ${o.replicas}
    engine: openai
    file: ${o.file}
    contextTokens: 511
    sequences: ${o.sequences ?? 4}
    resume: { maxResumes: 1, budgetMs: 60000 }
    classes: { interactive: { maxQueueMs: 120000 } }
    upstream:
      model: ${o.name}
      command: [${argv.map((a) => JSON.stringify(a)).join(', ')}]
      cwd: ${ROOT}
      server: vllm
      prompt: ids
      tokenIds: true
      sleep: ${o.sleep ?? false}
      queue: ${o.queue ?? 64}
      hangMs: 4000
      startTimeoutMs: 60000
`;
}

/** The fixture servers a worker started: pid, port, model and GPUs. */
export function fixturesOf(workerPid: number): (UpstreamProc & { model: string })[] {
  let out = '';
  try {
    out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(workerPid)], { encoding: 'utf8' });
  } catch {
    return [];
  }
  const found: (UpstreamProc & { model: string })[] = [];
  for (const line of out.split('\n')) {
    const m = /^\s*(\d+)\s+.*openai-server\.ts --port (\d+) --model (\S+)/.exec(line);
    if (!m) continue;
    let gpus = '';
    try {
      const env = readFileSync(`/proc/${m[1]}/environ`, 'utf8').split('\0');
      gpus = env.find((e) => e.startsWith('CUDA_VISIBLE_DEVICES='))?.slice(21) ?? '';
    } catch {
      // exited
    }
    found.push({ pid: Number(m[1]), port: Number(m[2]), model: m[3]!, gpus });
  }
  return found;
}

/** A fixture server's counters and gauges, by name. */
export async function fixtureMetrics(port: number): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const line of (await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()).split('\n')) {
    const m = /^([a-z_:]+)(?:\{[^}]*\})? (\S+)$/.exec(line);
    if (m) out.set(m[1]!, Number(m[2]));
  }
  return out;
}
