// A worker process's link to the control plane: connect, register its GPUs, serve, and reconnect with back-off.
import { assign, setup } from 'xstate';

/** Context of a node agent: its registration epoch and reconnect attempts. */
export interface NodeAgentContext {
  node: string;
  epoch: number;
  attempt: number;
  baseBackoffMs: number;
  maxBackoffMs: number;
}

/** Input to create a node agent. */
export interface NodeAgentInput {
  node: string;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
}

/** Events a node agent handles. */
export type NodeAgentEvent =
  | { type: 'link.opened' }
  | { type: 'node.registered'; epoch: number }
  | { type: 'gpus.ready' }
  | { type: 'link.closed' };

/** A node agent never finishes on its own. */
export type NodeAgentOutput = never;

/** The node agent machine: connecting → registered → serving → disconnected → connecting. */
export const nodeAgentMachine = setup({
  types: {
    context: {} as NodeAgentContext,
    input: {} as NodeAgentInput,
    events: {} as NodeAgentEvent,
  },
  actions: {
    /** Opens the link to the control plane; answered with `link.opened` or `link.closed`. */
    connect: () => {},
    /** Sends the registration (GPUs, epoch) over the open link. */
    register: () => {},
    /** Brings the node's GPUs up (probe) after registration. */
    startGpus: () => {},
    /** Fails or pauses local work that cannot report while the link is down. */
    onDisconnect: () => {},
  },
  delays: {
    backoff: ({ context }) =>
      Math.min(context.maxBackoffMs, context.baseBackoffMs * 2 ** Math.min(context.attempt, 16)),
  },
}).createMachine({
  id: 'nodeAgent',
  context: ({ input }) => ({
    node: input.node,
    epoch: 0,
    attempt: 0,
    baseBackoffMs: input.baseBackoffMs ?? 100,
    maxBackoffMs: input.maxBackoffMs ?? 5_000,
  }),
  initial: 'connecting',
  states: {
    connecting: {
      entry: 'connect',
      on: {
        'link.opened': { actions: 'register' },
        'node.registered': {
          target: 'registered',
          actions: assign({ epoch: ({ event }) => event.epoch, attempt: 0 }),
        },
        'link.closed': 'disconnected',
      },
    },
    registered: {
      entry: 'startGpus',
      on: { 'gpus.ready': 'serving', 'link.closed': 'disconnected' },
    },
    serving: {
      tags: ['serving'],
      on: { 'link.closed': 'disconnected' },
    },
    disconnected: {
      entry: ['onDisconnect', assign({ attempt: ({ context }) => context.attempt + 1 })],
      after: { backoff: 'connecting' },
    },
  },
});
