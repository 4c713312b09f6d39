// The control plane's side of worker connections: registration with a protocol version and a fresh epoch (continuing
// from the epoch the node reports, so a restarted control plane never reuses one), routing of the runtime's remote
// messages over the link, and failing the node's GPUs, as one event, when it goes away for good.
import type { Runtime } from '../runtime/system.ts';
import type { TimerId } from '../runtime/clock.ts';
import { contained } from '../runtime/contain.ts';
import { PROTOCOL_VERSION, type NodeMessage } from '../transport/protocol.ts';
import { createLink, type Link, type LinkStats } from '../transport/link.ts';
import { CLOSE, type WsPeer } from '../transport/ws.ts';

/** What the control plane knows about its worker. */
export interface NodeStatus {
  node: string | null;
  connected: boolean;
  epoch: number;
  gpus: number[];
  registrations: number;
  /** GPUs of a lost node that will be failed when the grace period ends. */
  pendingFailure: number[];
  lastRefusal: string | null;
  link: LinkStats | null;
  /** Loads the worker has run since it started, as its last heartbeat or inventory said (null before either). */
  loads: number | null;
}

/** Options of the node link. */
export interface NodeLinkOptions {
  /** GPUs the node is configured with (indices 0..gpus-1). */
  gpus: number;
  /** How long a disconnected node's GPUs stay assigned before they are failed. */
  graceMs: number;
  /** How long a new connection has to send `node.register`. */
  registerTimeoutMs?: number;
  /** Settings the node receives with its registration. */
  settings?: { heartbeatMs?: number; repairMs?: number; lanes?: number };
  log?(line: string): void;
}

/** The control plane's node link. */
export interface NodeLink {
  /** Handles a new authenticated worker socket. */
  onConnection(peer: WsPeer): void;
  status(): NodeStatus;
  connected(): boolean;
  /** Sends what the control plane queued for the worker now, instead of at the end of the loop's turn. */
  flush(): void;
  /** Called on each registration and loss (metrics, readiness). */
  onChange?: () => void;
  close(): void;
}

const definedOnly = <T extends object>(o: T): Partial<T> =>
  Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;

const controlAccepts = (to: string): boolean =>
  to === 'control' || to === 'placement' || to === 'inspector' || to.startsWith('replica.');

/** Starts accepting a worker for `runtime` (the control plane's runtime). */
export function startNodeLink(runtime: Runtime, opts: NodeLinkOptions): NodeLink {
  const { clock } = runtime;
  const log = opts.log ?? (() => {});
  let current: { peer: WsPeer; link: Link; node: string; gpus: number[] } | null = null;
  let epoch = 0;
  let registrations = 0;
  let lastRefusal: string | null = null;
  let loads: number | null = null;
  let lost: number[] = [];
  let graceTimer: TimerId | null = null;
  const pending = new Set<WsPeer>();

  const failLost = (why: string): void => {
    if (graceTimer !== null) clock.clearTimeout(graceTimer);
    graceTimer = null;
    const gpus = lost;
    lost = [];
    if (gpus.length > 0) {
      log(`node lost: failing GPUs ${gpus.join(',')} (${why})`);
      // One event: every GPU fails before any interrupted request is resumed (none onto a GPU failing with it).
      runtime.send('placement', { type: 'node.lost', gpus, code: 'node_lost' });
    }
    nl.onChange?.();
  };

  const refuse = (peer: WsPeer, code: number, reason: string): void => {
    lastRefusal = reason;
    log(`worker refused: ${reason}`);
    peer.close(code, reason);
  };

  const register = (peer: WsPeer, link: Link, m: Extract<NodeMessage, { type: 'node.register' }>): void => {
    if (m.protocol !== PROTOCOL_VERSION)
      return refuse(peer, CLOSE.protocolVersion, `protocol ${m.protocol} is not ${PROTOCOL_VERSION}`);
    const bad = m.gpus.find((g) => g >= opts.gpus);
    if (bad !== undefined) return refuse(peer, CLOSE.policy, `gpu ${bad} is outside the node's ${opts.gpus} GPUs`);
    if (new Set(m.gpus).size !== m.gpus.length || m.gpus.length === 0)
      return refuse(peer, CLOSE.policy, 'gpus must be distinct and non-empty');
    if (current) return refuse(peer, CLOSE.duplicateNode, `node ${current.node} is already registered`);
    // A registration is always a fresh incarnation: whatever the old one held is gone, so fail it before the new GPUs report.
    failLost('a new incarnation registered');
    // Continue from the node's last epoch: a restarted control plane starts at 0 but the node remembers.
    epoch = Math.max(epoch, m.epoch) + 1;
    registrations++;
    current = { peer, link, node: m.node, gpus: [...m.gpus] };
    runtime.setRemote((to, msg) => link.send(to, msg));
    link.send('link', { type: 'node.registered', node: m.node, epoch, ...definedOnly(opts.settings ?? {}) });
    log(`node ${m.node} registered with ${m.gpus.length} GPUs, epoch ${epoch}`);
    nl.onChange?.();
  };

  const nl: NodeLink = {
    onConnection: (peer) => {
      pending.add(peer);
      let registered = false;
      const timeout = clock.setTimeout(() => {
        if (!registered) refuse(peer, CLOSE.registerTimeout, 'no node.register in time');
      }, opts.registerTimeoutMs ?? 5_000);
      const deliverOne = (to: string, msg: NodeMessage): void => {
        // A node speaks only for the GPUs it registered: a claim about any other is refused and the link closed.
        if (registered && 'gpu' in msg && current?.peer === peer && !current.gpus.includes(msg.gpu)) {
          return refuse(
            peer,
            CLOSE.policy,
            `node ${current.node} sent ${msg.type} for gpu ${msg.gpu}, which it did not register`,
          );
        }
        if (msg.type === 'node.heartbeat' || msg.type === 'node.inventory') loads = msg.loads ?? loads;
        if (to !== 'control') return runtime.send(to, msg);
        if (msg.type === 'node.register' && !registered) {
          register(peer, link, msg);
          registered = current?.peer === peer;
        }
      };
      const link = createLink(peer, {
        accepts: (to) => (registered ? controlAccepts(to) : to === 'control'),
        deliver: (to, msg) => {
          try {
            deliverOne(to, msg);
          } catch (e) {
            // One message's handling failed: it alone is dropped and the link serves on (the replica it was about
            // meets it as a lost message: its step or heartbeat bound fails it as a whole).
            log(`handling ${msg.type} for ${to} from the worker failed: ${contained(e)}`);
          }
        },
        onRefused: (reason) => log(`refused frame from worker: ${reason}`),
        defer: (fn) => void clock.setTimeout(fn, 0),
      });
      peer.onClose((code, reason) => {
        clock.clearTimeout(timeout);
        pending.delete(peer);
        if (current?.peer !== peer) return;
        link.flush();
        log(
          `node ${current.node} disconnected (${code}${reason ? ` ${reason}` : ''}); failing its GPUs in ${opts.graceMs} ms unless it returns`,
        );
        lost = current.gpus;
        current = null;
        runtime.setRemote(null);
        graceTimer = clock.setTimeout(() => failLost('grace period over'), opts.graceMs);
        nl.onChange?.();
      });
    },
    connected: () => current !== null,
    flush: () => {
      if (current && current.link.queued() > 0) current.link.flush();
    },
    status: () => ({
      node: current?.node ?? null,
      connected: current !== null,
      epoch,
      gpus: current?.gpus ?? [],
      registrations,
      pendingFailure: [...lost],
      lastRefusal,
      link: current ? { ...current.link.stats } : null,
      loads,
    }),
    close: () => {
      if (graceTimer !== null) clock.clearTimeout(graceTimer);
      current?.peer.close(CLOSE.goingAway, 'control plane shutting down');
      for (const p of pending) p.close(CLOSE.goingAway, 'control plane shutting down');
    },
  };
  return nl;
}
