// Recording a simulation's inspection stream (`simulate --trace out.json`) so the page can replay it with a slider.
import { writeFileSync } from 'node:fs';
import type { ControlPlane } from '../actors/control-plane.ts';
import { createOutbox } from './outbox.ts';
import { INSPECT_VERSION, RECORDING_FORMAT, type Frame, type Recording } from './protocol.ts';
import { createInspectionSession } from './session.ts';

/** Options of a recording. */
export interface RecordOptions {
  seed: number;
  /** Most frames kept; past it the oldest are dropped and the file says how many. */
  maxFrames?: number;
  /** Simulated ms between node summaries while anything happens. */
  summaryMs?: number;
}

/** A recording in progress. */
export interface Recorder {
  /** Frames so far. */
  size(): number;
  /** Stops recording (turning inspection off) and returns the recording. */
  finish(): Recording;
}

/** Starts recording a control plane's inspection stream; inspection is on until `finish`. */
export function startRecording(cp: ControlPlane, opts: RecordOptions): Recorder {
  const session = createInspectionSession(cp, { timer: false, summaryMs: opts.summaryMs ?? 500 });
  const box = createOutbox(opts.maxFrames ?? 400_000);
  const hello = session.hello('replay');
  const unsubscribe = session.subscribe((f) => box.push(f));
  return {
    size: () => box.size(),
    finish: () => {
      box.push(session.summary());
      unsubscribe();
      session.close();
      const dropped = box.droppedTotal;
      const frames: Frame[] = [hello, ...box.take(Number.MAX_SAFE_INTEGER, hello.t)];
      return {
        format: RECORDING_FORMAT,
        v: INSPECT_VERSION,
        scenario: cp.scenario.name,
        seed: opts.seed,
        frames,
        dropped,
      };
    },
  };
}

/** Writes a recording as JSON (one frame per line, so large files stay diffable and streamable). */
export function writeRecording(path: string, rec: Recording): void {
  const { frames, ...head } = rec;
  const body = frames.map((f) => JSON.stringify(f)).join(',\n');
  writeFileSync(path, `${JSON.stringify(head).slice(0, -1)},"frames":[\n${body}\n]}\n`);
}
