// One process's actor runtime: a registry of entities by system id, message routing, and supervision.
import {
  createActor,
  type ActorLogic,
  type AnyActorRef,
  type EventObject,
  type InspectionEvent,
  type Snapshot,
  type Subscription,
} from 'xstate';
import type { Message, OutEvent } from '../machines/messages.ts';
import type { Clock } from './clock.ts';
import type { Rng } from './rng.ts';
import type { IdGen } from './ids.ts';
import { createIdGen } from './ids.ts';
import { ChurnMap } from './churn-map.ts';

/** A message between entities: one member of the union in machines/messages.ts. */
export type Msg = Message;

/** Something that went wrong inside an actor, reported instead of crashing the process. */
export interface ActorFault {
  actor: string;
  error: unknown;
  /** The requests it touched, when the actor knows them. */
  requests?: readonly string[];
  /** Contained: the actor gave up what it held as a unit (a replica fails, its requests resumed or failed) and the
   * process serves on. Absent: the actor is dead and its part of the state unknown. */
  contained?: true;
}

/**
 * Supervision of many short-lived actors of one kind (the requests). A member is created with `parent` as its parent:
 * it then joins the group's one actor system instead of building a system of its own, tells the group its end (done
 * or error) through that system rather than through an observer of its own, and is inspected with the whole group.
 */
export interface ActorGroup {
  /** The group's actor: pass it as `parent` when creating a member. */
  readonly parent: AnyActorRef;
  /** Supervises a member created with `parent` (before starting it): its `out` events are routed, its error is a
   * fault, and an inspector set while it lives replays its snapshot. */
  add(id: string, actor: AnyActorRef): void;
  /** Members not yet done (nor failed). */
  readonly size: number;
}

/** The runtime of one process: clock, randomness, ids, and the routing of messages between entities. */
export interface Runtime {
  readonly name: string;
  readonly clock: Clock;
  readonly rng: Rng;
  readonly ids: IdGen;
  /** Makes `id` reachable: messages to it call `deliver`. */
  register(id: string, deliver: (msg: Msg) => void): void;
  unregister(id: string): void;
  /** True if `id` is a local entity. */
  has(id: string): boolean;
  /** Sends to a local entity, or through the link when the id lives in another process. */
  send(to: string, msg: Msg): void;
  /** Connects this runtime to another process: messages for non-local ids go to `remote`. */
  setRemote(remote: ((to: string, msg: Msg) => void) | null): void;
  /** Wires an actor's `out` events into routing and its errors into `faults`. */
  supervise(id: string, actor: AnyActorRef): void;
  /** A group supervising many short-lived actors at once (see ActorGroup); `name` is its actor's id. */
  group(name: string): ActorGroup;
  /** Errors raised inside actors (a broken invariant), in order. */
  readonly faults: ActorFault[];
  /** Records a fault an actor contained itself (or one it reports by hand), as its errors are. */
  fault(f: ActorFault): void;
  /** Messages that found no destination, by message type. */
  readonly dropped: Map<string, number>;
  /** Inspects every live supervised actor (replaying each one's current snapshot first) until cleared with null;
   * while no inspector is set, actors carry no inspection observer at all. */
  setInspector(observer: ((ev: InspectionEvent) => void) | null): void;
  /** True while an inspector watches, or when created `stepByStep`: actors then take every event through their
   * machines (a replica's direct step is off). */
  stepByStep(): boolean;
}

/** The prefixes of the events XState sends a parent when a child ends. */
const DONE = 'xstate.done.actor.';
const ERROR = 'xstate.error.actor.';

/** A group's actor: it keeps the snapshot it starts with and hands every event (a member's end) to `hear`. */
function groupLogic(hear: (event: EventObject) => void): ActorLogic<Snapshot<undefined>, EventObject> {
  return {
    transition: (snapshot, event) => {
      hear(event);
      return snapshot;
    },
    getInitialSnapshot: () => ({ status: 'active', output: undefined, error: undefined }),
    getPersistedSnapshot: (snapshot) => snapshot,
  };
}

/**
 * Makes `system` (an XState actor system) keep nothing when it starts an actor. XState 5.33 keeps every actor its
 * system starts in a map that nothing reads (`_register` writes it, `_unregister` deletes from it; the test
 * "XState's system map of started actors is write-only" checks that in the installed XState). A group's system starts
 * one actor per request, so that map churns at the request rate, and a churning Map promotes what it held (see
 * churn-map.ts); the group keeps its members itself. `_register` still answers the session id, and `_unregister`,
 * still XState's, also forgets keyed (systemId) actors, which members are not.
 */
function registerNothing(system: unknown): void {
  const s = system as { _register?: (sessionId: string, actor: unknown) => string };
  if (typeof s._register === 'function') s._register = (sessionId) => sessionId;
}

/** Shows `observer` an actor's current snapshot, as if it had just been taken (an inspector set late catches up). */
function replay(observer: (ev: InspectionEvent) => void, actor: AnyActorRef, rootId: string): void {
  observer({
    type: '@xstate.snapshot',
    rootId,
    actorRef: actor,
    event: { type: 'xstate.init' },
    snapshot: actor.getSnapshot(),
  });
}

/** Creates a runtime for one process. */
export function createRuntime(opts: {
  name: string;
  clock: Clock;
  rng: Rng;
  ids?: IdGen;
  /** Every event through the machines, always (the simulator's reference run; see `stepByStep()`). */
  stepByStep?: boolean;
  /** Hears each fault as it is recorded (serving logs it, and ends the process over one not contained). */
  onFault?(f: ActorFault): void;
}): Runtime {
  const local = new Map<string, (msg: Msg) => void>();
  const dropped = new Map<string, number>();
  const faults: ActorFault[] = [];
  const fault = (f: ActorFault): void => {
    faults.push(f);
    opts.onFault?.(f);
  };
  let remote: ((to: string, msg: Msg) => void) | null = null;
  // Live supervised actors, so that an inspector set later also sees the ones already running.
  const inspectable = new Map<string, { actor: AnyActorRef; sub: Subscription | null }>();
  // Groups: one inspection subscription each (on the system their members share), and their live members.
  const groups: { parent: AnyActorRef; members: ChurnMap<string, AnyActorRef>; sub: Subscription | null }[] = [];
  let inspector: ((ev: InspectionEvent) => void) | null = null;

  const send = (to: string, msg: Msg): void => {
    const deliver = local.get(to);
    if (deliver) return deliver(msg);
    if (remote) return remote(to, msg);
    dropped.set(msg.type, (dropped.get(msg.type) ?? 0) + 1);
  };
  // One handler for every actor's `out` events (XState binds a copy per `on`; no closure is made per actor).
  const route = (e: OutEvent): void => send(e.to, e.msg);

  const group = (name: string): ActorGroup => {
    const members = new ChurnMap<string, AnyActorRef>();
    const hear = (event: EventObject): void => {
      const { type } = event;
      if (type.startsWith(DONE)) {
        members.delete(type.slice(DONE.length));
      } else if (type.startsWith(ERROR)) {
        const id = type.slice(ERROR.length);
        members.delete(id);
        fault({ actor: id, error: (event as EventObject & { error?: unknown }).error });
      }
    };
    const parent = createActor(groupLogic(hear), { id: name, clock: opts.clock });
    parent.start();
    registerNothing(parent.system);
    groups.push({ parent, members, sub: inspector ? parent.system.inspect(inspector) : null });
    return {
      parent,
      add: (id, actor) => {
        actor.on('out', route);
        members.set(id, actor);
      },
      get size() {
        return members.size;
      },
    };
  };

  return {
    name: opts.name,
    clock: opts.clock,
    rng: opts.rng,
    ids: opts.ids ?? createIdGen(),
    register: (id, deliver) => {
      local.set(id, deliver);
    },
    unregister: (id) => {
      local.delete(id);
    },
    has: (id) => local.has(id),
    send,
    setRemote: (r) => {
      remote = r;
    },
    supervise: (id, actor) => {
      actor.on('out', route);
      const entry = { actor, sub: inspector ? actor.system.inspect(inspector) : null };
      inspectable.set(id, entry);
      // The observer stays on a finished actor's system: XState reports the final snapshot after completing.
      const forget = (): void => {
        if (inspectable.get(id) === entry) inspectable.delete(id);
      };
      actor.subscribe({
        error: (error) => {
          fault({ actor: id, error });
          forget();
        },
        complete: forget,
      });
    },
    group,
    faults,
    fault,
    dropped,
    stepByStep: () => inspector !== null || opts.stepByStep === true,
    setInspector: (observer) => {
      inspector = observer;
      for (const e of inspectable.values()) {
        e.sub?.unsubscribe();
        e.sub = observer ? e.actor.system.inspect(observer) : null;
        if (observer) replay(observer, e.actor, e.actor.sessionId);
      }
      for (const g of groups) {
        g.sub?.unsubscribe();
        g.sub = observer ? g.parent.system.inspect(observer) : null;
        if (observer) for (const m of g.members.values()) replay(observer, m, g.parent.sessionId);
      }
    },
  };
}
