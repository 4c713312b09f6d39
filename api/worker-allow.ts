// Which remote addresses may open the worker link (/v1/node): the loopback addresses and the server's own listening
// address by default (the supervised worker runs on this host), or the CIDR blocks an operator lists (`--worker-allow`).
import { BlockList, isIP } from 'node:net';

/** A set of addresses and CIDR blocks a remote address is checked against. */
export interface AddressAllowList {
  allows(address: string | undefined): boolean;
}

/** Why an entry of the list cannot be used, or null. */
function addEntry(list: BlockList, entry: string): string | null {
  const [addr = '', bits, extra] = entry.trim().split('/');
  const a = addr.startsWith('[') && addr.endsWith(']') ? addr.slice(1, -1) : addr;
  const family = isIP(a);
  if (family === 0 || extra !== undefined) return `"${entry}" is not an address or a CIDR block`;
  const type = family === 4 ? 'ipv4' : 'ipv6';
  if (bits === undefined) {
    list.addAddress(a, type);
    return null;
  }
  const n = /^\d{1,3}$/.test(bits) ? Number(bits) : -1;
  if (n < 0 || n > (family === 4 ? 32 : 128)) return `"${entry}" has a bad prefix length`;
  list.addSubnet(a, n, type);
  return null;
}

/** The loopback blocks, always allowed by default. */
const LOOPBACK = ['127.0.0.0/8', '::1/128'];
/** Addresses a server bound to one of these listens on every interface: no one address to add. */
const WILDCARDS = new Set(['0.0.0.0', '::', '']);

/**
 * The worker link's allow-list: `entries` when given, else loopback plus `listenHost` when it is one address.
 * Throws an Error naming the first entry it cannot use.
 */
export function workerAllowList(entries: readonly string[] | undefined, listenHost: string): AddressAllowList {
  const list = new BlockList();
  const own = listenHost.startsWith('[') ? listenHost.slice(1, -1) : listenHost;
  const chosen = entries ?? [...LOOPBACK, ...(isIP(own) !== 0 && !WILDCARDS.has(own) ? [own] : [])];
  for (const e of chosen) {
    const why = addEntry(list, e);
    if (why !== null) throw new Error(`--worker-allow: ${why}`);
  }
  return {
    allows: (address) => {
      if (address === undefined) return false;
      const family = isIP(address);
      // BlockList also matches a dual-stack listener's IPv4 peers (::ffff:a.b.c.d) against IPv4 blocks.
      return family === 0 ? false : list.check(address, family === 4 ? 'ipv4' : 'ipv6');
    },
  };
}
