// The claims table `npm run bench` opens docs/BENCHMARKS.md with: each claim reads its benchmark's JSON line, judges it
// against its target and says plainly when a figure is missing.
import { describe, expect, it } from 'vitest';
import { CLAIMS, claimsTable, num } from '../../bench/claims.ts';

const row = (lines: string[], claim: string): string[] => {
  const line = lines.find((l) => l.startsWith(`| ${claim} |`));
  expect(line, claim).toBeDefined();
  return line!.split(' | ');
};

describe('benchmark claims', () => {
  it('reads dotted paths, and only finite numbers, never inherited keys', () => {
    const f = { conv: { roundRobinOverCostP99: 1.64 }, x: Number.NaN, s: '3' };
    expect(num(f, 'conv.roundRobinOverCostP99')).toBe(1.64);
    expect(num(f, 'x')).toBeUndefined();
    expect(num(f, 's')).toBeUndefined();
    expect(num(f, 'constructor')).toBeUndefined();
    expect(num(f, 'conv.constructor.name')).toBeUndefined();
    expect(num(f, 'missing.path')).toBeUndefined();
  });

  it('judges each figure against its target, naming a miss and a benchmark that did not run', () => {
    const lines = claimsTable({
      sim: { simRequestsPerWallS: 9823, simRequestsPerWallS8Replicas: 6858 },
      fidelity: {
        throughputRatio: 1,
        ttftP50Ratio: 1.074,
        ttftP99Ratio: 1.025,
        tpotP50Ratio: 0.968,
        tpotP99Ratio: 1.3,
      },
      engine: null,
    });
    expect(row(lines, 'simulated requests per wall second, splitwise_conv, one replica').slice(2, 4)).toEqual([
      '9,823',
      '**no**',
    ]);
    expect(row(lines, 'the same on eight replicas').slice(2, 4)).toEqual(['6,858', 'yes']);
    const fidelity = row(
      lines,
      'llama.cpp fidelity, calibrated in the run: throughput / TTFT p50, p99 / TPOT p50, p99',
    );
    expect(fidelity[2]).toBe('1.000 / 1.074 / 1.025 / 0.968 / 1.300');
    expect(fidelity[3]).toBe('**no**');
    expect(row(lines, 'llama.cpp served: throughput vs the engine alone').slice(2, 4)).toEqual(['not run', '–']);
    expect(lines).toHaveLength(CLAIMS.length + 2);
  });

  it('says "no figure" when the benchmark ran but its line lacks the key', () => {
    const lines = claimsTable({ upstream: { throughputRatio: 0.97 } });
    expect(row(lines, '`engine: openai`: throughput through switchyard ÷ direct, llama.cpp upstream')[3]).toBe('yes');
    expect(row(lines, '`engine: openai`: p99 TTFT added (median of interleaved rounds)').slice(2, 4)).toEqual([
      'no figure',
      '–',
    ]);
  });
});
