// Serves the inspector page on loopback with one recording, so a simulation recorded with `simulate --trace` can be
// watched without a running node: `npx tsx inspector/replay-server.ts out.json [--port 8090]`.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { pageAsset } from './assets.ts';
import { requestPath } from '../transport/ws.ts';

/** A running replay server. */
export interface ReplayServer {
  /** The page, opening the recording (`http://127.0.0.1:<port>/inspector/?replay=/inspector/recording.json`). */
  readonly url: string;
  /** The page without a live stream (open a recording with its file picker). */
  readonly pageUrl: string;
  close(): Promise<void>;
}

/** Starts serving the page (and `file`, when given, as /inspector/recording.json) on 127.0.0.1. */
export async function startReplayServer(opts: { file?: string; port?: number } = {}): Promise<ReplayServer> {
  const recording = opts.file ? readFileSync(opts.file) : null;
  const server: Server = createServer((req, res) => {
    const path = requestPath(req.url) ?? '';
    if (path === '/inspector/recording.json' && recording) {
      res.writeHead(200, {
        'Content-Type': 'application/json',
        'Content-Length': String(recording.length),
        'Cache-Control': 'no-store',
      });
      res.end(recording);
      return;
    }
    const asset =
      req.method === 'GET' ? pageAsset(path === '/inspector' || path === '/' ? '/inspector/' : path) : undefined;
    if (!asset) {
      res.writeHead(404, { 'Content-Type': 'text/plain' });
      res.end('not found');
      return;
    }
    res.writeHead(200, asset.headers);
    res.end(asset.body);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, '127.0.0.1', () => resolve());
  });
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/inspector/`;
  return {
    url: recording ? `${base}?replay=/inspector/recording.json` : `${base}?offline`,
    pageUrl: `${base}?offline`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const main = async (argv: string[]): Promise<void> => {
  const portAt = argv.indexOf('--port');
  const port = portAt >= 0 ? Number(argv[portAt + 1]) : 8090;
  const file = argv.find((a, i) => !a.startsWith('--') && (portAt < 0 || i !== portAt + 1));
  const s = await startReplayServer({ ...(file ? { file } : {}), port });
  process.stdout.write(`inspector replay on ${s.url}\n(Ctrl-C to stop)\n`);
};

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main(process.argv.slice(2)).catch((e: unknown) => {
    process.stderr.write(`replay-server: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exitCode = 1;
  });
}
