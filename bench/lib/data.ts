// Shared helpers for benchmark commands: --quick, chart data for the report, and the closing JSON line.
import { writeFileSync } from 'node:fs';

/** True when the benchmark runs in its quick (CI) mode. */
export const quick = process.argv.includes('--quick') || process.env['BENCH_QUICK'] === '1';

/** Writes chart series for the report (`npm run bench`) when BENCH_DATA names a file; a no-op otherwise. */
export function writeChartData(data: unknown): void {
  const file = process.env['BENCH_DATA'];
  if (file) writeFileSync(file, JSON.stringify(data));
}

/** Prints the closing line every benchmark ends with: one line of JSON holding its figures. */
export function printFigures(figures: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(figures)}\n`);
}
