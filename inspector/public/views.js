// The page's HTML views, pure functions of the model (no DOM): GPU tiles, replica cards, request rows, the
// timeline, and the detail panel's decision trace, story, history and context. Every value goes through markup``.
import { markup } from './html.js';

/** Bytes as GB, with the unit. */
export const gb = (bytes) => `${gbn(bytes)} GB`;
/** Bytes as GB, without the unit. */
export const gbn = (bytes) => (bytes / 1e9).toFixed(bytes >= 1e10 || bytes === 0 ? 0 : 1);
/** A duration in ms, shown in s from 10 s up. */
export const ms = (t) => (t >= 10_000 ? `${(t / 1000).toFixed(1)} s` : `${Math.round(t)} ms`);

/** One GPU tile; `selected` is the page's selection. */
export const gpuTile = (g, selected) => {
  const w = g.memoryBytes > 0 ? (100 * g.weightsBytes) / g.memoryBytes : 0;
  const kv = g.memoryBytes > 0 ? (100 * g.kvBytes) / g.memoryBytes : 0;
  const free = Math.max(0, g.memoryBytes - g.weightsBytes - g.kvBytes);
  const who =
    g.state === 'failed'
      ? 'unhealthy'
      : g.model
        ? `${g.model} · ${g.replica ?? ''}${g.guest ? ` + ${g.guest}` : ''}`
        : g.state === 'reserved'
          ? 'held for the gang'
          : '';
  const sel = selected?.kind === 'gpu' && selected.index === g.index ? ' selected' : '';
  const mem =
    g.state === 'failed' ? 'memory unavailable' : `w ${gbn(g.weightsBytes)} · KV ${gbn(g.kvBytes)} · free ${gb(free)}`;
  return markup`<div class="gpu st-${g.state}${sel}" data-testid="gpu-tile" data-gpu="${g.index}" data-state="${g.state}" data-model="${g.model ?? ''}">
        <div class="top"><span class="name">GPU ${g.index}</span><span class="state">${g.state}</span></div>
        <div class="who" title="${g.replica ?? ''}">${who}</div>
        <div class="mem" title="weights ${gb(g.weightsBytes)}, KV ${gb(g.kvBytes)}, free ${gb(free)}"><span class="weights" style="width:${w.toFixed(2)}%"></span><span class="kv" style="width:${kv.toFixed(2)}%"></span></div>
        <div class="memtext">${mem}</div>
      </div>`;
};

/** One replica card; `gone` for a replica that no longer exists. */
export const replicaCard = (r, gone, selected) => {
  const pct = r.blocksTotal > 0 ? (100 * r.blocksUsed) / r.blocksTotal : 0;
  const head = String(r.state).split('.')[0];
  const sel = selected?.kind === 'actor' && selected.id === r.id ? ' selected' : '';
  const shown = gone && r.wasFailed && r.state !== 'failed' ? `${r.state} (failed)` : r.state;
  const flags = `${r.wasFailed ? ' was-failed' : ''}${gone ? ' gone' : ''}${sel}`;
  return markup`<div class="replica rs-${head}${flags}" data-testid="replica" data-id="${r.id}" data-state="${r.state}" data-failed="${r.wasFailed ? 'true' : 'false'}">
    <div class="id">${r.id}</div>
    <div class="row"><span class="state">${shown}</span><span>epoch ${r.epoch}</span></div>
    <div class="row"><span>gpus ${r.gpus.join(',')}</span><span>step ${r.step}</span></div>
    <div class="row"><span>queue ${r.waiting} · running ${r.running}</span><span>${r.steps} steps</span></div>
    <div class="row"><span>KV ${r.blocksUsed}/${r.blocksTotal} blocks</span></div>
    <div class="bar"><span style="width:${pct.toFixed(1)}%"></span></div>
  </div>`;
};

/** One row of the requests table. */
export const requestRow = (a, selected) => {
  const sel = selected?.kind === 'actor' && selected.id === a.id ? markup` class="selected"` : '';
  const code = a.ctx.code ? ` · ${a.ctx.code}` : '';
  const tokens = a.done || a.ctx.tokens ? (a.ctx.tokens ?? 0) : '';
  return markup`<tr${sel} data-testid="request-row" data-id="${a.id}" data-state="${a.state}"><td>${a.id}</td><td>${a.ctx.model}</td><td class="rq-${a.state}">${a.state}${code}</td><td>${a.ctx.replica ?? ''}</td><td>${tokens}</td></tr>`;
};

/** One timeline entry. */
export const timelineItem = (e) =>
  markup`<li class="${e.tone}"${e.ref ? markup` data-ref="${e.ref}"` : ''}><span class="t">${ms(e.t)}</span><span>${e.text}</span></li>`;

/** One routing decision: its outcome, reason, candidates and exclusions. */
export const decisionHtml = (d) => {
  const cands = Array.isArray(d.candidates) ? d.candidates : [];
  const excluded = Array.isArray(d.excluded) ? d.excluded : [];
  const rows = cands.map(
    (c) =>
      markup`<tr><td class="${c.replica === d.chosen ? 'chosen' : ''}">${c.replica}</td><td>${Math.round(c.waitMs)} ms</td><td>${Math.round(c.ttftMs)} ms</td><td>${c.queued}/${c.running}</td><td>${c.freeBlocks}/${c.needBlocks}${c.headroom ? '' : ' ✗'}</td></tr>`,
  );
  const head = markup`<tr><th>candidate</th><th>wait</th><th>ttft</th><th>queued/running</th><th>KV free/need</th></tr>`;
  return markup`<div class="decision ${d.outcome}" data-testid="decision">
    <div class="why">${d.kind ? `${d.kind} · ` : ''}${d.outcome}${d.chosen ? ` to ${d.chosen}` : ''} at ${ms(d.t)}: ${d.reason}</div>
    <div class="meta">${d.model}@${d.version ?? '?'} · ${d.priority} · policy ${d.policy} · queue budget ${Math.round(d.budgetMs)} ms</div>
    ${rows.length > 0 ? markup`<table>${head}${rows}</table>` : ''}
    ${excluded.map((x) => markup`<div class="meta">excluded ${x.replica}: ${x.why}</div>`)}
  </div>`;
};

/** An actor's history, newest first. */
export const historyHtml = (a) => {
  if (a.history.length === 0) return '';
  const rows = a.history
    .slice()
    .reverse()
    .map((h) => {
      const e = h.ev;
      const what = `${e.type}${e.code ? ` · ${e.code}` : ''}${e.replica ? ` → ${e.replica}` : ''}${e.message ? ` — ${e.message}` : ''}`;
      return markup`<tr><td>${ms(h.t)}</td><td>${h.s}</td><td>${what}</td></tr>`;
    });
  return markup`<h3>history</h3><table data-testid="history">${rows}</table>`;
};

/** A context as a definition list (empty values left out). */
export const ctxHtml = (ctx) => {
  const items = Object.entries(ctx)
    .filter(([, v]) => v !== null && v !== undefined && v !== '')
    .map(([k, v]) => markup`<dt>${k}</dt><dd>${Array.isArray(v) ? v.join(', ') : v}</dd>`);
  return markup`<dl class="kv-list">${items}</dl>`;
};

/** The lines of a request's story: why it went where it went, and what happened to it since. */
const storyLines = (a) => {
  const lines = [];
  for (const h of a.history) {
    const e = h.ev;
    if (e.type === 'request.rejected') lines.push(`rejected at ${ms(h.t)}: ${e.code} — ${e.message}`);
    else if (e.type === 'request.preempted')
      lines.push(`preempted at ${ms(h.t)} on ${a.ctx.replica ?? 'its replica'} (KV blocks ran out; recomputed later)`);
    else if (e.type === 'request.interrupted')
      lines.push(`interrupted at ${ms(h.t)} after ${e.tokens ?? 0} tokens: ${e.code} — ${e.message}`);
    else if (e.type === 'request.requeued') {
      const after = a.history.some((x) => x.ev.type === 'request.interrupted') ? ' after the failure above' : '';
      lines.push(`resumed at ${ms(h.t)} on ${e.replica}${after}`);
    } else if (e.type === 'request.deadline' && h.s !== 'queued' && h.s !== 'requeued')
      lines.push(`${h.s} at ${ms(h.t)}: ${a.ctx.message ?? 'its budget ran out'}`);
  }
  return lines;
};

/** A request's story as a list, or nothing when there is none. */
export const storyHtml = (a) => {
  const lines = storyLines(a);
  return lines.length > 0
    ? markup`<h3>what happened</h3><ul data-testid="story">${lines.map((l) => markup`<li>${l}</li>`)}</ul>`
    : '';
};

/** The detail panel's body for a request: its context, decision trace, story and history. */
export const requestDetailHtml = (actor) => {
  const trace = actor.trace.map(decisionHtml);
  const none = markup`<div class="meta">no routing decision recorded</div>`;
  return markup`${ctxHtml(actor.ctx)}<h3>decision trace</h3><div data-testid="decision-trace">${trace.length > 0 ? trace : none}${storyHtml(actor)}</div>`;
};
