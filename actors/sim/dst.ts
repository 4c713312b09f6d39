// Deterministic simulation testing: the whole system (control plane, node agent, clients) in virtual time, each
// seed with a random schedule of faults, and the promises P1–P16 checked while it runs. A failing seed is
// reproducible from its number and its fault schedule can be shrunk.
import { createHash } from 'node:crypto';
import { createRng, type Rng } from '../../runtime/rng.ts';
import type { InjectedFault } from '../../machines/messages.ts';
import type { ControlPlane, ControlPlaneMutations, SubmitSpec, TerminalOutcome } from '../control-plane.ts';
import { normalizeScenario, type Scenario } from '../config.ts';
import { loadTrace, type TraceRow } from './traffic.ts';
import { createConversationStream, type ConversationSpec } from './conversations.ts';
import { createVirtualClock } from '../../runtime/clock.ts';
import { buildDstSystem, type DstSystem } from './dst-system.ts';
import { longestStepMs } from '../control/invariants.ts';
import { watchRestart, type RestartCheck } from './dst-restart.ts';

/** A fault the harness can inject, at virtual seconds from the start of traffic. */
export type DstFault =
  | { kind: 'gpu-fault'; at: number; gpu: number; repairAt?: number }
  | { kind: 'straggle'; at: number; gpu: number; factor: number; repairAt?: number }
  | { kind: 'hang'; at: number; gpu: number; repairAt?: number }
  | { kind: 'silent'; at: number; gpu: number; repairAt?: number }
  | { kind: 'partition'; at: number; until?: number; direction: 'both' | 'aToB' | 'bToA' }
  | { kind: 'delay'; at: number; until: number; ms: number }
  | { kind: 'worker-crash'; at: number; restartAt?: number }
  | { kind: 'client-disconnect'; at: number; count: number }
  /** The control plane is killed at `at` (as `kill -9`) and a new one starts `downMs` later. */
  | { kind: 'control-restart'; at: number; downMs: number };

/** Test-only mutations that break a promise on purpose, to show the battery catches them. */
export type DstMutation =
  | 'none'
  | 'skip-gpu-release'
  | 'drop-interrupted'
  | 'held-on-ready-only'
  | 'adopt-nothing'
  | 'flat-drops-root-transitions'
  | 'lose-submits'
  | 'keep-prefix-on-failure';

/** Every mutation, for the CLI. */
export const DST_MUTATIONS: readonly DstMutation[] = [
  'none',
  'skip-gpu-release',
  'drop-interrupted',
  'held-on-ready-only',
  'adopt-nothing',
  'flat-drops-root-transitions',
  'lose-submits',
  'keep-prefix-on-failure',
];

/** The control plane's mutation options for a DST mutation. */
const MUTATIONS: Record<DstMutation, ControlPlaneMutations> = {
  none: {},
  'skip-gpu-release': { dropGpuReleases: true },
  'drop-interrupted': { dropInterrupted: true },
  'held-on-ready-only': { heldOnReadyOnly: true },
  'adopt-nothing': { adoptNothing: true },
  'flat-drops-root-transitions': { flatDropsRootTransitions: true },
  'lose-submits': { loseSubmits: true },
  'keep-prefix-on-failure': { keepPrefixOnFailure: true },
};

/** How often work conservation (P10) is sampled (virtual ms). */
const CONSERVATION_SAMPLE_MS = 50;
/** P15: slack (ms) past a replica's longest step before work the control plane has not heard progress of counts as a
 * stale view (the link's latency and a tick's coalescing fit well inside it). */
export const P15_SLACK_MS = 250;
/** P15 does not judge a replica's view while a fault was active or up to this long after it ended (ms). */
export const P15_FAULT_SHADOW_MS = 30_000;
/** P11: an admitted request predicted to wait at most this share of its budget must be scheduled within it. */
export const P11_PREDICTION_SHARE = 0.5;
/** P11 does not judge requests that waited while a fault was active or up to this long after it ended (ms). */
export const P11_FAULT_SHADOW_MS = 30_000;

/** What one seed's run found. */
export interface DstResult {
  seed: number;
  layout: string;
  faults: DstFault[];
  requests: number;
  outcomes: Record<string, number>;
  violations: string[];
  /** Hash of everything observable (outcomes, token streams, placement events): equal for equal seeds. */
  traceHash: string;
  simulatedSeconds: number;
  permanent: boolean;
}

/** Options of a DST run. */
export interface DstOptions {
  simSeconds: number;
  faults?: DstFault[];
  mutation?: DstMutation;
  /** The reference run: every frame through the codec and every request event through the interpreted machine. The
   * result is the same either way; a test shows it. */
  stepByStep?: boolean;
}

const LAYOUTS = ['small-exclusive', 'large-exclusive', 'mixed-switch'] as const;
type Layout = (typeof LAYOUTS)[number];

/** Every other seed of the small-exclusive layout serves multi-turn conversations with shared system prompts to
 * replicas that keep a prefix cache (routing on it), under the same faults. */
function prefixSeed(layout: Layout, seed: number): boolean {
  return layout === 'small-exclusive' && Math.floor(seed / LAYOUTS.length) % 2 === 1;
}

/** The conversations of a prefix seed: system prompts shared by half of them, a few turns each. */
const DST_CONVERSATIONS: ConversationSpec = {
  systemPrompts: 3,
  systemTokens: 600,
  shared: 0.5,
  turns: { mean: 4, max: 10 },
  userTokens: { mean: 100, cv: 0.8, max: 800 },
  thinkMs: 4_000,
};

function scenarioFor(layout: Layout, seed: number): Scenario {
  const small = {
    name: 'llama-3-8b',
    profile: 'llama-3-8b',
    tp: 1,
    replicas: 3,
    resume: { maxResumes: 2, budgetMs: 60_000 },
    // A prefix cache small enough that conversations compete for it: eviction under pressure is exercised.
    ...(prefixSeed(layout, seed) ? { batching: { prefixCache: true, kvBlocks: 2048 } } : {}),
  };
  const large = {
    name: 'llama-3-70b',
    profile: 'llama-3-70b',
    tp: 8,
    replicas: 1,
    resume: { maxResumes: 2, budgetMs: 120_000 },
  };
  const base = {
    name: `dst-${layout}`,
    seed,
    detection: { heartbeatMs: 500, missedHeartbeats: 3 },
    node: { repairMs: 5_000 },
    sim: { checkInvariants: true },
  };
  if (layout === 'small-exclusive') return normalizeScenario({ ...base, models: [small] });
  if (layout === 'large-exclusive') return normalizeScenario({ ...base, models: [large] });
  return normalizeScenario({
    ...base,
    placement: { policy: 'switch', drainDeadlineMs: 10_000, minResidencyMs: 20_000 },
    models: [large, { ...small, replicas: 8 }],
  });
}

/** Draws a random fault schedule for a seed; some seeds make a fault permanent (liveness mode). */
export function drawFaults(rng: Rng, simSeconds: number, gpus: number): { faults: DstFault[]; permanent: boolean } {
  const faults: DstFault[] = [];
  const n = 1 + rng.int(4);
  const permanent = rng.next() < 0.15;
  const window = simSeconds * 0.5;
  for (let i = 0; i < n; i++) {
    const at = Math.round(rng.next() * window * 10) / 10;
    const repairAt = Math.round((at + 2 + rng.next() * 10) * 10) / 10;
    const gpu = rng.int(gpus);
    const keep = permanent && i === 0;
    switch (rng.int(8)) {
      case 0:
        faults.push({ kind: 'gpu-fault', at, gpu, ...(keep ? {} : { repairAt }) });
        break;
      case 1:
        faults.push({ kind: 'straggle', at, gpu, factor: 2 + rng.int(4), repairAt });
        break;
      case 2:
        faults.push({ kind: 'hang', at, gpu, ...(keep ? {} : { repairAt }) });
        break;
      case 3:
        faults.push({ kind: 'silent', at, gpu, ...(keep ? {} : { repairAt }) });
        break;
      case 4:
        faults.push({
          kind: 'partition',
          at,
          until: repairAt,
          direction: (['both', 'aToB', 'bToA'] as const)[rng.int(3)]!,
        });
        break;
      case 5:
        faults.push({ kind: 'delay', at, until: repairAt, ms: 20 + rng.int(400) });
        break;
      case 6:
        faults.push({ kind: 'worker-crash', at, restartAt: repairAt });
        break;
      default:
        faults.push({ kind: 'client-disconnect', at, count: 1 + rng.int(5) });
    }
  }
  // Control-plane restarts are drawn after the rest (a seed's other faults stay what they were), at any moment:
  // mid-switch, mid-repair, during a partition.
  const restarts = rng.next() < 0.4 ? 1 + rng.int(2) : 0;
  for (let i = 0; i < restarts; i++) {
    const at = Math.round(rng.next() * simSeconds * 0.6 * 10) / 10;
    faults.push({ kind: 'control-restart', at, downMs: Math.round(rng.next() * 3000) });
  }
  return { faults, permanent };
}

interface ClientView {
  model: string;
  expected: number;
  terminal: TerminalOutcome | null;
  terminals: number;
  streaming: boolean;
  /** Its control plane crashed before it ended: the client saw its connection drop (its one outcome). */
  lost: boolean;
  /** The control plane incarnation that accepted it. */
  plane: number;
}

/** A seed's clients and the checks on what they hear (P1, P2, P5). */
interface DstClients {
  views: Map<string, ClientView>;
  hash: ReturnType<typeof createHash>;
  violate(p: string, what: string): void;
  violations: string[];
  /** Submits as a client, registering the client's view before the control plane can answer; false while no control
   * plane is up (the client cannot connect: nothing was accepted). */
  submit(spec: SubmitSpec, terminal?: (id: string, o: TerminalOutcome) => void): boolean;
  /** The control plane crashed: its clients' requests that had not ended see their connection drop. */
  dropPlane(plane: number): void;
}

function attachClients(sys: DstSystem): DstClients {
  const views = new Map<string, ClientView>();
  const hash = createHash('sha256');
  const violations: string[] = [];
  const violate = (p: string, what: string): void => {
    if (violations.length < 50) violations.push(`${p}: ${what}`);
  };
  const listener = {
    tokens: (id: string, seqNo: number, n: number) => {
      const c = views.get(id);
      if (!c) return violate('P2', `tokens for unknown request ${id}`);
      if (c.terminal || c.lost) violate('P2', `${id}: token after its terminal outcome`);
      if (seqNo !== c.expected) violate('P2', `${id}: token sequence ${seqNo} where ${c.expected} was expected`);
      c.expected = seqNo + n;
      c.streaming = true;
    },
    terminal: (id: string, o: TerminalOutcome) => {
      const c = views.get(id);
      if (!c) return violate('P1', `terminal for unknown request ${id}`);
      c.terminals++;
      if (c.terminals > 1 || c.lost) violate('P1', `${id}: a second terminal outcome (${o.outcome})`);
      c.terminal = o;
      if (o.tokens !== c.expected)
        violate('P2', `${id}: terminal says ${o.tokens} tokens, the client received ${c.expected}`);
      if (o.code === 'overloaded' && !(o.retryAfterMs !== undefined && o.retryAfterMs > 0))
        violate('P5', `${id}: overloaded without retryAfterMs`);
      hash.update(`${id}:${o.outcome}:${o.code}:${o.tokens};`);
    },
  };
  return {
    views,
    hash,
    violate,
    violations,
    submit: (spec, terminal) => {
      const cp = sys.cp;
      if (!cp) return false;
      // `submit` reports synchronously for rejections, so the view is registered before the listener can fire.
      // A restarted control plane's ids start again: its clients' ids carry the incarnation.
      const plane = sys.planes.length - 1;
      const id = `${plane > 0 ? `c${plane}.` : ''}${cp.runtime.ids.next('req')}`;
      views.set(id, {
        model: spec.model,
        expected: 0,
        terminal: null,
        terminals: 0,
        streaming: false,
        lost: false,
        plane,
      });
      const res = cp.submit(
        { ...spec, id },
        terminal ? { ...listener, terminal: (i, o) => (listener.terminal(i, o), terminal(i, o)) } : listener,
      );
      if (!res.ok && views.get(res.id)!.terminals === 0)
        violate('P1', `${res.id}: rejected without a terminal outcome`);
      return true;
    },
    dropPlane: (plane) => {
      for (const [id, c] of views) {
        if (c.plane !== plane || c.terminal || c.lost) continue;
        c.lost = true;
        c.terminals++;
        hash.update(`${id}:lost:${c.expected};`);
      }
    },
  };
}

/** Poisson arrivals per model at a moderate share of its capacity, lengths from the conversation trace. */
function scheduleTraffic(
  sys: DstSystem,
  clients: DstClients,
  rng: Rng,
  layout: Layout,
  origin: number,
  endMs: number,
  prefix: boolean,
) {
  const rows: TraceRow[] = loadTrace('splitwise_conv').filter((r) => r.prompt + r.output <= 4096);
  const rates: Record<string, number> =
    layout === 'small-exclusive'
      ? { 'llama-3-8b': 12 }
      : layout === 'large-exclusive'
        ? { 'llama-3-70b': 3 }
        : { 'llama-3-8b': 6, 'llama-3-70b': 0.5 };
  const counter = { submitted: 0 };
  if (prefix) {
    // Conversations start at the small model's rate; every turn after the first comes back a think time later.
    const model = 'llama-3-8b';
    const r = rng.fork('conversations');
    const turns = createConversationStream({
      spec: DST_CONVERSATIONS,
      requests: 100_000,
      start: origin,
      startGapMs: () => r.exponential(1000 / 4),
      outputTokens: () => rows[r.int(rows.length)]!.output,
      rng: r.fork('turns'),
    });
    for (let turn = turns.next(); turn !== null && turn.t < endMs; turn = turns.next()) {
      const { promptTokens, outputTokens, segments } = turn;
      if (promptTokens + outputTokens > 4096) continue;
      sys.clock.at(turn.t, () => {
        if (clients.submit({ model, promptTokens, maxTokens: outputTokens, outputTokens, segments }))
          counter.submitted++;
      });
    }
    return counter;
  }
  for (const [model, rate] of Object.entries(rates)) {
    const r = rng.fork(model);
    let t = origin;
    for (;;) {
      t += r.exponential(1000 / rate);
      if (t >= endMs) break;
      const row = rows[r.int(rows.length)]!;
      sys.clock.at(t, () => {
        if (clients.submit({ model, promptTokens: row.prompt, maxTokens: row.output, outputTokens: row.output }))
          counter.submitted++;
      });
    }
  }
  return counter;
}

/** Schedules the faults; answers when the last one ends and the windows in which a fault was active. */
function scheduleFaults(
  sys: DstSystem,
  clients: DstClients,
  faults: DstFault[],
  origin: number,
  restart: RestartCheck,
) {
  const { clock, nodeRt } = sys;
  let lastFaultEnd = origin;
  const windows: [number, number][] = [];
  const at = (s: number, fn: () => void): void => {
    const t = origin + s * 1000;
    lastFaultEnd = Math.max(lastFaultEnd, t);
    clock.at(t, fn);
  };
  const inject = (gpu: number, fault: InjectedFault, factor?: number): void =>
    nodeRt.send('node', { type: 'gpu.inject', gpu, fault, ...(factor ? { factor } : {}) });
  for (const f of faults) {
    const end =
      'repairAt' in f
        ? f.repairAt
        : 'until' in f
          ? f.until
          : 'restartAt' in f
            ? f.restartAt
            : 'downMs' in f
              ? f.at + f.downMs / 1000
              : f.at;
    windows.push([origin + f.at * 1000, end === undefined ? Infinity : origin + end * 1000]);
    switch (f.kind) {
      case 'gpu-fault':
      case 'hang':
      case 'silent':
      case 'straggle':
        at(f.at, () =>
          inject(f.gpu, f.kind === 'gpu-fault' ? 'fault' : f.kind, f.kind === 'straggle' ? f.factor : undefined),
        );
        if (f.repairAt !== undefined) at(f.repairAt, () => inject(f.gpu, 'repair'));
        break;
      case 'partition':
        at(f.at, () => sys.cut(f.direction));
        if (f.until !== undefined) at(f.until, () => sys.heal());
        break;
      case 'delay':
        at(f.at, () => sys.setExtraLatency(f.ms));
        at(f.until, () => sys.setExtraLatency(0));
        break;
      case 'worker-crash':
        at(f.at, () => {
          sys.stopAgent();
          sys.cut('both');
        });
        if (f.restartAt !== undefined)
          at(f.restartAt, () => {
            // A worker that is already running (restarted by an earlier crash's restart) is not started twice.
            if (sys.agent()) return;
            sys.heal();
            sys.startAgent();
          });
        break;
      case 'client-disconnect':
        at(f.at, () => {
          let n = f.count;
          for (const [id, c] of clients.views) {
            if (n <= 0) break;
            if (c.streaming && !c.terminal && !c.lost && sys.cp && c.plane === sys.planes.length - 1) {
              sys.cp.cancel(id);
              // A cancel ends the request at once, as cancelled: one outcome, and the one the client asked for.
              // (Read again: the cancel has just set it.)
              const ended = (c as { terminal?: { outcome: string } }).terminal;
              if (ended?.outcome !== 'cancelled')
                clients.violate('P1', `${id}: cancelled, but its outcome is ${ended?.outcome ?? 'not yet given'}`);
              n--;
            }
          }
        });
        break;
      case 'control-restart':
        at(f.at, () => {
          if (!sys.cp) return;
          restart.crashed();
          clients.dropPlane(sys.planes.length - 1);
          sys.crashControl();
        });
        at(f.at + f.downMs / 1000, () => {
          if (sys.cp) return;
          restart.started(attachMonitors(sys, clients, sys.startControl()));
        });
        break;
    }
  }
  return { lastFaultEnd, windows };
}

/** P15: every serving replica's work the control plane has not heard progress of (a step in flight, or submits its
 * core has not reported) is at most its longest step (or the step predicted, if longer) plus P15_SLACK_MS old, while
 * no fault is active nor was within P15_FAULT_SHADOW_MS. */
function staleViews(cp: ControlPlane, now: number, windows: readonly [number, number][]): [string, string][] {
  const out: [string, string][] = [];
  if (windows.some(([a, b]) => a <= now && now <= b + P15_FAULT_SHADOW_MS)) return out;
  for (const r of cp.placement.replicas.values()) {
    if (!r.hasTag('serving')) continue;
    const f = r.inflight();
    if (!f) continue;
    const bound = Math.max(f.predictedMs, longestStepMs(r)) + P15_SLACK_MS;
    if (now - f.since > bound)
      out.push([
        r.id,
        `${r.id}: no progress heard for ${Math.round(now - f.since)} ms of work outstanding (bound ${Math.round(bound)} ms)`,
      ]);
  }
  return out;
}

/** P16: the prefix index holds blocks only for replicas that serve (ready, or draining what they run): a replica that
 * failed, stopped or is loading again lost its cache, and routing must not count on it. */
function stalePrefixes(cp: ControlPlane): string[] {
  const out: string[] = [];
  for (const id of cp.prefix.replicas()) {
    const r = cp.placement.replicas.get(id);
    if (!r || !r.hasTag('serving'))
      out.push(`${id}: the prefix index holds ${cp.prefix.size(id)} blocks of a replica ${r ? r.state() : 'gone'}`);
  }
  return out;
}

/** Checks while it runs: P6 ownership and gangs, P5 bounded queues after every step; P7 readiness each second;
 * P10 work conservation, P15 view staleness and P16 prefix index every CONSERVATION_SAMPLE_MS. */
function startMonitors(
  sys: DstSystem,
  clients: DstClients,
  origin: number,
  simSeconds: number,
  windows: readonly [number, number][],
): void {
  const { scenario, clock } = sys;
  attachMonitors(sys, clients, sys.cp!);
  // A replica's stale view is reported once.
  const staleSeen = new Set<string>();
  const prefixSeen = new Set<string>();
  const checkReadiness = (): void => {
    const cp = sys.cp;
    if (!cp) return;
    const healthy = (): number => [...cp.placement.gpus.values()].filter((g) => g.healthy).length;
    for (const m of scenario.models) {
      if (healthy() < m.tp && cp.placement.unavailable(m.name) === null)
        clients.violate('P7', `${m.name} reported available with ${healthy()} healthy GPUs`);
    }
  };
  for (let s = 1; s < simSeconds; s += 1) clock.at(origin + s * 1000, checkReadiness);
  for (let t = origin; t < origin + simSeconds * 1000; t += CONSERVATION_SAMPLE_MS)
    clock.at(t, () => {
      for (const v of sys.cp?.checkWorkConservation() ?? []) clients.violate('P10', v);
      const cp = sys.cp;
      if (!cp) return;
      for (const [replica, v] of staleViews(cp, clock.now(), windows)) {
        if (staleSeen.has(replica)) continue;
        staleSeen.add(replica);
        clients.violate('P15', v);
      }
      for (const v of stalePrefixes(cp)) {
        const replica = v.slice(0, v.indexOf(':'));
        if (prefixSeen.has(replica)) continue;
        prefixSeen.add(replica);
        clients.violate('P16', v);
      }
    });
}

/** P6 ownership and gangs, P5 bounded queues after every step of `cp` (each control plane as it starts). */
function attachMonitors(sys: DstSystem, clients: DstClients, cp: ControlPlane): ControlPlane {
  const classLimit = new Map(sys.scenario.models.map((m) => [m.name, Math.max(...m.classes.map((c) => c.maxQueued))]));
  cp.onProgress = (r) => {
    for (const v of cp.placement.checkInvariants()) clients.violate('P6', v);
    const st = r.work.stats();
    if (st.waiting > (classLimit.get(r.model) ?? Infinity) * 2)
      clients.violate('P5', `${r.id} queue of ${st.waiting} beyond its bounds`);
  };
  return cp;
}

/** P9 liveness: once faults stop, every model the healthy GPUs can hold serves again within the bound. */
function probeLiveness(sys: DstSystem, clients: DstClients, lastFaultEnd: number): void {
  const { clock, scenario } = sys;
  const settleMs = 180_000;
  const probeAt = Math.max(clock.now(), lastFaultEnd) + settleMs;
  clock.run(probeAt);
  const cp = sys.cp!;
  // A probe behaves as a client should: on `overloaded` it retries after retryAfterMs (a switch may be needed
  // first), for as long as the bound allows.
  const probeBoundMs = 300_000;
  const probes = new Map<string, { last: string | null; done: boolean }>();
  const probe = (model: string): void => {
    const state = probes.get(model)!;
    if (clock.now() > probeAt + probeBoundMs) return;
    clients.submit({ model, promptTokens: 16, maxTokens: 4, outputTokens: 4 }, (id, o) => {
      state.last = `${id} ${o.outcome}${o.code ? ` ${o.code}` : ''}`;
      if (o.outcome === 'done') state.done = true;
      else clock.setTimeout(() => probe(model), Math.max(100, o.retryAfterMs ?? 1000));
    });
  };
  const healthy = [...cp.placement.gpus.values()].filter((g) => g.healthy).length;
  for (const m of scenario.models) {
    if (healthy < m.tp) continue;
    probes.set(m.name, { last: null, done: false });
    probe(m.name);
  }
  clock.run(probeAt + probeBoundMs + 60_000);
  for (const [model, st] of probes) {
    if (!st.done)
      clients.violate(
        'P9',
        `${model}: not serving within ${(settleMs + probeBoundMs) / 1000} s after the last fault (last probe: ${st.last ?? 'none'})`,
      );
  }
}

/** The checks at the end: P1 one outcome each, P3 queue budgets, P4 resumes, P8 ledger, P11 admission. */
function finalChecks(sys: DstSystem, clients: DstClients, faultWindows: [number, number][]): void {
  const { scenario, nodeRt, planes } = sys;
  const { violate } = clients;
  for (const [id, c] of clients.views) if (!c.terminal && !c.lost) violate('P1', `${id}: no terminal outcome`);
  const overBudget = planes.reduce((n, cp) => n + cp.collector.overBudget(), 0);
  if (overBudget > 0) violate('P3', `${overBudget} requests waited past their queue budget`);
  const maxResumes = new Map(scenario.models.map((m) => [m.name, m.resume.maxResumes]));
  // Records of requests a crashed control plane held are gone with it (their clients saw the connection drop).
  const records = new Map(planes.flatMap((cp) => cp.collector.records.map((r) => [r.id, r] as const)));
  for (const r of records.values()) {
    if (r.resumes > (maxResumes.get(r.model) ?? 0)) violate('P4', `${r.id}: resumed ${r.resumes} times`);
  }
  for (const [id, c] of clients.views) {
    const rec = records.get(id);
    if (c.terminal?.outcome === 'done' && rec && rec.tokens !== c.expected)
      violate('P4', `${id}: done with ${rec.tokens} tokens recorded, ${c.expected} streamed`);
  }
  for (const cp of planes) {
    for (const v of cp.violations) violate('P8', v);
    for (const v of admittedToExpire(cp, faultWindows)) violate('P11', v);
    for (const f of cp.runtime.faults) violate('actor', `${f.actor}: ${String(f.error)}`);
  }
  for (const f of nodeRt.faults) violate('actor', `${f.actor}: ${String(f.error)}`);
}

/**
 * P11: admitted requests that expired without ever being scheduled although their admission predicted a wait of
 * at most P11_PREDICTION_SHARE of their budget, never resumed, and waited while no fault was active (nor within
 * P11_FAULT_SHADOW_MS after one ended).
 */
export function admittedToExpire(cp: ControlPlane, faultWindows: readonly [number, number][]): string[] {
  const out: string[] = [];
  for (const r of cp.collector.records) {
    if (r.code !== 'expired' || r.firstScheduledAt >= 0 || r.resumes > 0) continue;
    const predicted = cp.explain(r.id)?.[0]?.predictedWaitMs;
    if (predicted === undefined || predicted > P11_PREDICTION_SHARE * r.budgetMs) continue;
    if (faultWindows.some(([a, b]) => a <= r.finishedAt && r.receivedAt <= b + P11_FAULT_SHADOW_MS)) continue;
    out.push(
      `${r.id}: admitted with a predicted wait of ${Math.round(predicted)} ms, expired after ${Math.round(r.finishedAt - r.receivedAt)} ms without being scheduled`,
    );
  }
  return out;
}

/** Runs one seed: the full system, the seed's faults (or the given ones), and the P1–P11 monitors. */
export function runDstSeed(seed: number, opts: DstOptions): DstResult {
  const rng = createRng(seed);
  const layout = LAYOUTS[seed % LAYOUTS.length]!;
  const scenario = scenarioFor(layout, seed);
  const drawn = drawFaults(rng.fork('faults'), opts.simSeconds, scenario.node.gpus);
  const faults = opts.faults ?? drawn.faults;
  const permanent =
    faults.some(
      (f) => (f.kind === 'gpu-fault' || f.kind === 'hang' || f.kind === 'silent') && f.repairAt === undefined,
    ) ||
    faults.some((f) => f.kind === 'worker-crash' && f.restartAt === undefined) ||
    faults.some((f) => f.kind === 'partition' && f.until === undefined);
  const clock = createVirtualClock();
  const sys = buildDstSystem(clock, rng, scenario, MUTATIONS[opts.mutation ?? 'none'], {
    stepByStep: opts.stepByStep === true,
  });
  clock.run(600_000);
  const origin = clock.now();
  const clients = attachClients(sys);
  if (sys.cp!.placement.replicas.size === 0) clients.violate('boot', 'the initial placement did not load');

  const endMs = origin + opts.simSeconds * 1000;
  const trafficEnd = origin + opts.simSeconds * 750;
  const traffic = scheduleTraffic(
    sys,
    clients,
    rng.fork('traffic'),
    layout,
    origin,
    trafficEnd,
    prefixSeed(layout, seed),
  );
  const restart = watchRestart(sys, faults, origin, clients.violate);
  const { lastFaultEnd, windows } = scheduleFaults(sys, clients, faults, origin, restart);
  startMonitors(sys, clients, origin, opts.simSeconds, windows);
  clock.run(endMs);
  probeLiveness(sys, clients, lastFaultEnd);
  finalChecks(sys, clients, windows);

  const outcomes: Record<string, number> = {};
  for (const c of clients.views.values()) {
    const k = c.lost
      ? 'connection_lost'
      : c.terminal
        ? c.terminal.outcome === 'done'
          ? 'done'
          : (c.terminal.code ?? c.terminal.outcome)
        : 'none';
    outcomes[k] = (outcomes[k] ?? 0) + 1;
  }
  for (const cp of sys.planes) clients.hash.update(JSON.stringify(cp.placement.events));
  return {
    seed,
    layout,
    faults,
    requests: traffic.submitted,
    outcomes: Object.fromEntries(Object.entries(outcomes).sort(([a], [b]) => a.localeCompare(b))),
    violations: clients.violations,
    traceHash: clients.hash.digest('hex').slice(0, 16),
    simulatedSeconds: Math.round((clock.now() - origin) / 1000),
    permanent,
  };
}

/** Shrinks a failing fault schedule: drops faults one at a time while the seed still fails. */
export function shrinkFaults(seed: number, opts: DstOptions, faults: DstFault[]): DstFault[] {
  let current = faults;
  for (let i = 0; i < current.length;) {
    const candidate = current.filter((_, j) => j !== i);
    if (runDstSeed(seed, { ...opts, faults: candidate }).violations.length > 0) current = candidate;
    else i++;
  }
  return current;
}
