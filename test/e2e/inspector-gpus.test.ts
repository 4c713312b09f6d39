// The GPU actors live in the worker process, beside the engines they describe; the inspector on the control plane
// shows them live: while someone reads /v1/inspect, the worker forwards each GPU actor's snapshot over the node
// link (a watch lease the control plane renews), and a GPU failed through the admin API shows as that GPU actor
// entering `failed` with its fault code. Real `switchyard serve`, real worker process, real sockets.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { INSPECT_SUBPROTOCOL, type Frame, type InspectMessage } from '../../inspector/protocol.ts';
import { serve, writeConfig, type Served } from './harness.ts';

const CONFIG = writeConfig(`
name: e2e-inspector-gpus
node: { gpu: H100-SXM, gpus: 8, repairMs: 600000 }
placement: { policy: exclusive }
models:
  - name: llama-3-8b
    profile: llama-3-8b
    tp: 1
    replicas: 8
`);

/** A reader of the live inspector: every frame it heard so far. */
function read(s: Served): Promise<{ ws: WebSocket; frames: Frame[] }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${s.url.replace('http', 'ws')}/v1/inspect`, [INSPECT_SUBPROTOCOL], {
      headers: { authorization: `Bearer ${s.adminToken}` },
    });
    const frames: Frame[] = [];
    ws.on('message', (d) => frames.push(...(JSON.parse(String(d)) as InspectMessage).frames));
    ws.once('open', () => resolve({ ws, frames }));
    ws.once('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    ws.once('error', reject);
  });
}

const gpuStates = (frames: readonly Frame[]): Map<string, Extract<Frame, { k: 'state' }>> => {
  const last = new Map<string, Extract<Frame, { k: 'state' }>>();
  for (const f of frames) if (f.k === 'state' && f.m === 'gpu') last.set(f.id, f);
  return last;
};

describe("the inspector shows the worker's GPU actors", () => {
  let s: Served;
  beforeAll(async () => {
    s = await serve(['--config', CONFIG, '--time-scale', '0.01']);
    await s.waitReady('llama-3-8b');
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('streams every GPU actor of the worker while someone reads, and a failure as it happens', async () => {
    const { ws, frames } = await read(s);
    // Joining replays each GPU actor's current snapshot: eight actors, each serving its replica.
    await expect.poll(() => gpuStates(frames).size, { timeout: 10_000 }).toBe(8);
    const actors = frames.flatMap((f) => (f.k === 'actor' && f.m === 'gpu' ? [f.id] : []));
    expect(new Set(actors)).toEqual(new Set(Array.from({ length: 8 }, (_, g) => `gpu.${g}`)));
    for (const f of gpuStates(frames).values()) {
      expect(f.s).toBe('allocated.serving');
      expect(f.ctx['replica']).toMatch(/^replica\.llama-3-8b@/);
    }
    expect((await s.post('/admin/gpus/3/fail', {}, s.adminToken)).status).toBe(202);
    await expect.poll(() => gpuStates(frames).get('gpu.3')?.s, { timeout: 10_000 }).toBe('failed');
    expect(gpuStates(frames).get('gpu.3')!.ctx['faultCode']).toBeTruthy();
    // The other seven are untouched.
    for (const [id, f] of gpuStates(frames)) if (id !== 'gpu.3') expect(f.s).toBe('allocated.serving');
    ws.close();
  });
});
