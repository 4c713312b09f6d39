// Micro-benchmark of the wire codec on a typical ~100-byte message; ends with one JSON line of ops/s.
// Run with: npx tsx bench/codec.ts
import { decodeMessage, decodeUntrusted, encode } from '../transport/codec.ts';
import { arr, int, num, obj, str, union, validate } from '../transport/schema.ts';

const Message = union('type', {
  status: obj({
    node: str({ max: 64 }),
    seq: int({ min: 0 }),
    load: num({ min: 0, max: 1 }),
    gpus: arr(obj({ id: int({ min: 0, max: 7 }), epoch: int({ min: 0 }), memFree: num({ min: 0 }) }), { max: 8 }),
  }),
});

const message = {
  type: 'status',
  node: 'node-03',
  seq: 1234,
  load: 0.42,
  gpus: [
    { id: 0, epoch: 17, memFree: 71.25 },
    { id: 1, epoch: 18, memFree: 12.5 },
  ],
};

const frame = encode(message);
const decoded = decodeUntrusted(frame);
if (!decoded.ok) throw new Error(`benchmark frame refused: ${decoded.error.message}`);

let sink = 0;

// Best of five half-second rounds after a warm-up, to damp noise from a shared machine.
function opsPerSecond(name: string, op: () => void): number {
  for (let i = 0; i < 100_000; i++) op();
  let perS = 0;
  for (let round = 0; round < 5; round++) {
    let iterations = 0;
    const start = process.hrtime.bigint();
    let elapsed = 0n;
    while (elapsed < 500_000_000n) {
      for (let i = 0; i < 10_000; i++) op();
      iterations += 10_000;
      elapsed = process.hrtime.bigint() - start;
    }
    perS = Math.max(perS, Math.round(iterations / (Number(elapsed) / 1e9)));
  }
  console.log(
    `${name.padEnd(16)} ${perS.toLocaleString('en-US').padStart(12)} ops/s  ${(1e9 / perS).toFixed(0).padStart(6)} ns/op`,
  );
  return perS;
}

console.log(`message: ${frame.length} bytes of msgpack`);
const encodePerS = opsPerSecond('encode', () => {
  sink += encode(message).length;
});
const decodePerS = opsPerSecond('decodeUntrusted', () => {
  if (decodeUntrusted(frame).ok) sink++;
});
const validatePerS = opsPerSecond('validate', () => {
  if (validate(Message, decoded.value).ok) sink++;
});
const decodeMessagePerS = opsPerSecond('decodeMessage', () => {
  if (decodeMessage(frame, Message).ok) sink++;
});
if (sink === 0) throw new Error('benchmark did no work');
console.log(JSON.stringify({ bytes: frame.length, encodePerS, decodePerS, validatePerS, decodeMessagePerS }));
