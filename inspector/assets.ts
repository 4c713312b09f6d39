// The page's static files (inspector/public), read once and served with a strict content security policy: the page
// loads nothing from anywhere but its own server, so it works with no internet access.
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** A static file ready to send. */
export interface Asset {
  body: Buffer;
  headers: Record<string, string>;
}

const TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
};

/** The directory holding the page. */
export const PUBLIC_DIR = fileURLToPath(new URL('./public/', import.meta.url));

// connect-src 'self' also covers ws:/wss: to this same host (CSP level 3): the page's socket, and nothing else.
const CSP =
  "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; style-src-attr 'unsafe-inline'; script-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

let assets: Map<string, Asset> | null = null;

const load = (): Map<string, Asset> => {
  const out = new Map<string, Asset>();
  for (const name of readdirSync(PUBLIC_DIR)) {
    const ext = name.slice(name.lastIndexOf('.'));
    const type = TYPES[ext];
    if (!type) continue;
    const body = readFileSync(`${PUBLIC_DIR}/${name}`);
    out.set(name === 'index.html' ? '/inspector/' : `/inspector/${name}`, {
      body,
      headers: {
        'Content-Type': type,
        'Content-Length': String(body.length),
        'Cache-Control': 'no-store',
        'X-Content-Type-Options': 'nosniff',
        'Content-Security-Policy': CSP,
      },
    });
  }
  return out;
};

/** The asset at a URL path under /inspector/, or undefined. */
export function pageAsset(path: string): Asset | undefined {
  assets ??= load();
  return assets.get(path);
}
