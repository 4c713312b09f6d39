// The load gauges of an upstream model server, read from its Prometheus text with bounds: the Gateway API Inference
// Extension's model-server protocol (requests waiting, running, KV cache usage) under the names the config maps.

/** The gauges switchyard reads; null where the server exposes none of the names. */
export interface UpstreamGauges {
  waiting: number | null;
  running: number | null;
  /** A fraction 0..1 of the server's KV cache in use. */
  kvUsage: number | null;
}

/** Most bytes of a metrics page read, and most lines parsed. */
export const METRICS_BOUNDS = { maxBytes: 4 << 20, maxLines: 200_000 } as const;

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/;

/**
 * The first of `names` found in `text`, by sample: its unlabelled sample when there is one (a total), else the sum of
 * its labelled samples (one per model, usually one). Non-finite or negative values count as absent.
 */
function valueOf(
  samples: ReadonlyMap<string, { bare: number | null; sum: number; n: number }>,
  names: readonly string[],
): number | null {
  for (const name of names) {
    const s = samples.get(name);
    if (!s) continue;
    if (s.bare !== null) return s.bare;
    if (s.n > 0) return s.sum;
  }
  return null;
}

/** Parses the gauges named in `names` out of a Prometheus text page. */
export function parseGauges(
  text: string,
  names: { waiting: readonly string[]; running: readonly string[]; kvUsage: readonly string[] },
): UpstreamGauges {
  const wanted = new Set([...names.waiting, ...names.running, ...names.kvUsage]);
  const samples = new Map<string, { bare: number | null; sum: number; n: number }>();
  let start = 0;
  for (let i = 0; i < METRICS_BOUNDS.maxLines && start < text.length; i++) {
    let nl = text.indexOf('\n', start);
    if (nl < 0) nl = text.length;
    const line = text.slice(start, Math.min(nl, start + 4096));
    start = nl + 1;
    if (line.charCodeAt(0) === 35) continue; // # HELP, # TYPE
    const m = SAMPLE.exec(line);
    if (!m || !wanted.has(m[1]!)) continue;
    const v = Number(m[3]);
    if (!Number.isFinite(v) || v < 0) continue;
    let s = samples.get(m[1]!);
    if (!s) samples.set(m[1]!, (s = { bare: null, sum: 0, n: 0 }));
    if (m[2] === undefined || m[2] === '{}') s.bare = v;
    else {
      s.sum += v;
      s.n++;
    }
  }
  const kv = valueOf(samples, names.kvUsage);
  return {
    waiting: valueOf(samples, names.waiting),
    running: valueOf(samples, names.running),
    // vLLM reports a fraction; a server reporting percent (above 1) is scaled down.
    kvUsage: kv === null ? null : Math.min(1, kv > 1 ? kv / 100 : kv),
  };
}
