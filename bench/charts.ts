// Charts of the benchmark report, as Vega-Lite specs rendered to SVG offline (vega's headless renderer).
import * as vega from 'vega';
import * as vl from 'vega-lite';

/** A Vega-Lite spec (loosely typed: the specs below are literal objects). */
export type ChartSpec = Record<string, unknown>;

/** Renders a Vega-Lite spec to an SVG string without a browser. */
export async function renderSvg(spec: ChartSpec): Promise<string> {
  const compiled = vl.compile({
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    background: 'white',
    ...spec,
  } as never).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: 'none' });
  return view.toSVG();
}

/** A line chart of y against x with one line per series. */
export function lineChart(o: {
  title: string;
  values: Record<string, unknown>[];
  x: string;
  y: string;
  series: string;
  xTitle: string;
  yTitle: string;
  yLog?: boolean;
}): ChartSpec {
  return {
    title: o.title,
    width: 520,
    height: 300,
    data: { values: o.values },
    mark: { type: 'line', point: true },
    encoding: {
      x: { field: o.x, type: 'quantitative', title: o.xTitle },
      y: { field: o.y, type: 'quantitative', title: o.yTitle, ...(o.yLog ? { scale: { type: 'log' } } : {}) },
      color: { field: o.series, type: 'nominal', title: null },
    },
  };
}

/** Box plots of a distribution per category (values already summarised as p50/p90/p99 are drawn as ticks). */
export function percentileChart(o: {
  title: string;
  values: { series: string; p50: number; p90: number; p99: number }[];
  yTitle: string;
  yLog?: boolean;
}): ChartSpec {
  const rows = o.values.flatMap((v) => [
    { series: v.series, q: 'p50', ms: v.p50 },
    { series: v.series, q: 'p90', ms: v.p90 },
    { series: v.series, q: 'p99', ms: v.p99 },
  ]);
  return {
    title: o.title,
    width: 520,
    height: 300,
    data: { values: rows },
    mark: 'bar',
    encoding: {
      x: { field: 'series', type: 'nominal', title: null },
      xOffset: { field: 'q' },
      y: { field: 'ms', type: 'quantitative', title: o.yTitle, ...(o.yLog ? { scale: { type: 'log' } } : {}) },
      color: { field: 'q', type: 'nominal', title: 'percentile' },
    },
  };
}

/** A timeline of GPU states: one row per GPU, bars from start to end coloured by state. */
export function gpuTimeline(o: {
  title: string;
  values: { gpu: string; start: number; end: number; state: string }[];
  marks?: { t: number; label: string }[];
}): ChartSpec {
  const layers: ChartSpec[] = [
    {
      data: { values: o.values },
      mark: 'bar',
      encoding: {
        y: { field: 'gpu', type: 'ordinal', title: null },
        x: { field: 'start', type: 'quantitative', title: 'time (s)' },
        x2: { field: 'end' },
        color: { field: 'state', type: 'nominal', title: 'state' },
      },
    },
  ];
  if (o.marks?.length) {
    layers.push({
      data: { values: o.marks },
      mark: { type: 'rule', strokeDash: [4, 3], color: 'black' },
      encoding: { x: { field: 't', type: 'quantitative' } },
    });
    layers.push({
      data: { values: o.marks },
      mark: { type: 'text', angle: 270, align: 'left', dx: 4, dy: -4, fontSize: 9 },
      encoding: { x: { field: 't', type: 'quantitative' }, text: { field: 'label' }, y: { value: 0 } },
    });
  }
  return { title: o.title, width: 620, height: 220, layer: layers };
}
