import { normalizeScenario } from './actors/config.ts';
import { startServer } from './transport/server/server.ts';
import { superviseWorker } from './transport/server/worker-supervisor.ts';
import { createWallClock } from './actors/runtime/clock.ts';
import { spawn } from 'node:child_process';
import { parse } from 'yaml';
import { readFileSync } from 'node:fs';
const clock = createWallClock();
const scenario = normalizeScenario(parse(readFileSync('/tmp/sy/live.yaml', 'utf8')));
const s = await startServer({ scenario, port: 0, workerTokens: ['w'], adminTokens: ['a'], clock });
const sup = superviseWorker({ clock, args: ['--url', s.nodeUrl, '--executor', 'zero-cost', '--time-scale', '0.001'], token: 'w', log: () => {} });
while (!s.serving.readiness()['llama-3-8b']!.ready) await new Promise((r) => setTimeout(r, 50));
await new Promise((r) => setTimeout(r, 1000));
const lg = spawn(process.execPath, ['--import', 'tsx', 'bench/live.ts', 'loadgen', JSON.stringify({ mode: 'throughput', url: s.wsUrl, model: 'llama-3-8b', conns: 8, perConn: 128, maxTokens: 256, warmupMs: 1500, windowMs: 4000 })], { stdio: ['ignore', 'inherit', 'inherit'] });
// Sample the step loop: time between dispatch and completion, and between completion and next dispatch.
let lastN = 0, lastSum = 0;
const lag: number[] = []; let prev = performance.now();
const li = setInterval(() => { const n = performance.now(); lag.push(n - prev - 1); prev = n; }, 1);
const t = setInterval(() => {
  const e = s.cp.collector.estimates()['stepMs'];
  if (e) { const sum = e.meanActualMs * e.count; console.log(`steps ${e.count - lastN}/s, mean step ${((sum - lastSum) / (e.count - lastN)).toFixed(2)} ms, loop lag p50 ${lag.sort((a,b)=>a-b)[lag.length>>1]?.toFixed(2)} max ${lag[lag.length-1]?.toFixed(1)}`); lastN = e.count; lastSum = sum; lag.length = 0; }
}, 1000);
await new Promise((r) => lg.on('exit', r));
clearInterval(t); clearInterval(li);
await sup.stop(); await s.close(); process.exit(0);
