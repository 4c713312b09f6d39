// Which charts each benchmark's data produces (the data a benchmark writes when BENCH_DATA is set).
import { gpuTimeline, lineChart, percentileChart, type ChartSpec } from './charts.ts';

/** A chart to render: file stem, title and spec. */
export interface ChartOut {
  file: string;
  title: string;
  spec: ChartSpec;
}

type Series = { series: string; p50: number; p90: number; p99: number };

/** Charts for one benchmark's data; unknown shapes give no charts. */
export function chartsFor(name: string, data: unknown): ChartOut[] {
  const d = data as Record<string, unknown>;
  const out: ChartOut[] = [];
  const add = (file: string, title: string, spec: ChartSpec): void => void out.push({ file, title, spec });
  if (name === 'batching') {
    if (Array.isArray(d['latencyVsLoad'])) {
      add(
        'hockey-stick',
        'Latency vs offered load per batching policy',
        lineChart({
          title: 'p99 TTFT vs offered load (hockey stick)',
          values: d['latencyVsLoad'] as Record<string, unknown>[],
          x: 'rate',
          y: 'ttftP99Ms',
          series: 'policy',
          xTitle: 'offered load (req/s)',
          yTitle: 'p99 TTFT (ms)',
          yLog: true,
        }),
      );
    }
    if (Array.isArray(d['tbt']))
      add(
        'tbt',
        'TBT distribution per policy',
        percentileChart({
          title: 'Time between tokens per policy (high load)',
          values: d['tbt'] as Series[],
          yTitle: 'TBT (ms)',
          yLog: true,
        }),
      );
    if (Array.isArray(d['sweep']))
      add(
        'tradeoff',
        'Throughput vs latency sweep',
        lineChart({
          title: 'Throughput vs p99 TTFT (max running sweep)',
          values: d['sweep'] as Record<string, unknown>[],
          x: 'throughput',
          y: 'ttftP99Ms',
          series: 'series',
          xTitle: 'output tokens/s',
          yTitle: 'p99 TTFT (ms)',
          yLog: true,
        }),
      );
  }
  if (name === 'routing' && Array.isArray(d['ttft'])) {
    add(
      'ttft',
      'TTFT per routing policy',
      percentileChart({
        title: 'TTFT per routing policy (80 % load)',
        values: d['ttft'] as Series[],
        yTitle: 'TTFT (ms)',
        yLog: true,
      }),
    );
  }
  if (name === 'placement' && Array.isArray(d['timeline'])) {
    add(
      'timeline',
      'GPU timeline of the mixed scenario',
      gpuTimeline({
        title: 'GPU timeline: switches, reservation, failure and repair',
        values: d['timeline'] as { gpu: string; start: number; end: number; state: string }[],
        marks: (d['marks'] as { t: number; label: string }[]) ?? [],
      }),
    );
  }
  return out;
}
