// bench:request-actor — the cost of one request actor's life on the control plane's hot path, as the request table
// lives it: start admitted (create + start the XState actor, supervise it), scheduled, first token, more tokens,
// finished (the actor stops itself on its final state and reports its record). Microseconds of this process's CPU
// time per lifecycle (CPU rather than wall time: the figure should not depend on what else runs on the machine), the
// best of a few rounds after a warm-up; also with an inspector attached (every event through its observer, and
// through XState's interpreter of the machine), and the request machine as a bare XState actor, interpreted and
// compiled flat (runtime/flat-machine.ts): what XState's interpreter costs a request, and what is left without it.
// Ends with one JSON line.
import { createActor } from 'xstate';
import { createRequestTable, type RequestTable } from '../actors/control/request-table.ts';
import type { Live } from '../actors/control/types.ts';
import { createCollector } from '../actors/metrics/collector.ts';
import type { DecisionTrace } from '../actors/router/router.ts';
import { createVirtualClock } from '../runtime/clock.ts';
import { createDeadlineWheel } from '../runtime/deadlines.ts';
import { createRng } from '../runtime/rng.ts';
import { createRuntime } from '../runtime/system.ts';
import { requestMachine, type RequestContext, type RequestEvent } from '../machines/request.machine.ts';
import { compileFlatMachine } from '../runtime/flat-machine.ts';
import { printFigures, quick } from './lib/data.ts';

const LIVES = Number(process.env['BENCH_REQUEST_LIVES'] ?? (quick ? 20_000 : 100_000));
const ROUNDS = quick ? 3 : 5;

function setup(): { table: RequestTable; runtime: ReturnType<typeof createRuntime> } {
  const clock = createVirtualClock(0);
  const runtime = createRuntime({ name: 'bench', clock, rng: createRng(1) });
  const table = createRequestTable({
    runtime,
    collector: createCollector(),
    deadlines: createDeadlineWheel(clock),
    keepTraces: false,
    oracle: () => false,
    expiryTrace: () => ({}) as DecisionTrace,
    scheduled: () => {},
  });
  return { table, runtime };
}

let next = 0;
/** One lifecycle; `t` is virtual time in ms. */
function life(table: RequestTable, t: number): void {
  const id = `r${next++}`;
  const l = table.start(
    {
      id,
      spec: { model: 'm', priority: 'standard', promptTokens: 100, maxTokens: 64, outputTokens: 16 },
      model: 'm',
      version: 'v1',
      rank: 1,
      budgetMs: 60_000,
      estOutputTokens: 64,
      receivedAt: t,
      firstScheduledAt: -1,
      streamed: 0,
      seq: null,
      listener: undefined,
      traces: [],
      heldSince: -1,
    } as Omit<Live, 'actor' | 'streams'>,
    { budgetMs: 30_000, maxResumes: 1 },
    { replica: 'rep-1', t },
  );
  const seq = table.newSequence(l, 0);
  seq.listener.scheduled(seq, t + 1);
  seq.listener.tokens(seq, 1, t + 2);
  seq.generated = 1;
  seq.lastTokenAt = t + 2;
  seq.listener.tokens(seq, 15, t + 3);
  seq.generated = 16;
  seq.listener.finished(seq, t + 3);
  if (table.has(id)) throw new Error(`request ${id} did not finish`);
}

function measure(inspect: boolean): number {
  let best = Infinity;
  for (let round = 0; round < ROUNDS; round++) {
    const { table, runtime } = setup();
    let seen = 0;
    if (inspect) runtime.setInspector(() => seen++);
    for (let i = 0; i < 2000; i++) life(table, i);
    const c0 = process.cpuUsage();
    for (let i = 0; i < LIVES; i++) life(table, i);
    const c = process.cpuUsage(c0);
    const us = (c.user + c.system) / LIVES;
    if (inspect && seen === 0) throw new Error('the inspector saw nothing');
    best = Math.min(best, us);
  }
  return best;
}

/**
 * The request machine as a bare actor (created, started, then admitted, scheduled, first token, finished), with no
 * table, runtime or group around it: interpreted by XState, or compiled flat and run in XState's actor.
 */
function measureBare(flat: boolean): number {
  let best = Infinity;
  const logic = flat ? compileFlatMachine<RequestContext, RequestEvent>(requestMachine) : requestMachine;
  const bare = (i: number): void => {
    const a = createActor(logic as typeof requestMachine, {
      input: { id: `b${i}`, model: 'm', priority: 'standard', receivedAt: i, queueBudgetMs: 30_000 },
    });
    a.start();
    a.send({ type: 'request.admitted', replica: 'rep-1', t: i });
    a.send({ type: 'request.scheduled', replica: 'rep-1', t: i + 1 });
    a.send({ type: 'request.firstToken', t: i + 2 });
    a.send({ type: 'request.finished', tokens: 16, t: i + 3 });
    if (a.getSnapshot().status !== 'done') throw new Error('the bare request actor did not finish');
  };
  for (let round = 0; round < ROUNDS; round++) {
    for (let i = 0; i < 2000; i++) bare(i);
    const c0 = process.cpuUsage();
    for (let i = 0; i < LIVES; i++) bare(i);
    const c = process.cpuUsage(c0);
    best = Math.min(best, (c.user + c.system) / LIVES);
  }
  return best;
}

const usPerLife = measure(false);
const usPerLifeInspected = measure(true);
const usBare = measureBare(false);
const usBareFlat = measureBare(true);
console.log(
  `request actor life: ${usPerLife.toFixed(1)} us through the table, ${usPerLifeInspected.toFixed(1)} us inspected ` +
    `(interpreted); as a bare XState actor (created, started, four events) ${usBare.toFixed(1)} us interpreted, ` +
    `${usBareFlat.toFixed(1)} us compiled flat. A simulator whose every request lives as through the table ` +
    `simulates at most ${Math.round(1e6 / usPerLife)} requests per CPU second even if nothing else cost anything`,
);
printFigures({
  lives: LIVES,
  usPerRequestLife: Number(usPerLife.toFixed(2)),
  usPerRequestLifeInspected: Number(usPerLifeInspected.toFixed(2)),
  usPerBareXStateLife: Number(usBare.toFixed(2)),
  usPerBareFlatLife: Number(usBareFlat.toFixed(2)),
  simCeilingRequestsPerCpuS: Math.round(1e6 / usPerLife),
});
