// Exhaustive interleavings of one tensor-parallel replica with its GPU actors: the real replica and GPU machines
// (pure transitions, cached), an abstract engine core beside the gang's engine and the control plane's side of it,
// FIFO links, faults, a drain and (optionally) a throw in the control plane's handling of progress at any point.
//
// The core runs the step loop: a step runs on every rank and completes only when every rank finished its share; the
// core then reports progress (units finished, what it holds, saturation) under the epoch its gang serves. Ranks report
// nothing per step to the control plane. The control plane's side (as actors/replica.ts) hands units to the core,
// applies progress of the replica's current epoch while it serves, and tells the machine of changes of its work:
// `work.available`, `work.saturated`/`work.unsaturated`, and `work.idle` once it holds nothing and no submit is unheard.
// Any rank's abort (a fault, a release) stops the core: its step in flight never completes.
//
// What keeps eight GPUs small (a naive composition with per-channel FIFO queues reaches millions of states):
// - symmetry: GPUs are interchangeable, so a world is keyed by the sorted multiset of per-GPU signatures and GPU
//   events are tried on one GPU per signature class;
// - eager commands (`downlink: 'eager'`): a command reaches its GPU when sent. Delivering it touches only that GPU,
//   so it commutes with everything but that GPU's own timers and fault, which in turn commute with the send;
// - dead reports (`pruneDeadReports`): a report no reachable replica state handles is dropped on arrival in the link.
// Both are cross-checked against the plain model (per-GPU FIFO commands, every report delivered) by the tests.
//
// The replica's retries (`after` transitions that repeat unanswered assignments and releases) are explored too: a
// retry may fire at any point `retries` times, and after that whenever nothing but the environment (a fault, a loss)
// can act, which is what a retry period longer than any message round trip means. The environment may lose
// `losses` assignments, releases or their answers, so a replica that does not repeat them is caught stuck.
import {
  initialTransition,
  transition,
  type AnyEventObject,
  type AnyMachineSnapshot,
  type AnyStateMachine,
} from 'xstate';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import { replicaMachine } from '../../machines/replica.machine.ts';
import { liveEventTypes, pendingTimers, pureStepper } from './pure.ts';
import { engineCore } from './tp-core.ts';
import { worldKeys, type Gpu, type Msg, type World } from './tp-world.ts';

/** The size of the composition and the machines under test. */
export interface TpOptions {
  /** Ranks of the replica (8 for the large model). */
  gpus: number;
  /** GPU faults the environment may inject, each at any point. */
  faults: number;
  /** Units of work that may arrive while the replica accepts; each step of the core finishes one. */
  arrivals: number;
  /** The core reports saturation when it holds at least this many units after a step. */
  saturateAt?: number;
  /** Times the control plane's handling of a progress report may throw (`step.crashed`; default 0). */
  crashes?: number;
  /** Whether a drain may be requested at any point (default true). */
  drain?: boolean;
  /**
   * Messages the environment may lose (default 0): a `gpu.loaded` or `gpu.released` on its way back, or (with FIFO
   * commands) a `gpu.assign` or `gpu.release` on its way down. The retries must make up for each one.
   */
  losses?: number;
  /** Times a replica retry may fire at any point (default 0); beyond that it fires only when nothing else can act. */
  retries?: number;
  /**
   * `eager` (default): a command from the replica reaches its GPU (a submit its core) at once; `fifo`: it waits in a
   * per-GPU FIFO (submits in the core's) until the checker delivers it. Both ways every GPU's reports and the core's
   * progress wait in their own FIFO.
   */
  downlink?: 'eager' | 'fifo';
  /**
   * Drop a report at once when no state the replica can still reach handles its type (default true): its arrival
   * would be a no-op that commutes with everything. The tests cross-check the outcomes with it off.
   */
  pruneDeadReports?: boolean;
  /** The replica machine under test (default: machines/replica.machine.ts). */
  replica?: AnyStateMachine;
  /** The GPU machine under test (default: machines/gpu.machine.ts). */
  gpu?: AnyStateMachine;
  /** Gives up past this many states. */
  maxStates?: number;
  /** Stop after this many violations (each with its path). */
  maxViolations?: number;
}

/** A broken property with the shortest interleaving that reaches it. */
export interface Violation {
  property: string;
  detail: string;
  path: string[];
}

/** What an exhaustive run found. */
export interface TpReport {
  states: number;
  transitions: number;
  /** States in which nothing but a further fault can happen. */
  quiescent: number;
  /** Distinct environment inputs (faults while owned, faults after release, drain, arrivals) seen at quiescence. */
  scenarios: number;
  /** Per scenario, the distinct outcomes reached (one each when the outcome does not depend on the order). */
  outcomes: Map<string, Set<string>>;
  violations: Violation[];
  cachedTransitions: number;
  /** Progress reports that reached the control plane for a dead epoch or a replica no longer serving (each dropped,
   * and checked to change nothing had the machine heard the work events it carries). */
  staleResultsDelivered: number;
  /** Reports dropped because no state the replica can still reach handles them. */
  deadReportsDropped: number;
  /** The replica states the composition visited (dotted paths). */
  replicaStates: string[];
  /** Explored steps in which the environment lost a message, and in which a replica retry fired. */
  lossesExplored: number;
  retriesExplored: number;
}

const REPLICA_ID = 'replica.big@v1#0';
/** The epoch the replica starts in: its GPUs are assigned, and its core reports, under it. */
const EPOCH = 0;

/** Messages the environment may lose: the ones the replica's retries repeat (or whose answers they ask again). */
const LOSABLE = new Set(['gpu.assign', 'gpu.release', 'gpu.loaded', 'gpu.released']);
/** A replica timer that repeats unanswered commands (`assignRetry`, `releaseRetry`). */
const isRetry = (timer: string): boolean => timer.split('.')[2]!.endsWith('Retry');
/** A step of the environment rather than of the system: a fault, a lost message or a throw. */
const environment = (label: string): boolean =>
  label.endsWith(' faults') || label.endsWith(' is lost') || label.endsWith(' throws');
/** What the control plane tells the machine when its handling of progress threw. */
const CRASHED: AnyEventObject = { type: 'step.crashed', error: new Error('applying progress threw') };
/** The work events a progress report can cause. */
const WORK_EVENTS: readonly AnyEventObject[] = [
  { type: 'work.idle' },
  { type: 'work.saturated' },
  { type: 'work.unsaturated' },
];

/** Runs the exhaustive exploration and checks every property along the way. */
export function checkTensorParallel(o: TpOptions): TpReport {
  const n = o.gpus;
  const rm = o.replica ?? replicaMachine;
  const gm = o.gpu ?? gpuMachine;
  const saturateAt = o.saturateAt ?? 2;
  const eager = (o.downlink ?? 'eager') === 'eager';
  const pruneDead = o.pruneDeadReports ?? true;
  const maxStates = o.maxStates ?? 5_000_000;
  const maxViolations = o.maxViolations ?? 5;
  const losses = o.losses ?? 0;
  const retries = o.retries ?? 0;
  const crashes = o.crashes ?? 0;
  const replicaInput = {
    id: REPLICA_ID,
    model: 'big',
    version: 'v1',
    gpus: [...Array(n).keys()],
    epoch: EPOCH,
    loadMs: 100,
    unloadMs: 50,
  };
  const violations: Violation[] = [];
  const seenProperties = new Set<string>();
  let staleResultsDelivered = 0;
  let deadReportsDropped = 0;
  let lossesExplored = 0;
  let retriesExplored = 0;

  // Cached pure transitions of both machines (every GPU runs as the same canonical GPU, index 0).
  const replicaSteps = pureStepper(rm, replicaInput);
  const gpuSteps = pureStepper(gm, { index: 0 });
  const snapKey = (s: AnyMachineSnapshot): string => JSON.stringify([s.value, s.status, s.context]);

  const [replica0] = initialTransition(rm, replicaInput);
  const gpus0: Gpu[] = [];
  for (let i = 0; i < n; i++) {
    // GPUs start registered, probed and free.
    // Every GPU runs as the same canonical GPU (index 0): their transitions are shared, their reports relabelled.
    let [g] = initialTransition(gm, { index: 0 });
    [g] = transition(gm, g, { type: 'gpu.register' });
    [g] = transition(gm, g, { type: 'gpu.probed' });
    gpus0.push({
      snap: g,
      exec: null,
      down: [],
      up: [],
      owner: true,
      ownedFault: false,
      freeFault: false,
      releaseHeard: false,
    });
  }

  const clone = (w: World): World => ({ ...w, gpus: [...w.gpus], failedEpochs: [...w.failedEpochs] });
  const failed = (w: World): boolean => w.failedEpochs.length > 0 || w.replica.hasTag('failed');
  const setGpu = (w: World, i: number, patch: Partial<Gpu>): void => {
    w.gpus[i] = { ...w.gpus[i]!, ...patch };
  };
  const ctx = (s: AnyMachineSnapshot): Record<string, unknown> => s.context as Record<string, unknown>;

  // One violation per property, with its path, is enough to debug; the run goes on to count states.
  let currentPath: () => string[] = () => [];
  const violate = (property: string, detail: string): void => {
    if (seenProperties.has(property) || violations.length >= maxViolations) return;
    seenProperties.add(property);
    violations.push({ property, detail, path: currentPath() });
  };

  // A canonical GPU's report as GPU i sends it (one object per report and GPU, so names and caches hit by identity).
  const relabelled = new WeakMap<object, Msg[]>();
  const relabel = (m: Msg, i: number): Msg => {
    if (!('gpu' in m)) return m;
    let per = relabelled.get(m);
    if (!per) relabelled.set(m, (per = []));
    return (per[i] ??= { ...m, gpu: i });
  };

  const core = engineCore({ replica: REPLICA_ID, epoch: EPOCH, saturateAt, violate });

  // A GPU machine takes an event; what it emits goes onto its report link, an abort stops the core.
  const gpuEvent = (w: World, i: number, e: AnyEventObject): void => {
    const g = w.gpus[i]!;
    const [next, actions] = gpuSteps.step(g.snap, e);
    const up = [...g.up];
    let aborted = false;
    for (const a of actions) {
      if (a.type === 'xstate.emit') {
        const ev = (a.params as { event: { to: string; msg: Msg } }).event;
        up.push([ev.to, relabel(ev.msg, i)]);
      } else if (a.type === 'abortStep') aborted = true;
      else if (a.type !== 'xstate.raise' && a.type !== 'xstate.cancel') violate('unmodelled GPU action', a.type);
    }
    setGpu(w, i, { snap: next, up });
    if (aborted) core.stop(w);
  };

  // The node's side of a command: it goes to the GPU actor.
  const deliverDown = (w: World, i: number, m: Msg): void => gpuEvent(w, i, m);

  const sendDown = (w: World, i: number, m: Msg): void => {
    if (eager) deliverDown(w, i, m);
    else setGpu(w, i, { down: [...w.gpus[i]!.down, m] });
  };

  // Placement hears the replica: failures are counted per epoch, a stop hands the GPUs back.
  const toPlacement = (w: World, m: Msg): void => {
    if (m.type === 'replica.failed') {
      const epoch = m['epoch'] as number;
      if (w.failedEpochs.includes(epoch)) violate('fails once per epoch', `replica.failed twice for epoch ${epoch}`);
      w.failedEpochs.push(epoch);
      // Reports of the failed gang carry the epoch it served under: the failure must leave that epoch behind.
      if (epoch === EPOCH)
        violate(
          'a failure raises the epoch',
          `replica.failed names epoch ${epoch}, the epoch its gang's reports carry`,
        );
    } else if (m.type === 'replica.stopped') {
      for (let i = 0; i < n; i++) {
        const g = w.gpus[i]!;
        if (g.snap.hasTag('holdsGpu') && ctx(g.snap)['replica'] === REPLICA_ID)
          violate(
            'a GPU belongs to one replica',
            `placement frees gpu.${i} while it still holds the replica (${JSON.stringify(g.snap.value)})`,
          );
        // A failed GPU ignores a late assignment (a repair command travels behind it on the same link).
        if (!g.snap.matches('failed') && g.down.some((d) => d.type === 'gpu.assign'))
          violate(
            'a GPU belongs to one replica',
            `placement frees gpu.${i} while an assignment to the replica is on its way`,
          );
        setGpu(w, i, { owner: false });
      }
      w.registered = false;
    }
  };

  // The replica takes an event and everything it causes synchronously.
  const toReplica = (w: World, e: AnyEventObject): void => {
    if (!w.registered) return;
    const pre = w.replica;
    const pc = ctx(pre);
    const [next, actions] = replicaSteps.step(pre, e);
    if (
      e.type === 'gpu.failed' &&
      (pre.matches('loading') || pre.matches('ready') || pre.matches('draining')) &&
      (pc['gpus'] as number[]).includes((e as Msg)['gpu'] as number)
    )
      w.failureWhileServing = true;
    if (e.type === 'step.crashed' && pre.hasTag('serving')) w.failureWhileServing = true;
    w.replica = next;
    for (const a of actions) {
      const c = (a.info?.context ?? ctx(next)) as Record<string, unknown>;
      const gang = c['gpus'] as number[];
      switch (a.type) {
        case 'xstate.emit': {
          const ev = (a.params as { event: { to: string; msg: Msg } }).event;
          if (ev.to === 'placement') toPlacement(w, ev.msg);
          break;
        }
        // The factory's commands: to the GPUs that have not answered (loaded; released or failed) yet.
        case 'assignGpus':
          for (const i of gang)
            if (!(c['loadedGpus'] as number[]).includes(i))
              sendDown(w, i, {
                type: 'gpu.assign',
                replica: REPLICA_ID,
                epoch: c['gpuEpoch'],
                loadMs: 100,
                unloadMs: 50,
              });
          break;
        case 'releaseGpus':
          if (w.held > 0)
            violate(
              'the gang is released only once the replica holds no work',
              `releaseGpus (on ${e.type}) while the control plane holds ${w.held} unit(s) in the core`,
            );
          for (const i of gang)
            if (!(c['failedGpus'] as number[]).includes(i) && !(c['releasedGpus'] as number[]).includes(i))
              sendDown(w, i, { type: 'gpu.release', replica: REPLICA_ID, epoch: c['gpuEpoch'] });
          break;
        // Every unit the control plane holds is handed back (resumed elsewhere or failed): exactly once each.
        case 'interruptAll':
          w.interrupted += w.held;
          w.held = 0;
          break;
        // The control plane's fault report (or a broken invariant's rethrow, which the alphabet has not).
        case 'crash':
        case 'xstate.raise':
        case 'xstate.cancel':
          break;
        default:
          violate('unmodelled replica action', a.type);
      }
    }
  };

  // A report reaches the control plane: to the replica directly, or to placement, which forwards a fault to the owner.
  const deliverUp = (w: World, i: number): void => {
    const g = w.gpus[i]!;
    const [[to, m], ...rest] = g.up as [[string, Msg], ...[string, Msg][]];
    setGpu(w, i, { up: rest });
    if (to === 'placement') {
      if (m.type === 'gpu.failed' && w.gpus[i]!.owner) toReplica(w, { type: 'gpu.failed', gpu: i, code: m['code'] });
    } else if (to === REPLICA_ID) {
      if (m.type === 'gpu.released') setGpu(w, i, { releaseHeard: true });
      toReplica(w, m);
    }
  };

  // The control plane's side hears the core: progress of another epoch, or reaching a replica that no longer serves,
  // is dropped; otherwise its units are finished, and the machine hears what changed in its work.
  const deliverProgress = (w: World): void => {
    const [m, ...rest] = w.progress as [Msg, ...Msg[]];
    w.progress = rest;
    if (!w.registered || w.crashed) return;
    if (m['epoch'] !== ctx(w.replica)['epoch'] || !w.replica.hasTag('serving')) {
      staleResultsDelivered++;
      // Behind the control plane's check, the machine itself ignores the work events of a dead report.
      for (const e of WORK_EVENTS) {
        const [next, actions] = replicaSteps.step(w.replica, e);
        if (snapKey(next) !== snapKey(w.replica) || actions.length > 0)
          violate(
            'work events of a dead epoch change nothing',
            `${e.type} moves the replica from ${JSON.stringify(w.replica.value)} to ${JSON.stringify(next.value)}`,
          );
      }
      return;
    }
    if (failed(w)) violate('no work after failure', `progress applied to a replica that failed`);
    const finished = m['finished'] as number;
    if (finished > w.held)
      violate('each unit ends once', `progress finishes ${finished} unit(s); the control plane holds ${w.held}`);
    w.held -= Math.min(finished, w.held);
    w.completed += finished;
    const saturated = m['saturated'] as boolean;
    if (saturated !== w.saturated) {
      w.saturated = saturated;
      toReplica(w, { type: saturated ? 'work.saturated' : 'work.unsaturated' });
    }
    // The view: the core's last load plus the submits it does not count yet.
    if ((m['held'] as number) === 0 && w.sent <= (m['received'] as number)) toReplica(w, { type: 'work.idle' });
  };

  // Dead reports: a report whose event type no state the replica can still reach handles (by the machine's declared
  // transitions, an over-approximation) is a no-op whenever it arrives, and its arrival commutes with every other
  // step, so it is dropped at once. Progress counts as live while the replica may yet serve (the states that hear
  // `work.idle`), since the control plane applies it only then. A report to a replica that is gone is dropped by the
  // runtime anyway.
  const prune = (w: World): void => {
    if (!pruneDead) return;
    const live = w.registered ? liveEventTypes(w.replica) : null;
    if (w.progress.length > 0 && (!live || w.crashed || !live.has('work.idle'))) {
      deadReportsDropped += w.progress.length;
      w.progress = [];
    }
    w.gpus.forEach((g, i) => {
      const up = g.up.filter(([to, m]) =>
        to === REPLICA_ID ? !!live && live.has(m.type) : to !== 'placement' || g.owner,
      );
      if (up.length === g.up.length) return;
      deadReportsDropped += g.up.length - up.length;
      setGpu(w, i, { up });
    });
  };

  const { signatures, worldKey } = worldKeys();

  // Successors: each is a labelled world; GPU events are tried on one GPU per signature class.
  let branchLabel = '';
  const successors = (w: World, sigs: number[]): [string, World][] => {
    const out: [string, World][] = [];
    const branch = (label: string, fn: (x: World) => void): void => {
      branchLabel = label;
      const x = clone(w);
      fn(x);
      prune(x);
      out.push([label, x]);
    };
    const tried = new Set<number>();
    for (let i = 0; i < n; i++) {
      if (tried.has(sigs[i]!)) continue;
      tried.add(sigs[i]!);
      const g = w.gpus[i]!;
      const head = g.down[0];
      if (head)
        branch(`gpu.${i} receives ${head.type}`, (x) => {
          setGpu(x, i, { down: g.down.slice(1) });
          deliverDown(x, i, head);
        });
      for (const t of pendingTimers(g.snap))
        branch(`gpu.${i} ${t.split('.')[2]} elapses`, (x) => gpuEvent(x, i, { type: t }));
      if (g.exec === 'running') branch(`rank ${i} finishes its share of the step`, (x) => core.rankFinishes(x, i));
      const report = g.up[0];
      if (report) branch(`${report[1].type} from gpu.${i} arrives`, (x) => deliverUp(x, i));
      if (w.faults < o.faults && !g.snap.matches('failed'))
        branch(`gpu.${i} faults`, (x) => {
          x.faults++;
          // Held, or about to be, or released without the replica having heard it (nor about to: the answer is queued).
          const unanswered = g.owner && !g.releaseHeard && !g.up.some(([, m]) => m.type === 'gpu.released');
          const owned = g.snap.hasTag('holdsGpu') || g.down.some((d) => d.type === 'gpu.assign') || unanswered;
          setGpu(x, i, owned ? { ownedFault: true } : { freeFault: true });
          gpuEvent(x, i, { type: 'gpu.fault', code: 'xid_79' });
        });
    }
    if ((o.drain ?? true) && !w.drained)
      branch('drain requested', (x) => {
        x.drained = true;
        toReplica(x, { type: 'replica.drain', deadlineMs: 1000 });
      });
    // The router hands a unit to an accepting replica: submitted to its core, and the machine told. (The actor tells
    // only an idle machine; every other state must ignore it, so it is told in each.)
    if (w.arrived < o.arrivals && w.registered && w.replica.hasTag('accepting'))
      branch('work arrives', (x) => {
        if (failed(x)) violate('no work after failure', `a unit is handed to a replica that failed`);
        x.arrived++;
        x.held++;
        x.sent++;
        if (eager) core.submit(x);
        else x.submits++;
        toReplica(x, { type: 'work.available' });
      });
    if (w.submits > 0)
      branch('the core receives seq.submit', (x) => {
        x.submits--;
        core.submit(x);
      });
    if (w.progress.length > 0) {
      branch('seq.progress arrives', deliverProgress);
      const applies = w.registered && !w.crashed && w.replica.hasTag('serving');
      if (w.crashes < crashes && applies && w.progress[0]!['epoch'] === ctx(w.replica)['epoch'])
        // The modelled control plane then drops the core's reports only: the GPUs' answers still reach the machine,
        // which needs them to stop.
        branch('applying seq.progress throws', (x) => {
          x.crashes++;
          x.crashed = true;
          x.progress = x.progress.slice(1);
          toReplica(x, CRASHED);
        });
    }
    for (let i = 0; i < n && w.lost < losses; i++) {
      const g = w.gpus[i]!;
      const up = g.up[0]?.[1];
      if (up && LOSABLE.has(up.type))
        branch(`${up.type} from gpu.${i} is lost`, (x) => {
          x.lost++;
          lossesExplored++;
          const rest = g.up.slice(1);
          // A fault reported behind the lost answer now reaches a replica that still counts the GPU as its own.
          const next = rest.find(([, m]) => m.type === 'gpu.released' || m.type === 'gpu.failed')?.[1];
          const reclassify =
            up.type === 'gpu.released' && g.freeFault && !g.releaseHeard && next?.type === 'gpu.failed';
          setGpu(x, i, { up: rest, ...(reclassify ? { freeFault: false, ownedFault: true } : {}) });
        });
      const down = g.down[0];
      if (down && LOSABLE.has(down.type))
        branch(`${down.type} to gpu.${i} is lost`, (x) => {
          x.lost++;
          lossesExplored++;
          setGpu(x, i, { down: g.down.slice(1) });
        });
    }
    if (!w.registered) return out;
    const timers = pendingTimers(w.replica);
    for (const t of timers.filter((t) => !isRetry(t)))
      branch(`replica ${t.split('.')[2]} elapses`, (x) => toReplica(x, { type: t }));
    // A retry fires early while the budget lasts, and otherwise once nothing but the environment can act.
    const early = w.retried < retries;
    if (early || out.every(([l]) => environment(l)))
      for (const t of timers.filter(isRetry))
        branch(`replica ${t.split('.')[2]} elapses`, (x) => {
          if (early) x.retried++;
          retriesExplored++;
          toReplica(x, { type: t });
        });
    return out;
  };

  // At quiescence (nothing but another fault can happen) the run must have ended well, whatever the order.
  const outcomes = new Map<string, Set<string>>();
  const atRest = (w: World): void => {
    const rc = ctx(w.replica);
    const failedGpus = (rc['failedGpus'] as number[] | undefined) ?? [];
    // Without a drain to wait for, an idle replica that lost no GPU simply keeps serving.
    if (!(o.drain ?? true) && w.replica.hasTag('accepting') && w.faults === 0) return;
    if (w.replica.status !== 'done')
      violate('the replica stops', `nothing left to happen but the replica is ${JSON.stringify(w.replica.value)}`);
    w.gpus.forEach((g, i) => {
      if (!g.snap.matches('free') && !g.snap.matches('failed'))
        violate('every GPU ends released or failed', `gpu.${i} ends ${JSON.stringify(g.snap.value)}`);
      if (g.owner) violate('a GPU belongs to one replica', `gpu.${i} is still owned by a stopped replica`);
      if (g.ownedFault !== failedGpus.includes(i))
        violate(
          'the replica knows its failed GPUs',
          `gpu.${i} ${g.ownedFault ? 'faulted while held' : 'did not fault while held'} but the replica's failedGpus is [${failedGpus.join(',')}]`,
        );
    });
    if (w.held !== 0 || w.completed + w.interrupted !== w.arrived)
      violate(
        'no work is stranded',
        `arrived ${w.arrived}, completed ${w.completed}, interrupted ${w.interrupted}, still held ${w.held}`,
      );
    if (w.coreLive) violate('the core stops with its gang', `the stopped replica's core still runs`);
    if (w.failedEpochs.length !== (w.failureWhileServing ? 1 : 0))
      violate(
        'fails exactly once per fault epoch',
        `replica.failed sent ${w.failedEpochs.length} time(s); a fault or crash ${w.failureWhileServing ? 'did' : 'did not'} reach it while serving`,
      );
    const owned = w.gpus.filter((g) => g.ownedFault).length;
    const scenario = JSON.stringify({
      ownedFaults: owned,
      laterFaults: w.gpus.filter((g) => g.freeFault).length,
      drained: w.drained,
      arrived: w.arrived,
      crashes: w.crashes,
    });
    const outcome = JSON.stringify({
      replica: w.replica.value,
      failed: (w.replica.output as { failed?: boolean } | undefined)?.failed ?? null,
      failedGpus: failedGpus.length,
      gpusFailed: w.gpus.filter((g) => g.snap.matches('failed')).length,
      gpusFree: w.gpus.filter((g) => g.snap.matches('free')).length,
    });
    const set = outcomes.get(scenario) ?? new Set<string>();
    set.add(outcome);
    outcomes.set(scenario, set);
  };

  // Breadth-first over canonical worlds; parents are kept to print the shortest interleaving to a violation.
  const start: World = {
    replica: replica0,
    registered: true,
    gpus: gpus0,
    coreLive: true,
    coreHeld: 0,
    coreReceived: 0,
    submits: 0,
    progress: [],
    held: 0,
    sent: 0,
    saturated: false,
    crashed: false,
    arrived: 0,
    completed: 0,
    interrupted: 0,
    faults: 0,
    crashes: 0,
    drained: false,
    failedEpochs: [],
    failureWhileServing: false,
    lost: 0,
    retried: 0,
  };
  const first = clone(start);
  toReplica(first, { type: 'replica.start' });
  const parents = new Map<string, [string, string] | null>();
  const firstSigs = signatures(first);
  const firstKey = worldKey(first, firstSigs);
  parents.set(firstKey, null);
  const pathOf = (key: string, last?: string): string[] => {
    const path: string[] = last ? [last] : [];
    for (let p = parents.get(key); p; p = parents.get(p[0])) path.unshift(p[1]);
    return ['replica.start', ...path];
  };
  let frontier: [string, World, number[]][] = [[firstKey, first, firstSigs]];
  let transitions = 0;
  let quiescent = 0;
  const replicaStates = new Set<string>();
  const dotted = (v: unknown): string =>
    typeof v === 'string'
      ? v
      : Object.entries(v as Record<string, unknown>)
          .map(([k, c]) => `${k}.${dotted(c)}`)
          .join(',');
  while (frontier.length > 0) {
    const nextFrontier: [string, World, number[]][] = [];
    for (const [key, w, sigs] of frontier) {
      currentPath = () => pathOf(key, branchLabel);
      const succ = successors(w, sigs);
      if (succ.every(([l]) => environment(l))) {
        branchLabel = '(at rest)';
        quiescent++;
        atRest(w);
      }
      for (const [l, x] of succ) {
        transitions++;
        const xs = signatures(x);
        const xk = worldKey(x, xs);
        if (parents.has(xk)) continue;
        if (parents.size >= maxStates) throw new Error(`more than ${maxStates} states`);
        parents.set(xk, [key, l]);
        replicaStates.add(dotted(x.replica.value));
        nextFrontier.push([xk, x, xs]);
      }
    }
    frontier = nextFrontier;
  }
  return {
    states: parents.size,
    transitions,
    quiescent,
    scenarios: outcomes.size,
    outcomes,
    violations,
    cachedTransitions: replicaSteps.size + gpuSteps.size,
    staleResultsDelivered,
    deadReportsDropped,
    replicaStates: [...replicaStates].sort(),
    lossesExplored,
    retriesExplored,
  };
}

/** The outcome check: every scenario (same faults, same drain) ends the same way whatever the interleaving. */
export function orderDependent(report: TpReport): [string, string[]][] {
  return [...report.outcomes].filter(([, set]) => set.size > 1).map(([k, set]) => [k, [...set]]);
}
