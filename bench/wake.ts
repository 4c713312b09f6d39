// `npm run bench:wake`: what this machine charges a Node process for sleeping and waking, the floor under every live
// figure that is a share of CPU per step (bench:engine's served overheadShare above all). Two measurements:
//   - one process doing the same small piece of JavaScript (~0.1 ms) back to back (setImmediate between pieces) and
//     with a timer sleep of 2, 10 and 67 ms between pieces (67 ms: the bench model's llama.cpp step): CPU per cycle;
//   - two processes bouncing one small message over a loopback TCP socket (as serve, the worker and an engine host do
//     once per step), back to back and every 10 / 67 ms: CPU per message per process.
// CPU is each process's own user + system time (process.cpuUsage). Ends with one JSON line.
import { fork } from 'node:child_process';
import { createServer, connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { createWallClock } from '../runtime/clock.ts';
import { printFigures, quick } from './lib/data.ts';

const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => clock.setTimeout(r, ms));
const cpuUs = (): number => {
  const c = process.cpuUsage();
  return c.user + c.system;
};

/** A fixed piece of work: allocation and property access, like a step's bookkeeping. */
function work(n: number): number {
  let x = 0;
  const a: { i: number; s: string }[] = [];
  for (let i = 0; i < n; i++) {
    a.push({ i, s: `k${i}` });
    x += a[i]!.s.length;
  }
  return x;
}

async function cycles(gapMs: number, n: number): Promise<number> {
  for (let i = 0; i < 20; i++) work(2000);
  const c0 = cpuUs();
  for (let i = 0; i < n; i++) {
    work(2000);
    await sleep(gapMs); // 0: the runtime clock's next turn (setImmediate)
  }
  return (cpuUs() - c0) / n;
}

/** The echo side: answers each byte with a byte; reports its CPU per echo when asked (by 'r'). */
function echo(): void {
  const srv = createServer((s: Socket) => {
    let n = 0;
    let c0 = cpuUs();
    s.setNoDelay(true);
    s.on('data', (d: Buffer) => {
      for (const b of d) {
        if (b === 0x72 /* r */) {
          s.write(`${JSON.stringify({ usPerEcho: (cpuUs() - c0) / Math.max(1, n) })}\n`);
          n = 0;
          c0 = cpuUs();
        } else {
          n++;
          s.write('e');
        }
      }
    });
  });
  srv.listen(0, '127.0.0.1', () => process.send?.({ port: (srv.address() as { port: number }).port }));
  process.on('disconnect', () => process.exit(0));
}

async function bounce(port: number, gapMs: number, n: number): Promise<{ sender: number; echo: number }> {
  const s = connect(port, '127.0.0.1');
  s.setNoDelay(true);
  await new Promise<void>((r) => s.once('connect', () => r()));
  let wait: ((d: string) => void) | null = null;
  s.on('data', (d: Buffer) => wait?.(d.toString()));
  const once = (): Promise<string> => new Promise((r) => (wait = r));
  const roundTrip = async (): Promise<void> => {
    const p = once();
    s.write('x');
    await p;
  };
  for (let i = 0; i < 20; i++) await roundTrip();
  let p = once();
  s.write('r');
  await p;
  const c0 = cpuUs();
  for (let i = 0; i < n; i++) {
    await roundTrip();
    if (gapMs > 0) await sleep(gapMs);
  }
  const sender = (cpuUs() - c0) / n;
  p = once();
  s.write('r');
  const echoUs = (JSON.parse(await p) as { usPerEcho: number }).usPerEcho;
  s.destroy();
  return { sender, echo: echoUs };
}

async function main(): Promise<void> {
  const n = quick ? 60 : 300;
  const r1 = (x: number): number => Math.round(x);
  const piece = {
    back: await cycles(0, n * 4),
    g2: await cycles(2, n),
    g10: await cycles(10, n),
    g67: await cycles(67, n / 3),
  };
  const child = fork(fileURLToPath(import.meta.url), ['echo'], { execArgv: process.execArgv });
  const port = await new Promise<number>((r) => child.once('message', (m) => r((m as { port: number }).port)));
  const hop = {
    back: await bounce(port, 0, n * 4),
    g10: await bounce(port, 10, n),
    g67: await bounce(port, 67, n / 3),
  };
  child.disconnect();
  const lines = [
    `one process, the same ~0.1 ms of JavaScript per cycle (CPU per cycle, user + system):`,
    `  back to back ${r1(piece.back)} us; sleeping 2 ms between ${r1(piece.g2)} us; 10 ms ${r1(piece.g10)} us; ` +
      `67 ms ${r1(piece.g67)} us`,
    `two processes, one small message each way over loopback TCP (CPU per round trip, sender / echo):`,
    `  back to back ${r1(hop.back.sender)} / ${r1(hop.back.echo)} us; every 10 ms ${r1(hop.g10.sender)} / ` +
      `${r1(hop.g10.echo)} us; every 67 ms ${r1(hop.g67.sender)} / ${r1(hop.g67.echo)} us`,
    `a sleep/wake cycle costs about ${r1(piece.g10 - piece.back)} us of CPU beyond the work (10 ms sleeps)`,
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
  printFigures({
    usPerCycleBackToBack: r1(piece.back),
    usPerCycleSleep2Ms: r1(piece.g2),
    usPerCycleSleep10Ms: r1(piece.g10),
    usPerCycleSleep67Ms: r1(piece.g67),
    usPerWake: r1(piece.g10 - piece.back),
    usPerHopBackToBack: { sender: r1(hop.back.sender), echo: r1(hop.back.echo) },
    usPerHopEvery10Ms: { sender: r1(hop.g10.sender), echo: r1(hop.g10.echo) },
    usPerHopEvery67Ms: { sender: r1(hop.g67.sender), echo: r1(hop.g67.echo) },
  });
}

if (process.argv[2] === 'echo') echo();
else await main();
