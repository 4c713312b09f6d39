// The worker process: the node-agent machine drives the link to the control plane (connect, register with protocol
// version and epoch, serve, reconnect with back-off). The worker owns what is loaded: its GPU actors, engines and
// executor outlive the link, and after each registration it reports them (`node.inventory`) so that a restarted
// control plane adopts them instead of reloading. Work in flight for a control plane that is gone is abandoned after
// `orphanGraceMs`, or at once when a control plane registers it again.
import { createActor } from 'xstate';
import { nodeAgentMachine } from '../../machines/node-agent.machine.ts';
import { createWallClock, type Clock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime, type Msg, type Runtime } from '../../runtime/system.ts';
import { contained, faultHandler, timerFailed } from '../../runtime/contain.ts';
import { PROTOCOL_VERSION } from '../../transport/protocol.ts';
import { createLink, type Link } from '../../transport/link.ts';
import { connectWs, type WsPeer } from '../../transport/ws.ts';
import { startNodeAgent, type NodeAgent } from './agent.ts';
import type { StepTiming } from './cores.ts';
import { stateName } from '../../machines/state-name.ts';

/** Which executor the worker runs steps with. */
export type ExecutorKind = 'cost-model' | 'zero-cost' | 'fixed';

/** Options of a worker process. */
export interface NodeProcessOptions {
  /** The control plane's node endpoint (`ws://127.0.0.1:8080/v1/node`). */
  url: string;
  token: string;
  /** Certificate authority (PEM) that signed the control plane's certificate, for a `wss://` url. */
  ca?: string | Buffer;
  node?: string;
  gpus: readonly number[];
  executor?: ExecutorKind;
  /** Step time of the `fixed` executor (ms). */
  fixedStepMs?: number;
  /** Multiplies step, load, unload and repair times (the simulated hardware runs faster or slower). */
  timeScale?: number;
  repairMs?: number;
  probeMs?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
  heartbeatMs?: number;
  /** Folders the engine hosts' model files must be under (default: defaultModelRoots() in model-roots.ts). */
  modelRoots?: readonly string[];
  /** How long work in flight (engine sequences, steps) is kept while no control plane is connected (default 10 s). */
  orphanGraceMs?: number;
  clock?: Clock;
  log?(line: string): void;
  /** Called when the control plane refuses the token (retrying cannot help). */
  onUnauthorized?(): void;
}

/** A running worker. */
export interface NodeProcess {
  state(): string;
  epoch(): number;
  /** Loads the worker started since it began (a reconnect that adopts loads nothing). */
  loads(): number;
  stop(): void;
}

/** How a worker's cores time their steps: the roofline (scaled), none (the zero-cost overhead runs), or a fixed
 * time per step. */
export function stepTiming(kind: ExecutorKind, timeScale = 1, fixedStepMs = 1): StepTiming {
  if (kind === 'zero-cost') return { fixedMs: 0 };
  if (kind === 'fixed') return { fixedMs: fixedStepMs };
  return { scale: timeScale };
}

/** The worker's runtime for one registration: a fault an actor contained is logged; one it did not (its state
 * unknown) ends the process. */
function nodeRuntime(epoch: number, clock: Clock, log: (line: string) => void): Runtime {
  return createRuntime({
    name: `node@${epoch}`,
    clock,
    rng: createRng(epoch).fork('node'),
    onFault: faultHandler(log),
  });
}

/** Hands one message from the control plane to its entity. Its handling failing refuses it alone (logged): the worker
 * serves its other replicas on, and a step it dropped is the control plane's to detect (no progress fails that
 * replica as a unit). */
function deliverOne(runtime: Runtime, to: string, msg: Msg, log: (line: string) => void): void {
  try {
    runtime.send(to, msg);
  } catch (e) {
    log(`handling ${msg.type} for ${to} failed: ${contained(e)}`);
  }
}

const nodeAccepts = (to: string): boolean => to === 'link' || to === 'node' || /^gpu\.\d+$/.test(to);

/** Runs a worker until `stop()`: connects, registers its GPUs, executes steps, and reconnects when the link drops. */
export function startNodeProcess(opts: NodeProcessOptions): NodeProcess {
  const log = opts.log ?? (() => {});
  const clock = opts.clock ?? createWallClock(timerFailed(log));
  const nodeName = opts.node ?? 'node';
  const scale = opts.timeScale ?? 1;
  const steps = stepTiming(opts.executor ?? 'cost-model', scale, opts.fixedStepMs);
  let peer: WsPeer | null = null;
  let link: Link | null = null;
  let runtime: Runtime | null = null;
  let agent: NodeAgent | null = null;
  let stopped = false;
  let incarnation = 0;
  let orphanTimer: ReturnType<Clock['setTimeout']> | null = null;
  const clearOrphan = (): void => {
    if (orphanTimer !== null) clock.clearTimeout(orphanTimer);
    orphanTimer = null;
  };
  // What the control plane said with the registration; a local repairMs option overrides its repair time.
  let settings: { heartbeatMs?: number | undefined; repairMs?: number | undefined; lanes?: number | undefined } = {};

  const dropAgent = (): void => {
    if (!agent) return;
    agent.stop();
    agent = null;
    runtime?.setRemote(null);
    runtime = null;
  };

  const machine = nodeAgentMachine.provide({
    actions: {
      connect: () => {
        const attempt = ++incarnation;
        void connectWs(opts.url, {
          clock,
          token: opts.token,
          ...(opts.ca !== undefined ? { ca: opts.ca } : {}),
          ...(opts.heartbeatMs ? { heartbeatMs: opts.heartbeatMs } : {}),
        }).then((r) => {
          if (stopped || attempt !== incarnation) {
            if (r.ok) r.peer.close(1001, 'worker stopping');
            return;
          }
          if (!r.ok) {
            log(`connect to ${opts.url} failed: ${r.error.message}`);
            if (r.error.code === 'unauthorized') opts.onUnauthorized?.();
            actor.send({ type: 'link.closed' });
            return;
          }
          peer = r.peer;
          link = createLink(r.peer, {
            accepts: nodeAccepts,
            deliver: (to, msg) => {
              if (to === 'link') {
                if (msg.type === 'node.registered') {
                  settings = { heartbeatMs: msg.heartbeatMs, repairMs: msg.repairMs, lanes: msg.lanes };
                  actor.send({ type: 'node.registered', epoch: msg.epoch });
                }
                return;
              }
              if (runtime) deliverOne(runtime, to, msg, log);
            },
            onRefused: (reason) => log(`refused frame from the control plane: ${reason}`),
          });
          r.peer.onClose((code, reason) => {
            if (peer !== r.peer) return;
            peer = null;
            link = null;
            log(`link closed (${code}${reason ? ` ${reason}` : ''})`);
            if (!stopped) actor.send({ type: 'link.closed' });
          });
          actor.send({ type: 'link.opened' });
        });
      },
      register: ({ context }) => {
        link?.send('control', {
          type: 'node.register',
          node: nodeName,
          protocol: PROTOCOL_VERSION,
          gpus: [...opts.gpus],
          epoch: context.epoch,
        });
      },
      startGpus: ({ context, self }) => {
        const l = link;
        clearOrphan();
        if (agent && runtime) {
          // Registered again (a restarted control plane, or the same one after a cut): what is loaded stays loaded;
          // the work in flight belonged to the link that dropped, so it is abandoned; the inventory says the rest.
          runtime.setRemote((to, msg) => l?.send(to, msg));
          const freed = agent.orphan();
          agent.announce();
          log(
            `registered again as ${nodeName} at epoch ${context.epoch}; kept what is loaded (${freed} sequences freed)`,
          );
          self.send({ type: 'gpus.ready' });
          return;
        }
        const repairMs = opts.repairMs ?? (settings.repairMs !== undefined ? settings.repairMs * scale : undefined);
        runtime = nodeRuntime(context.epoch, clock, log);
        runtime.setRemote((to, msg) => l?.send(to, msg));
        agent = startNodeAgent(runtime, {
          id: 'node',
          gpus: opts.gpus,
          steps,
          timeScale: scale,
          ...(repairMs !== undefined ? { repairMs } : {}),
          ...(settings.heartbeatMs ? { heartbeatMs: settings.heartbeatMs } : {}),
          ...(settings.lanes ? { lanes: settings.lanes } : {}),
          ...(opts.probeMs !== undefined ? { probeMs: opts.probeMs } : {}),
          ...(opts.modelRoots !== undefined ? { engines: { modelRoots: opts.modelRoots } } : {}),
        });
        agent.announce();
        log(`registered as ${nodeName} with GPUs ${opts.gpus.join(',')} at epoch ${context.epoch}`);
        self.send({ type: 'gpus.ready' });
      },
      onDisconnect: () => {
        // Nothing is unloaded: messages wait for no one while cut off, and work in flight is abandoned after the grace.
        runtime?.setRemote(null);
        clearOrphan();
        orphanTimer = clock.setTimeout(() => {
          orphanTimer = null;
          const freed = agent?.orphan() ?? 0;
          log(
            `no control plane for ${opts.orphanGraceMs ?? 10_000} ms: abandoned the work in flight (${freed} sequences freed)`,
          );
        }, opts.orphanGraceMs ?? 10_000);
      },
    },
  });
  const actor = createActor(machine, {
    input: { node: nodeName, baseBackoffMs: opts.baseBackoffMs ?? 100, maxBackoffMs: opts.maxBackoffMs ?? 5_000 },
    clock,
  });
  actor.subscribe({ error: (e) => log(`node agent machine failed: ${String(e)}`) });
  actor.start();

  return {
    state: () => stateName(actor.getSnapshot().value),
    epoch: () => actor.getSnapshot().context.epoch,
    loads: () => agent?.loads() ?? 0,
    stop: () => {
      stopped = true;
      clearOrphan();
      dropAgent();
      actor.stop();
      peer?.close(1001, 'worker stopping');
    },
  };
}
