// The engine core of the tensor-parallel composition, abstracted: it holds units of work and runs a step on every rank
// whenever it holds any; a step completes when the last rank finishes its share, finishes one unit, starts the next
// step and sends one progress report (the units it holds, the submits it received, saturation) under its epoch.
import type { Msg, World } from './tp-world.ts';

/** The core's moves on a world of the composition. */
export interface EngineCoreModel {
  /** A submit reaches the core: a stopped core ignores it; an idle one starts a step (and reports after it). */
  submit(w: World): void;
  /** Rank i finished its share of the step in flight; the last one completes the step. */
  rankFinishes(w: World, i: number): void;
  /** A rank aborted (a fault, a release): the step in flight never completes, what the core held is dropped. */
  stop(w: World): void;
}

/** The core of `replica` under `epoch`, saturated when it holds `saturateAt` units or more after a step. */
export function engineCore(o: {
  replica: string;
  epoch: number;
  saturateAt: number;
  violate(property: string, detail: string): void;
}): EngineCoreModel {
  const setExec = (w: World, i: number, exec: World['gpus'][number]['exec']): void => {
    w.gpus[i] = { ...w.gpus[i]!, exec };
  };
  // A step runs on every rank of the gang, which must serve the replica.
  const startStep = (w: World): void => {
    w.gpus.forEach((g, i) => {
      if (!g.snap.hasTag('serving') || (g.snap.context as { replica: unknown }).replica !== o.replica)
        o.violate(
          'a step runs on a serving gang',
          `the core starts a step while gpu.${i} is ${JSON.stringify(g.snap.value)}`,
        );
      setExec(w, i, 'running');
    });
  };
  // One report object per distinct report, so that its name is found by identity.
  const reports = new Map<string, Msg>();
  const progressOf = (held: number, received: number, saturated: boolean): Msg => {
    const k = `${held}.${received}.${+saturated}`;
    let m = reports.get(k);
    if (!m)
      reports.set(
        k,
        (m = { type: 'seq.progress', replica: o.replica, epoch: o.epoch, finished: 1, held, received, saturated }),
      );
    return m;
  };
  return {
    submit: (w) => {
      if (!w.coreLive) return;
      w.coreReceived++;
      w.coreHeld++;
      if (w.gpus[0]!.exec === null) startStep(w);
    },
    rankFinishes: (w, i) => {
      setExec(w, i, 'finished');
      if (w.gpus.some((g) => g.exec !== 'finished')) return;
      w.coreHeld--;
      w.gpus.forEach((_, r) => setExec(w, r, null));
      if (w.coreHeld > 0) startStep(w);
      w.progress = [...w.progress, progressOf(w.coreHeld, w.coreReceived, w.coreHeld >= o.saturateAt)];
    },
    stop: (w) => {
      w.coreLive = false;
      w.coreHeld = 0;
      w.gpus.forEach((g, i) => {
        if (g.exec) setExec(w, i, null);
      });
    },
  };
}
