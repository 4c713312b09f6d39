// CPU profile of one call, in process (node:inspector): the share of sampled time per component of the simulator
// and the top frames by self time. For benchmarks only; sampling adds its own overhead, so figures of speed are
// taken on runs without it.
import { Session, type Profiler } from 'node:inspector';

/** Components of the simulator's wall time, by where the sampled frame's code lives. */
export type Component = 'actors' | 'batcher' | 'link' | 'metrics' | 'gc' | 'other';

/** Where a sampled frame belongs: XState and the actor wiring are `actors`, the codec and link are `link`. */
export function componentOf(url: string, fn: string): Component {
  if (fn === '(garbage collector)') return 'gc';
  if (url.includes('/node_modules/xstate/') || /\/(machines|runtime)\//.test(url)) return 'actors';
  if (/\/actors\/(control|router|placement|worker|replica|control-plane)/.test(url)) return 'actors';
  if (url.includes('/actors/batcher/') || url.includes('/actors/gpu/')) return 'batcher';
  if (url.includes('/node_modules/msgpackr/') || url.includes('/transport/')) return 'link';
  if (url.includes('/actors/metrics/')) return 'metrics';
  return 'other';
}

/** Per-component shares (0..1, of sampled non-idle time) and the top frames by self time. */
export interface ProfileSummary {
  share: Record<Component, number>;
  top: { frame: string; share: number }[];
  sampledS: number;
}

/** Summarises a V8 CPU profile. */
export function summarise(p: Profiler.Profile, topN = 12): ProfileSummary {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const selfUs = new Map<number, number>();
  const deltas = p.timeDeltas ?? [];
  (p.samples ?? []).forEach((id, i) => selfUs.set(id, (selfUs.get(id) ?? 0) + (deltas[i] ?? 0)));
  const share: Record<Component, number> = { actors: 0, batcher: 0, link: 0, metrics: 0, gc: 0, other: 0 };
  const frames = new Map<string, number>();
  let total = 0;
  for (const [id, us] of selfUs) {
    const cf = byId.get(id)!.callFrame;
    if (cf.functionName === '(idle)' || cf.functionName === '(program)') continue;
    // The inspector's own native `dispatch` is the profiler serialising its profile on `Profiler.stop`, not the run.
    if (cf.functionName === 'dispatch' && cf.url === '') continue;
    total += us;
    share[componentOf(cf.url, cf.functionName)] += us;
    const where = cf.url ? `${cf.url.split('/').slice(-2).join('/')}:${cf.lineNumber + 1}` : '';
    const frame = `${cf.functionName || '(anonymous)'} ${where}`.trim();
    frames.set(frame, (frames.get(frame) ?? 0) + us);
  }
  for (const k of Object.keys(share) as Component[]) share[k] = total > 0 ? share[k] / total : 0;
  const top = [...frames]
    .sort((a, b) => b[1] - a[1])
    .slice(0, topN)
    .map(([frame, us]) => ({ frame, share: total > 0 ? us / total : 0 }));
  return { share, top, sampledS: total / 1e6 };
}

/** Runs `fn` under the sampling profiler and returns its result with the profile's summary. */
export function profiled<T>(fn: () => T, topN = 12): { result: T; profile: ProfileSummary } {
  const session = new Session();
  session.connect();
  const post = (method: string, params?: object): Profiler.Profile | undefined => {
    let out: Profiler.Profile | undefined;
    let error: Error | null = null;
    // The inspector answers synchronously for a session in the same thread.
    session.post(method, params ?? {}, (err, res?: { profile?: Profiler.Profile }) => {
      error = err;
      out = res?.profile;
    });
    if (error) throw error;
    return out;
  };
  post('Profiler.enable');
  post('Profiler.setSamplingInterval', { interval: 200 });
  post('Profiler.start');
  let profile: Profiler.Profile | undefined;
  let result: T;
  try {
    result = fn();
  } finally {
    profile = post('Profiler.stop');
    session.disconnect();
  }
  if (!profile) throw new Error('the profiler returned no profile');
  return { result, profile: summarise(profile, topN) };
}
