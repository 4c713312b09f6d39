// Every machine, explored over its pure transition function: all declared states and transitions reached, no dead ends;
// and the replica machine's own properties in every state it reaches.
import { describe, expect, it } from 'vitest';
import { machineSpecs, replicaSpec } from './alphabets.ts';
import { explore, summary, type ExploreReport } from './explore.ts';
import { replicaViolations } from './replica-properties.ts';

describe('model check of each machine', () => {
  for (const [name, spec] of Object.entries(machineSpecs)) {
    describe(name, () => {
      let report: ExploreReport | undefined;
      const run = (): ExploreReport => {
        if (!report) {
          report = explore(spec());
          console.log(summary(name, report));
        }
        return report;
      };

      it('explores a finite space of states and prints how many', () => {
        expect(run().states).toBeGreaterThan(1);
        expect(run().transitions).toBeGreaterThanOrEqual(run().states - 1);
      });

      it('enters every declared state', () => {
        expect(run().unreachableStates).toEqual([]);
      });

      it('takes every declared transition', () => {
        expect(run().unreachableTransitions).toEqual([]);
      });

      it('has no dead end except its final states', () => {
        const r = run();
        expect(r.deadEnds.map((k) => ({ state: k, path: r.pathTo(k).map((e) => e.type) }))).toEqual([]);
      });

      it('can always reach a final state (or, if it has none, its resting state) again', () => {
        const r = run();
        expect(r.trapped.map((k) => ({ state: k, path: r.pathTo(k).map((e) => e.type) }))).toEqual([]);
      });
    });
  }
});

describe('the replica machine, in every state it reaches under its alphabet', () => {
  const spec = replicaSpec();
  const report = explore(spec);

  it('fails its gang once, takes no work once failed, ignores work events outside service, and unloads only idle', () => {
    expect(replicaViolations(spec, report)).toEqual([]);
  });

  it('reaches every state the properties speak of', () => {
    const values = new Set([...report.snapshots.values()].map((s) => JSON.stringify(s.value)));
    for (const v of ['"failed"', '"unloading"', '"stopped"', '{"ready":"saturated"}', '{"draining":"working"}'])
      expect(values).toContain(v);
  });
});
