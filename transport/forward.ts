// Messages a worker forwards as bytes it did not decode: an engine host's report reaches the control plane as the
// msgpack map the host encoded, checked by the hardened codec's pre-scan at the worker (scanMap: exactly one
// well-formed map within the limits, so the frame around it is framed as the worker wrote it), with the worker's own
// fields (type, replica, epoch) written after the map's entries, so they are the ones the receiver reads. The control
// plane decodes and validates the whole frame as any other (link.ts); a forwarded message travels in a frame of its
// own, so a host's bad report costs only that host's report.
//
// The message is still a message to anyone in this process who reads it (a local handler, an object carrier in a
// test): its fields decode on first read, through `decode`, which validates them.
import type { ScannedMap } from './codec.ts';

const FORWARDED = Symbol('switchyard.forwarded');

/** What a link needs to write a forwarded message: the scanned map and the forwarder's fields. */
export interface Forwarded {
  readonly map: ScannedMap;
  readonly own: Readonly<Record<string, string | number>>;
}

/**
 * A message of `own`'s fields and the fields of `map` (own ones win), whose bytes a link writes as they are; reading
 * any other field decodes `map` once with `decode` (which throws when the bytes do not hold what they must).
 */
export function forwardedMessage<M extends object>(
  own: Readonly<Record<string, string | number>>,
  map: ScannedMap,
  decode: () => object,
): M {
  const forwarded: Forwarded = { map, own };
  let decoded: Record<string, unknown> | undefined;
  const fields = (): Record<string, unknown> => (decoded ??= { ...(decode() as Record<string, unknown>), ...own });
  return new Proxy({ ...own } as Record<string | symbol, unknown>, {
    get: (target, key) => {
      if (key === FORWARDED) return forwarded;
      if (typeof key === 'symbol') return target[key];
      return key in own ? own[key] : fields()[key];
    },
    has: (_target, key) => key === FORWARDED || (typeof key === 'string' && key in fields()),
    ownKeys: () => Object.keys(fields()),
    getOwnPropertyDescriptor: (_target, key) => {
      if (typeof key === 'symbol' || !(key in fields())) return undefined;
      return { value: fields()[key], enumerable: true, configurable: true, writable: false };
    },
  }) as M;
}

/** The forwarded form of a message, or undefined for an ordinary one. */
export function forwardedOf(msg: object): Forwarded | undefined {
  return (msg as Record<symbol, Forwarded | undefined>)[FORWARDED];
}
