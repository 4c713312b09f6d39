import { describe, expect, it } from 'vitest';
import { createActor, type InspectionEvent } from 'xstate';
import { createVirtualClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime } from '../../runtime/system.ts';
import { gpuMachine } from '../../machines/gpu.machine.ts';

const setup = () => {
  const clock = createVirtualClock();
  const rt = createRuntime({ name: 't', clock, rng: createRng(1) });
  const gpu = (i: number) => {
    const actor = createActor(gpuMachine, { input: { index: i }, clock, id: `gpu.${i}` });
    rt.supervise(`gpu.${i}`, actor);
    actor.start();
    return actor;
  };
  return { clock, rt, gpu };
};

const snapshots = (seen: InspectionEvent[]): string[] =>
  seen
    .filter((e) => e.type === '@xstate.snapshot')
    .map(
      (e) =>
        `${(e.actorRef as unknown as { id: string }).id}:${JSON.stringify((e.snapshot as unknown as { value: unknown }).value)}`,
    );

describe('runtime inspection hook', () => {
  it('reports nothing while no inspector is set', () => {
    const { rt, gpu } = setup();
    const seen: InspectionEvent[] = [];
    const a = gpu(0);
    rt.setInspector((e) => seen.push(e));
    rt.setInspector(null);
    seen.length = 0;
    a.send({ type: 'gpu.register' });
    gpu(1).send({ type: 'gpu.register' });
    expect(seen).toEqual([]);
  });

  it('replays the current snapshot of every live actor when set, then reports their transitions', () => {
    const { rt, gpu } = setup();
    const a = gpu(0);
    a.send({ type: 'gpu.register' });
    const seen: InspectionEvent[] = [];
    rt.setInspector((e) => seen.push(e));
    expect(snapshots(seen)).toEqual(['gpu.0:"probing"']);
    a.send({ type: 'gpu.probed' });
    expect(snapshots(seen)).toEqual(['gpu.0:"probing"', 'gpu.0:"free"']);
  });

  it('inspects actors supervised while it is set, and forgets them once they stop', () => {
    const { rt, gpu } = setup();
    const seen: InspectionEvent[] = [];
    rt.setInspector((e) => seen.push(e));
    const b = gpu(5);
    b.send({ type: 'gpu.register' });
    expect(snapshots(seen)).toEqual(['gpu.5:"offline"', 'gpu.5:"probing"']);
    b.stop();
    gpu(6);
    rt.setInspector(null);
    seen.length = 0;
    rt.setInspector((e) => seen.push(e));
    expect(snapshots(seen)).toEqual(['gpu.6:"offline"']);
  });
});
