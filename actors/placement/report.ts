// The GPU-failure report of a simulation: for each injected fault, how and how fast it was detected, what became of
// every request it interrupted, how long until small replicas served on the healthy GPUs, and until the large model
// was back after the repair. Derived from virtual-time records only, so the same seed gives the same report.
import type { Scenario } from '../config.ts';
import type { RequestRecord } from '../metrics/collector.ts';
import { rolesOf } from './layout.ts';
import type { Placement, PlacementEvent } from './placement.ts';

/** What happened to one request a failure interrupted. */
export interface InterruptedRequest {
  id: string;
  /** Tokens the client had when the replica failed. */
  tokensBefore: number;
  /** Tokens the client had at the end. */
  tokens: number;
  /** `resumed` (re-prefilled elsewhere, one stream to the client) or the code it ended with. */
  outcome: string;
}

/** The report of one injected fault. */
export interface FaultReport {
  gpu: number;
  kind: string;
  injectedAtS: number;
  detection: { path: string; code: string; afterMs: number; boundMs: number; withinBound: boolean } | null;
  replicas: string[];
  requests: InterruptedRequest[];
  outcomes: Record<string, number>;
  /** The reason the large model was reported unavailable after the failure, if it was. */
  unavailable: string | null;
  /** From detection until small replicas served on every healthy GPU (null: not before the GPU was back). */
  smallOnHealthyMs: number | null;
  /** From the repair command until the GPU was back, and until a large replica was ready again. */
  gpuBackAfterRepairMs: number | null;
  largeBackAfterRepairMs: number | null;
  /** Large-model requests refused with model_unavailable while it was down. */
  rejectedUnavailable: number;
}

const r3 = (x: number): number => Math.round(x * 1000) / 1000;

/** Builds the failure report of a finished simulation whose scenario time 0 was `originMs`. */
export function failureReport(
  scenario: Scenario,
  originMs: number,
  placement: Placement,
  records: readonly RequestRecord[],
): FaultReport[] {
  const n = scenario.node.gpus;
  const { large, small } = rolesOf(scenario.models);
  const smallNames = new Set(small.map((m) => m.name));
  const smallSlots = small.reduce((a, m) => a + m.replicas * m.versions.length, 0);
  const byId = new Map(records.map((r) => [r.id, r]));
  const events = placement.events;
  const out: FaultReport[] = [];
  for (const f of scenario.faults) {
    if (f.kind === 'straggle') continue;
    const at = originMs + f.at * 1000;
    const repairAt = f.repairAt !== undefined ? originMs + f.repairAt * 1000 : Infinity;
    const rec = placement.failures.find((x) => x.gpu === f.gpu && x.t >= at && x.t < repairAt);
    const requests: InterruptedRequest[] = [];
    if (rec) {
      for (const i of placement.interruptions) {
        if (i.t !== rec.t || !rec.replicas.includes(i.replica)) continue;
        for (const q of i.requests) {
          const r = byId.get(q.id);
          // Resumed: it was re-prefilled elsewhere, so it either finished or was interrupted again later.
          const again = placement.interruptions.some((j) => j.t > i.t && j.requests.some((x) => x.id === q.id));
          const outcome = !r ? 'in flight' : r.outcome === 'done' || again ? 'resumed' : (r.code ?? r.outcome);
          requests.push({ id: q.id, tokensBefore: q.tokens, tokens: r?.tokens ?? 0, outcome });
        }
      }
    }
    const outcomes: Record<string, number> = {};
    for (const q of requests) outcomes[q.outcome] = (outcomes[q.outcome] ?? 0) + 1;
    const t0 = rec?.t ?? Infinity;
    const unavailable =
      events.find((e) => e.t >= t0 && e.t < repairAt && e.kind === 'unavailable' && e.model === large?.name)?.detail ??
      null;
    const gpuBack = rec
      ? events.find((e) => e.t >= repairAt && e.kind === 'gpu.ready' && e.gpu === f.gpu)?.t
      : undefined;
    const largeBack = rec
      ? events.find((e) => e.t >= repairAt && e.kind === 'replica.ready' && e.model === large?.name)?.t
      : undefined;
    const downUntil = largeBack ?? Infinity;
    out.push({
      gpu: f.gpu,
      kind: f.kind,
      injectedAtS: f.at,
      detection: rec
        ? {
            path: rec.path,
            code: rec.code,
            afterMs: r3(rec.t - at),
            boundMs: r3(rec.boundMs),
            withinBound: rec.t - at <= rec.boundMs,
          }
        : null,
      replicas: rec?.replicas ?? [],
      requests,
      outcomes,
      unavailable,
      smallOnHealthyMs: rec
        ? smallServing(events, smallNames, Math.min(n - 1, smallSlots), f.gpu, n, rec.t, gpuBack ?? Infinity)
        : null,
      gpuBackAfterRepairMs: gpuBack !== undefined ? r3(gpuBack - repairAt) : null,
      largeBackAfterRepairMs: largeBack !== undefined ? r3(largeBack - repairAt) : null,
      rejectedUnavailable: records.filter(
        (r) =>
          r.model === large?.name && r.code === 'model_unavailable' && r.receivedAt >= t0 && r.receivedAt < downUntil,
      ).length,
    });
  }
  return out;
}

/** Milliseconds after `from` until `target` small replicas on GPUs other than `failed` are ready (before `until`). */
function smallServing(
  events: readonly PlacementEvent[],
  names: Set<string>,
  target: number,
  failed: number,
  n: number,
  from: number,
  until: number,
): number | null {
  const ready = new Set<string>();
  for (const e of events) {
    if (e.t > until) break;
    if (e.kind === 'replica.ready' && e.model && names.has(e.model) && !(e.gpus ?? []).some((d) => d % n === failed))
      ready.add(e.replica!);
    else if ((e.kind === 'replica.stopped' || e.kind === 'replica.failed') && e.replica) ready.delete(e.replica);
    if (e.t >= from && ready.size >= target) return r3(e.t - from);
  }
  return null;
}

/** One stretch of a GPU's timeline (seconds of scenario time). */
export interface GpuSpan {
  gpu: string;
  start: number;
  end: number;
  state: string;
}

/** Each GPU's states over a run, from placement's events: `<model> loading|serving|draining`, `failed`, `free`. */
export function gpuTimeline(
  events: readonly PlacementEvent[],
  gpus: number,
  originMs: number,
  endMs: number,
): GpuSpan[] {
  const spans: GpuSpan[] = [];
  const cur = new Map<number, { state: string; since: number }>();
  const at = (t: number): number => Math.round((Math.max(t, originMs) - originMs) / 10) / 100;
  const set = (g: number, state: string, t: number): void => {
    const c = cur.get(g);
    if (c && c.state === state) return;
    if (c && at(t) > at(c.since)) spans.push({ gpu: `gpu ${g}`, start: at(c.since), end: at(t), state: c.state });
    cur.set(g, { state, since: t });
  };
  const holder = new Map<string, number[]>();
  for (const e of events) {
    const short = e.model?.replace(/^llama-3-/, '') ?? '';
    const devs = (e.gpus ?? holder.get(e.replica ?? '') ?? [])
      .map((d) => d % gpus)
      .filter((g) => cur.get(g)?.state !== 'failed');
    if (e.kind === 'replica.created' && e.replica) {
      holder.set(e.replica, e.gpus ?? []);
      for (const g of devs) set(g, `${short} loading`, e.t);
    } else if (e.kind === 'replica.ready') for (const g of devs) set(g, `${short} serving`, e.t);
    else if (e.kind === 'drain.started') for (const g of devs) set(g, `${short} draining`, e.t);
    else if (e.kind === 'replica.stopped') for (const g of devs) set(g, 'free', e.t);
    else if (e.kind === 'gpu.failed' && e.gpu !== undefined) set(e.gpu, 'failed', e.t);
    else if (e.kind === 'gpu.ready' && e.gpu !== undefined && (cur.get(e.gpu)?.state ?? 'failed') === 'failed')
      set(e.gpu, 'free', e.t);
  }
  for (const g of cur.keys()) set(g, '', endMs);
  return spans.filter((s) => s.end > 0);
}
