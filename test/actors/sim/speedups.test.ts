// The simulator's remaining speed-ups (request actors on the compiled flat machine, the fleet's visits counted from
// outcomes) change nothing observable: every scenario's report, the fleet's report and DST seeds' results are the
// same with them and step by step through the codec and the machines.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { loadScenario, type Scenario } from '../../../actors/config.ts';
import { normalizeFleetScenario } from '../../../actors/fleet/config.ts';
import { simulateFleet } from '../../../actors/fleet/fleet.ts';
import { runDstSeed } from '../../../actors/sim/dst.ts';
import { simulate } from '../../../actors/sim/simulate.ts';

const DIR = join(import.meta.dirname, '../../../scenarios');
/** Requests per traffic entry: enough for thousands of steps, faults, preemption and drains, at test speed. */
const CAP = 200;

const capped = (s: Scenario): Scenario => ({
  ...s,
  traffic: s.traffic.map((t) => ({ ...t, requests: Math.min(t.requests, CAP) })),
});
const files = readdirSync(DIR).filter((f) => f.endsWith('.yaml'));
const isFleet = (f: string): boolean =>
  (parse(readFileSync(join(DIR, f), 'utf8')) as { fleet?: unknown }).fleet !== undefined;

describe('the simulator with its speed-ups', () => {
  for (const f of files.filter((x) => !isFleet(x))) {
    it(`reports ${f} byte for byte as the step-by-step run does`, () => {
      const s = capped(loadScenario(join(DIR, f)));
      const fast = JSON.stringify(simulate(s));
      const reference = JSON.stringify(simulate(s, { stepByStep: true }));
      expect(fast).toBe(reference);
      expect(JSON.stringify(simulate(s, { wireCheck: true }))).toBe(reference);
    }, 120_000);
  }

  for (const f of files.filter(isFleet)) {
    it(`reports the fleet ${f} byte for byte as the step-by-step run does`, () => {
      const { scenario, fleet } = normalizeFleetScenario(parse(readFileSync(join(DIR, f), 'utf8')));
      const s = capped(scenario);
      expect(JSON.stringify(simulateFleet(s, fleet))).toBe(
        JSON.stringify(simulateFleet(s, fleet, { stepByStep: true })),
      );
    }, 120_000);

    // The fast fleet takes each visit's tokens from its outcome and, when its node dies, from the control plane's
    // progress; the reference counts them token by token. A loss while requests stream on the node, either router.
    it(`reports the fleet ${f} with a node lost mid-stream byte for byte as step by step, either router`, () => {
      const { scenario, fleet } = normalizeFleetScenario(parse(readFileSync(join(DIR, f), 'utf8')));
      const s = capped(scenario);
      const lossy = { ...fleet, nodeLoss: fleet.nodeLoss.map((l) => ({ ...l, at: 10 })), rescheduleS: 5 };
      for (const router of ['gie-like', 'predicted'] as const) {
        const reference = simulateFleet(s, lossy, { router, stepByStep: true });
        expect(reference.lostNode[0]!.resumed).toBeGreaterThan(0);
        expect(JSON.stringify(simulateFleet(s, lossy, { router }))).toBe(JSON.stringify(reference));
      }
    }, 240_000);
  }

  // One seed of each layout (small exclusive, large TP-8 exclusive, mixed switch) and their drawn faults: partitions,
  // slow links, hung and silent GPUs, stragglers, worker crashes; the link has jitter.
  for (const seed of [0, 1, 2, 3, 4, 5]) {
    it(`finds the same in DST seed ${seed}, hash and violations included`, () => {
      const reference = runDstSeed(seed, { simSeconds: 20, stepByStep: true });
      expect(runDstSeed(seed, { simSeconds: 20 })).toEqual(reference);
      expect(reference.requests).toBeGreaterThan(0);
    }, 120_000);
  }
});
