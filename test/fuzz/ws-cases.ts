// The seeded cases of the WebSocket fuzzer: submits and cancels of the `/v1/ws` protocol whose fields (every field the
// server reads, from the protocol's own schema) take values from the hostile dictionary, alone or beside valid
// messages in one frame, and frames that are a dictionary value as a whole. What a frame should get is told by the
// protocol's own decoder on its exact bytes; the fuzzer then checks what the server actually said.
import { packrEncode } from '../../transport/codec.ts';
import { clientRequestSchema } from '../../transport/client-protocol.ts';
import type { Rng } from '../../runtime/rng.ts';
import { FUZZ_MODEL } from './live.ts';
import { HOSTILE, jsonText, mutate, type FieldSpec } from './hostile.ts';

/** Near values of every field a submit carries (the dictionary adds the hostile rest). */
const NEAR: Readonly<Record<string, readonly unknown[]>> = {
  type: ['submit', 'cancel', 'Submit', 'hello', 'tokens', 'done'],
  id: ['x', 'a'.repeat(128)],
  model: [FUZZ_MODEL, 'llama-3-8b-instruct', 'LLAMA-3-8B', `${FUZZ_MODEL} `, `${FUZZ_MODEL}@v1`, 'tiny'],
  version: ['v1', 'v2', 'V1', 'latest', 'stable', 'canary'],
  priority: ['interactive', 'batch', 'Interactive', 'realtime', 'default'],
  prompt: ['', 'hi', 'x'.repeat(20_000), 'a b '.repeat(2000)],
  promptTokens: [1, 2, 8000, 8192, 1_000_000],
  maxTokens: [1, 2, 16, 8192, 1_000_000],
  deadlineMs: [0, 1, 10, 1e12],
  temperature: [0, 1, 2, 2.0001],
  topP: [0, 1, 1.0001],
  seed: [0, 2 ** 32 - 1, 2 ** 32],
  stop: [['\n'], [], ['a', 'b', 'c', 'd', 'e'], [''], ['x'.repeat(1025)]],
  logprobs: [0, 20, 21, -1, 2.5],
  jsonSchema: ['{}', '{"type":"object"}', '{', '{"type":"nope"}', '{"__proto__":{}}', 'x'.repeat(65_537)],
  text: [true, false],
};

/** Every field of a submit: the request's fields (from its schema, so a field added there is fuzzed here), id, text. */
export const SUBMIT_FIELDS: readonly string[] = ['type', 'id', ...Object.keys(clientRequestSchema.fields!), 'text'];

const specs = (fields: readonly string[]): FieldSpec[] =>
  fields.map((f) => {
    const near = NEAR[f];
    if (near === undefined) throw new Error(`ws-cases: no near values for the submit field ${f}`);
    return { path: [f], near };
  });
const SUBMIT_SPECS = specs(SUBMIT_FIELDS);
const CANCEL_SPECS = specs(['type', 'id']);

/** A frame to send: the value, what was changed, and how it is written. */
export interface WsCase {
  readonly kind: 'submit' | 'cancel' | 'mixed' | 'whole' | 'valid';
  readonly value: unknown;
  readonly changes: readonly string[];
  /** JSON: the text sent. msgpack: the bytes; null when msgpack cannot encode the value (the case is skipped). */
  readonly json: string;
  readonly msgpack: Uint8Array | null;
}

/** A valid submit with a small answer. */
function validSubmit(id: string, r: Rng): Record<string, unknown> {
  return { type: 'submit', id, model: FUZZ_MODEL, prompt: `fuzz ${id}`, maxTokens: 1 + r.int(16) };
}

/** msgpack bytes of a value as msgpackr writes it (own keys such as `__proto__` included), null when it cannot. */
export function msgpackOf(v: unknown): Uint8Array | null {
  try {
    return packrEncode(v);
  } catch {
    return null;
  }
}

/** Draws the next case of a lane; `idBase` makes its valid ids unique on the lane's connection. */
export function drawWsCase(r: Rng, idBase: string): WsCase {
  const roll = r.int(100);
  let kind: WsCase['kind'];
  let value: unknown;
  let changes: readonly string[] = [];
  if (roll < 60) {
    kind = 'submit';
    const m = mutate(validSubmit(`${idBase}.0`, r), SUBMIT_SPECS, r);
    value = m.value;
    changes = m.changes;
  } else if (roll < 72) {
    kind = 'mixed';
    const m = mutate(validSubmit(`${idBase}.0`, r), SUBMIT_SPECS, r);
    const others = Array.from({ length: 1 + r.int(3) }, (_, k) => validSubmit(`${idBase}.${k + 1}`, r));
    value = r.int(2) === 0 ? [m.value, ...others] : [...others, m.value];
    changes = m.changes;
  } else if (roll < 82) {
    kind = 'cancel';
    const m = mutate({ type: 'cancel', id: `${idBase}.0` }, CANCEL_SPECS, r);
    value = m.value;
    changes = m.changes;
  } else if (roll < 88) {
    kind = 'whole';
    const v = HOSTILE[r.int(HOSTILE.length)] ?? null;
    value = r.int(3) === 0 ? [v] : v;
    changes = [`frame=${jsonText(value).slice(0, 60)}`];
  } else {
    kind = 'valid';
    value = validSubmit(`${idBase}.0`, r);
  }
  return { kind, value, changes, json: jsonText(value), msgpack: msgpackOf(value) };
}
