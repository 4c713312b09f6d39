// bench:sim — simulation speed: 2,000 splitwise_conv requests on one Llama-3-8B replica (H100), simulated requests
// per second of wall time, start-up excluded. Ends with one JSON line.
import { normalizeScenario } from '../actors/config.ts';
import { simulate } from '../actors/sim/simulate.ts';
import { loadTrace } from '../actors/sim/traffic.ts';
import { printFigures, quick } from './lib/data.ts';

const REQUESTS = Number(process.env['BENCH_SIM_REQUESTS'] ?? (quick ? 500 : 2000));

function scenario(arrival: Record<string, unknown>) {
  return normalizeScenario({
    name: 'bench-sim',
    seed: 1,
    node: { gpu: 'H100-SXM', gpus: 8 },
    models: [
      {
        name: 'llama-3-8b',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: 1,
        batching: { policy: 'chunked', maxRunning: 256, tokenBudget: 2048 },
      },
    ],
    traffic: [
      { model: 'llama-3-8b', requests: REQUESTS, lengths: { trace: 'splitwise_conv', maxTotalTokens: 8192 }, arrival },
    ],
  });
}

function run(label: string, arrival: Record<string, unknown>) {
  const s = scenario(arrival);
  simulate({ ...s, traffic: [{ ...s.traffic[0]!, requests: 50 }] }); // warm the JIT on a small run
  const t0 = performance.now();
  const r = simulate(s);
  const wall = (performance.now() - t0) / 1000;
  const perS = r.sim.requests / wall;
  console.log(
    `${label.padEnd(34)} ${String(r.sim.requests).padStart(6)} req  ${r.sim.simulatedSeconds.toFixed(1).padStart(8)} sim s  ` +
      `${String(r.batch.steps).padStart(7)} steps  batch ${r.batch.meanSize.toFixed(1).padStart(6)}  ${wall.toFixed(2).padStart(6)} s wall  ` +
      `${Math.round(perS).toString().padStart(7)} sim req/s`,
  );
  return { perS, wall, r };
}

loadTrace('splitwise_conv');
console.log(
  `bench:sim — ${REQUESTS} requests of splitwise_conv, one Llama-3-8B replica on H100, chunked batching (seed 1)`,
);
const trace = run("trace's own timestamps (~5 req/s)", { process: 'trace' });
const loaded = run('Poisson 18 req/s (~90 % of capacity)', { process: 'poisson', rate: 18 });
const burst = run('all at t=0 (saturated)', { process: 'burst', rate: 1 });
console.log('\ntarget: >= 10,000 simulated requests per wall second; the primary figure is the trace-timestamp run.');
printFigures({
  simRequestsPerWallS: Math.round(trace.perS),
  simRequestsPerWallSAt90pct: Math.round(loaded.perS),
  simRequestsPerWallSSaturated: Math.round(burst.perS),
  stepsPerWallS: Math.round(trace.r.batch.steps / trace.wall),
  requests: REQUESTS,
  seed: 1,
});
