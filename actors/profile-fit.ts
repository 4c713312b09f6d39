// Does a model's calibrated profile fit the machine it serves on? A profile is fitted on one machine (its engine
// build, device and threads); served elsewhere it may predict steps several times too slow or too fast, and every
// admission, deadline and plan made from it is off by as much. The control plane compares the profile's predicted
// step time with the engine's measured one over the first steps of each model (both ride the cores' reports), and
// says so when they differ by more than the tolerance: a log line, the model's /readyz detail and a metric.
// `npm run bench:fidelity` judges its profile on its live steps with the same comparison.
import { describeOrigin, engineProfileAt, profileOrigin } from './gpu/profile-cost-model.ts';

/** Steps measured before a model is judged, and the most that count (the first steps, not a moving window). */
export const FIT_MIN_STEPS = 50;
export const FIT_MAX_STEPS = 500;
/** Measured engine time a judgement needs at least (ms): a few fast steps say little. */
export const FIT_MIN_BUSY_MS = 100;
/** Predicted ÷ measured outside 1 ± this is a profile that does not fit. */
export const FIT_TOLERANCE = 0.25;
/** A profile judged off fits again only within 1 ± this (a ratio near the edge would otherwise flip the verdict, and
 * log a line, with every few steps). */
export const FIT_AGAIN_TOLERANCE = FIT_TOLERANCE * 0.8;

/** What the comparison says about one model's profile so far. */
export interface ProfileFit {
  /** The profile's file. */
  profile: string;
  steps: number;
  predictedMs: number;
  measuredMs: number;
  /** Predicted ÷ measured step time; null until judged. */
  ratio: number | null;
  verdict: 'measuring' | 'fits' | 'off';
  /** Where the profile was fitted (engine build, device, threads), `unknown` for what it does not record. */
  fittedOn: string;
}

/** The comparison for the models that have a calibrated profile and a real engine. */
export interface ProfileFits {
  /** Adds one report's steps of a replica of `model` (ignored for models without a profile, and once frozen). */
  observe(model: string, d: { steps: number; predictedMs: number; busyMs: number }): void;
  /** The model's comparison, or undefined when it has no profile to compare. */
  of(model: string): ProfileFit | undefined;
  /** Every compared model. */
  all(): ReadonlyMap<string, ProfileFit>;
}

/** The sentence a profile that does not fit earns, with what to do about it. */
export function misfitLine(model: string, f: ProfileFit): string {
  const r = f.ratio ?? 1;
  const how = r > 1 ? `${r.toFixed(2)}x slower` : `${(1 / r).toFixed(2)}x faster`;
  return (
    `profile ${f.profile} does not fit model ${model} on this machine: it predicts steps ${how} than the engine ` +
    `ran its first ${f.steps} (predicted ${(f.predictedMs / f.steps).toFixed(2)} ms, measured ` +
    `${(f.measuredMs / f.steps).toFixed(2)} ms a step; tolerance ±${FIT_TOLERANCE * 100} %; fitted on ` +
    `${f.fittedOn}); admission and ` +
    `deadlines use it as it is: recalibrate here with \`switchyard calibrate --config <file>\``
  );
}

/** The verdict on predicted ÷ measured step time: outside 1 ± FIT_TOLERANCE the profile does not fit; one judged
 * off before fits again only within 1 ± FIT_AGAIN_TOLERANCE. */
export const verdictOf = (ratio: number, before: ProfileFit['verdict'] = 'measuring'): 'fits' | 'off' =>
  Math.abs(ratio - 1) > (before === 'off' ? FIT_AGAIN_TOLERANCE : FIT_TOLERANCE) ? 'off' : 'fits';

/** Where a profile file says it was fitted; `unknown` when it cannot be read (it is read again, and refused, where
 * its cost model is built). */
function fittedOnOf(file: string): string {
  try {
    const p = engineProfileAt(file);
    return describeOrigin(profileOrigin(p), p.threads);
  } catch {
    return 'unknown';
  }
}

/** Starts comparing `profiles` (model name → profile file); `log` hears each change of verdict to `off` and back. */
export function createProfileFits(profiles: ReadonlyMap<string, string>, log: (line: string) => void): ProfileFits {
  const fits = new Map<string, ProfileFit>();
  for (const [model, profile] of profiles) {
    const fittedOn = fittedOnOf(profile);
    fits.set(model, { profile, steps: 0, predictedMs: 0, measuredMs: 0, ratio: null, verdict: 'measuring', fittedOn });
  }
  const judge = (model: string, f: ProfileFit): void => {
    if (f.steps < FIT_MIN_STEPS || f.measuredMs < FIT_MIN_BUSY_MS) return;
    f.ratio = f.predictedMs / f.measuredMs;
    const verdict = verdictOf(f.ratio, f.verdict);
    if (verdict === f.verdict) return;
    if (verdict === 'off') log(misfitLine(model, f));
    else if (f.verdict === 'off')
      log(`profile ${f.profile} fits model ${model} again: predicted ÷ measured ${f.ratio.toFixed(2)}`);
    f.verdict = verdict;
  };
  return {
    observe: (model, d) => {
      const f = fits.get(model);
      if (!f || f.steps >= FIT_MAX_STEPS || d.steps <= 0 || !(d.busyMs > 0)) return;
      f.steps += d.steps;
      f.predictedMs += d.predictedMs;
      f.measuredMs += d.busyMs;
      judge(model, f);
    },
    of: (model) => fits.get(model),
    all: () => fits,
  };
}
