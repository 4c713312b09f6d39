// The inspector page's views escape every value they write into HTML: names, messages and numbers from the wire alike
// (a field that should be a number may hold markup), and its content security policy lets it connect only home.
import { describe, expect, it } from 'vitest';
import { pageAsset } from '../../inspector/assets.ts';

type Render = (...args: unknown[]) => { toString(): string };
/** The page's own modules, loaded as the browser does (plain JavaScript, no types). */
const load = async (name: string): Promise<Record<string, Render>> =>
  (await import(new URL(`../../inspector/public/${name}`, import.meta.url).href)) as Record<string, Render>;

const EVIL = '<img src=x onerror="alert(1)">';
const ESCAPED = '&lt;img src=x onerror=&quot;alert(1)&quot;&gt;';

describe('the inspector page', () => {
  it('escapes a value in markup`` and keeps the markup the tag made itself', async () => {
    const { markup, esc } = await load('html.js');
    expect(esc!(`&<>"'`).toString()).toBe('&amp;&lt;&gt;&quot;&#39;');
    const cell = (v: unknown): { toString(): string } =>
      (markup as unknown as (s: string[], ...v: unknown[]) => never)(['<td>', '</td>'], v);
    expect(String(cell(EVIL))).toBe(`<td>${ESCAPED}</td>`);
    expect(String(cell([cell(1), cell('<b>')]))).toBe('<td><td>1</td><td>&lt;b&gt;</td></td>');
    expect(String(cell(null))).toBe('<td></td>');
  });

  it('writes markup in any field of a GPU, a replica, a request, a decision or a story as text', async () => {
    const v = await load('views.js');
    const views = [
      v.gpuTile!({ index: EVIL, state: EVIL, model: EVIL, replica: EVIL, memoryBytes: 0, weightsBytes: 0, kvBytes: 0 }),
      v.replicaCard!(
        {
          id: EVIL,
          state: EVIL,
          epoch: EVIL,
          step: EVIL,
          steps: EVIL,
          gpus: [EVIL],
          waiting: EVIL,
          running: EVIL,
          blocksUsed: EVIL,
          blocksTotal: 0,
        },
        false,
        null,
      ),
      v.requestRow!({ id: EVIL, state: EVIL, done: true, ctx: { model: EVIL, code: EVIL, tokens: EVIL } }, null),
      v.timelineItem!({ tone: EVIL, ref: EVIL, t: EVIL, text: EVIL }),
      v.decisionHtml!({
        outcome: EVIL,
        kind: EVIL,
        chosen: EVIL,
        reason: EVIL,
        model: EVIL,
        priority: EVIL,
        policy: EVIL,
        t: 1,
        budgetMs: 1,
        candidates: [
          { replica: EVIL, waitMs: 1, ttftMs: 1, queued: EVIL, running: EVIL, freeBlocks: EVIL, needBlocks: EVIL },
        ],
        excluded: [{ replica: EVIL, why: EVIL }],
      }),
      v.requestDetailHtml!({
        ctx: { model: EVIL, replica: EVIL },
        trace: [],
        history: [
          { t: 1, s: EVIL, ev: { type: 'request.interrupted', tokens: EVIL, code: EVIL, message: EVIL } },
          { t: 2, s: EVIL, ev: { type: 'request.requeued', replica: EVIL } },
        ],
      }),
      v.historyHtml!({ history: [{ t: 1, s: EVIL, ev: { type: EVIL, code: EVIL, replica: EVIL, message: EVIL } }] }),
      v.ctxHtml!({ [EVIL]: EVIL, list: [EVIL] }),
    ].map(String);
    for (const out of views) {
      expect(out).not.toContain('<img');
      expect(out).toContain(ESCAPED);
    }
  });

  it('is served with a content security policy that connects only to its own server', () => {
    const csp = pageAsset('/inspector/')!.headers['Content-Security-Policy']!;
    const directives = new Map(
      csp
        .split(';')
        .map((d) => d.trim().split(/\s+/))
        .map(([k, ...v]) => [k!, v]),
    );
    expect(directives.get('connect-src')).toEqual(["'self'"]);
    expect(directives.get('script-src')).toEqual(["'self'"]);
    expect(directives.get('default-src')).toEqual(["'self'"]);
  });
});
