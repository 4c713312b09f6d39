import { describe, expect, it } from 'vitest';
import { describeMachine, inspectedMachines, type StateDef } from '../../inspector/statechart.ts';
import { replicaMachine } from '../../machines/replica.machine.ts';

const paths = (s: StateDef): string[] => [s.path, ...s.children.flatMap(paths)];

describe('statecharts for the inspector', () => {
  it('lists every state of the replica machine with its kind and initial child', () => {
    const def = describeMachine(replicaMachine);
    expect(def.id).toBe('replica');
    expect(paths(def.root)).toEqual(
      expect.arrayContaining([
        '',
        'placing',
        'loading',
        'ready',
        'ready.idle',
        'ready.busy',
        'ready.saturated',
        'draining',
        'draining.settling',
        'draining.working',
        'unloading',
        'failed',
        'stopped',
      ]),
    );
    expect(def.root.initial).toBe('placing');
    expect(def.root.children.find((c) => c.key === 'stopped')?.type).toBe('final');
    expect(def.root.children.find((c) => c.key === 'ready')?.initial).toBe('idle');
  });

  it('lists transitions that change state, with events, delays, eventless ones and guards', () => {
    const { edges } = describeMachine(replicaMachine);
    expect(edges).toContainEqual({ from: 'ready.idle', to: 'ready.busy', label: 'work.available', guard: null });
    expect(edges).toContainEqual({ from: 'draining', to: 'unloading', label: 'after drainDeadline', guard: null });
    expect(edges).toContainEqual({ from: 'failed', to: 'stopped', label: 'always', guard: 'allAccountedFor' });
    expect(edges).toContainEqual({ from: '', to: 'failed', label: 'gpu.failed', guard: 'newFailedGpu' });
    expect(edges).toContainEqual({ from: 'draining.working', to: 'unloading', label: 'work.idle', guard: null });
    // Targetless transitions (a crash reported while loading or leaving) change nothing and are not drawn.
    expect(edges.filter((e) => e.label === 'step.crashed').map((e) => [e.from, e.to])).toEqual([
      ['ready', 'failed'],
      ['draining', 'failed'],
    ]);
  });

  it('only connects states that exist', () => {
    for (const def of Object.values(inspectedMachines())) {
      const all = new Set(paths(def.root));
      for (const e of def.edges) {
        expect(all.has(e.from)).toBe(true);
        expect(all.has(e.to)).toBe(true);
      }
    }
    expect(Object.keys(inspectedMachines()).sort()).toEqual(['gpu', 'placement', 'replica', 'request']);
  });
});
