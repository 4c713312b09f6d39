// The replica machine's own properties, checked in every state the explorer reached against every event of its
// alphabet: a failure (a GPU's fault, or a crash in service) fails the gang once, a failed replica takes no work and no
// work event moves a replica that does not serve, a replica whose core holds work leaves for unloading only on
// `work.idle` or by handing the work back.
import { transition, type AnyEventObject, type AnyMachineSnapshot } from 'xstate';
import { delayedEventTypes, snapshotKey, type ExploreReport, type ExploreSpec } from './explore.ts';

/** A broken property of the machine: the state (with a shortest path to it) and the event that breaks it. */
export interface MachineViolation {
  property: string;
  detail: string;
  path: string[];
}

type Action = { type: string; params?: unknown };

const ctx = (s: AnyMachineSnapshot): { epoch: number; busy: boolean } => s.context as { epoch: number; busy: boolean };

// A `replica.failed` told to placement.
const tellsFailed = (a: Action): boolean =>
  a.type === 'xstate.emit' &&
  (a.params as { event?: { msg?: { type?: string } } }).event?.msg?.type === 'replica.failed';

/** Checks the replica machine (or a mutant) over an exploration of it; one violation per property, with its path. */
export function replicaViolations(spec: ExploreSpec, report: ExploreReport): MachineViolation[] {
  const found = new Map<string, MachineViolation>();
  const ignore = spec.ignore ?? [];
  const delayed: AnyEventObject[] = delayedEventTypes(spec.machine).map((type) => ({ type }));
  for (const [key, s] of report.snapshots) {
    const at = (event?: AnyEventObject): string[] =>
      [...report.pathTo(key), ...(event ? [event] : [])].map((e) => e.type);
    const add = (property: string, detail: string, event?: AnyEventObject): void => {
      if (!found.has(property)) found.set(property, { property, detail, path: at(event) });
    };
    const c = ctx(s);
    const where = JSON.stringify(s.value);
    if (s.hasTag('working') !== c.busy)
      add('the working tag says whether the core holds work', `${where} has busy ${c.busy}`);
    if (s.hasTag('failed') && (s.hasTag('accepting') || s.hasTag('serving')))
      add('a failed replica takes no work', `${where} is tagged ${[...s.tags].join(', ')}`);
    if (s.status !== 'active') continue;
    for (const e of [...spec.events(s), ...delayed]) {
      const [next, actions] = transition(spec.machine, s, e) as [AnyMachineSnapshot, Action[]];
      const types = actions.map((a) => a.type);
      const unchanged = snapshotKey(next, ignore) === key;
      const told = actions.filter(tellsFailed).length;
      const entersFailed = !s.hasTag('failed') && next.hasTag('failed');
      if (told > 0 || entersFailed) {
        const interrupts = types.filter((t) => t === 'interruptAll').length;
        // Into failed (or through it, when the last GPU is accounted for at once) from a replica that had not failed.
        const ends = next.hasTag('failed') || next.status === 'done';
        if (s.hasTag('failed') || !ends || told !== 1 || interrupts !== 1 || ctx(next).epoch !== c.epoch + 1)
          add(
            'a failure fails the gang once',
            `${e.type} in ${where} → ${JSON.stringify(next.value)}: replica.failed told ${told}, interruptAll ${interrupts}, epoch ${c.epoch} → ${ctx(next).epoch}`,
            e,
          );
      }
      // Work events carry no epoch: the control plane drops a dead epoch's report, and the machine ignores them too.
      if (e.type.startsWith('work.') && !s.hasTag('serving') && (!unchanged || actions.length > 0))
        add(
          'a work event never moves a replica that does not serve',
          `${e.type} in ${where} → ${JSON.stringify(next.value)} (${types.join(', ')})`,
          e,
        );
      // What a serving replica's control plane holds is unknown after a crash: it fails as a unit, as on a fault.
      if (e.type === 'step.crashed' && s.hasTag('serving') && !told)
        add('a crash in service fails the gang', `step.crashed in ${where} → ${JSON.stringify(next.value)}`, e);
      if (e.type === 'step.crashed' && !s.hasTag('serving') && (!unchanged || types.join() !== 'crash'))
        add('a crash outside service is only reported', `step.crashed in ${where} → ${JSON.stringify(next.value)}`, e);
      if (c.busy && next.matches('unloading') && !s.matches('unloading') && e.type !== 'work.idle')
        if (!types.includes('interruptAll'))
          add(
            'a replica with work unloads only after work.idle or handing the work back',
            `${e.type} in ${where} → unloading`,
            e,
          );
    }
  }
  return [...found.values()];
}
