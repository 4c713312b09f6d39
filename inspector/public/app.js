// The inspector page: live over /v1/inspect, or replaying a recorded simulation with a time slider.
import { apply, createModel, framesOfRecording, gpuActor, placementActor, VERSION } from './model.js';
import { renderStatechart } from './statechart.js';

const $ = (id) => document.getElementById(id);
const esc = (s) =>
  String(s ?? '').replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c],
  );
const gb = (bytes) => `${(bytes / 1e9).toFixed(bytes >= 1e10 || bytes === 0 ? 0 : 1)} GB`;
const gbn = (bytes) => (bytes / 1e9).toFixed(bytes >= 1e10 || bytes === 0 ? 0 : 1);
const ms = (t) => (t >= 10_000 ? `${(t / 1000).toFixed(1)} s` : `${Math.round(t)} ms`);

let model = createModel();
let selected = null;
let dirty = true;
let socket = null;
let replay = null;
let retryMs = 250;

/** Redraws on the next animation frame (at most once per frame however many frames arrive). */
const invalidate = () => {
  if (dirty) return;
  dirty = true;
  requestAnimationFrame(render);
};

/** Replaces an element's content only when it changed, so rows under the pointer are not swapped mid-click. */
const setHtml = (el, html) => {
  if (el.dataset.html === html) return;
  el.innerHTML = html;
  el.dataset.html = html;
};

const select = (sel) => {
  selected = sel;
  invalidate();
};

// ---- live ----

const tokenFromFragment = () => {
  const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
};

const b64url = (s) =>
  btoa(String.fromCharCode(...new TextEncoder().encode(s)))
    .replace(/\+/g, '-')
    .replace(/\//g, '_')
    .replace(/=+$/, '');

const connect = () => {
  if (replay) return;
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const protocols = ['switchyard.inspect.v1'];
  const token = tokenFromFragment();
  // Browsers cannot set Authorization on a WebSocket: the token travels as a subprotocol, never in the URL.
  if (token) protocols.push(`switchyard.token.${b64url(token)}`);
  setConn('connecting…', '');
  const ws = new WebSocket(`${proto}//${location.host}/v1/inspect`, protocols);
  socket = ws;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    retryMs = 250;
    model = createModel();
    setConn('live', 'ok');
  };
  ws.onmessage = (e) => {
    let msg;
    try {
      msg = JSON.parse(e.data);
    } catch {
      return;
    }
    if (msg.v !== VERSION) {
      setConn(`server speaks version ${msg.v}, page reads ${VERSION}`, 'bad');
      ws.close();
      return;
    }
    for (const f of msg.frames) apply(model, f);
    invalidate();
  };
  ws.onclose = (e) => {
    if (socket !== ws) return;
    socket = null;
    if (replay) return;
    if (e.code === 1008) return setConn(`refused: ${e.reason || 'policy'}`, 'bad');
    // A refused upgrade tells the browser nothing: ask the server why, and stop retrying when retrying cannot help.
    const retry = () => {
      setConn('disconnected, retrying…', 'bad');
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 5000);
    };
    if (opened) return retry();
    whyRefused(token).then((why) => (why ? setConn(why, 'bad') : retry()));
  };
};

/** Why the server refuses this page's stream (no token, wrong token, origin), or null when it would accept it. */
const whyRefused = async (token) => {
  try {
    const r = await fetch('/inspector/auth', { headers: token ? { Authorization: `Bearer ${token}` } : {} });
    if (r.status === 401)
      return token
        ? 'refused: the token in the address (#token=…) is not accepted; not retrying'
        : 'refused: this server needs a client token: open the page as /inspector/#token=<token>; not retrying';
    if (r.status === 403) return 'refused: this page’s origin or host is not allowed (--allowed-origin); not retrying';
    return null;
  } catch {
    return null;
  }
};

const setConn = (text, cls) => {
  const el = $('conn');
  el.textContent = text;
  el.className = `pill ${cls}`;
};

// ---- replay ----

const startReplay = (frames, name) => {
  if (socket) {
    const s = socket;
    socket = null;
    s.close();
  }
  const t0 = frames[0].t ?? 0;
  const t1 = frames.reduce((a, f) => Math.max(a, f.t ?? 0), t0);
  replay = { frames, name, t0, t1, cursor: 0, at: t1, playing: false, last: 0 };
  $('replay').hidden = false;
  const slider = $('slider');
  slider.min = String(t0);
  slider.max = String(t1);
  slider.step = String(Math.max(1, (t1 - t0) / 2000));
  seek(t1);
  setConn(`replay: ${name}`, 'warn');
};

/** Shows the state at time `t`: forward from the current position, or again from the start when going back. */
const seek = (t) => {
  const r = replay;
  if (t < r.at) {
    model = createModel();
    r.cursor = 0;
  }
  while (r.cursor < r.frames.length && (r.frames[r.cursor].t ?? 0) <= t) apply(model, r.frames[r.cursor++]);
  r.at = t;
  model.t = t;
  $('slider').value = String(t);
  $('replay-time').textContent = `${ms(t - r.t0)} / ${ms(r.t1 - r.t0)} · frame ${r.cursor} of ${r.frames.length}`;
  invalidate();
};

const tick = (now) => {
  const r = replay;
  if (!r || !r.playing) return;
  const dt = r.last ? now - r.last : 0;
  r.last = now;
  const t = Math.min(r.t1, r.at + dt * Number($('speed').value));
  seek(t);
  if (t >= r.t1) setPlaying(false);
  else requestAnimationFrame(tick);
};

const setPlaying = (on) => {
  const r = replay;
  if (!r) return;
  r.playing = on;
  r.last = 0;
  $('play').textContent = on ? '❚❚ pause' : '▶ play';
  if (on) {
    if (r.at >= r.t1) seek(r.t0);
    requestAnimationFrame(tick);
  }
};

const openRecordingText = (text, name) => {
  try {
    startReplay(framesOfRecording(JSON.parse(text)), name);
  } catch (e) {
    setConn(`cannot open ${name}: ${e.message}`, 'bad');
  }
};

// ---- rendering ----

const renderHeader = () => {
  $('scenario').textContent = model.scenario ? `scenario ${model.scenario}` : '';
  $('clock').textContent = `t = ${ms(model.t)} · ${model.live} live`;
  const p = model.placement;
  const pl = $('placement');
  pl.textContent = p ? `placement ${p.policy} · ${p.state}${p.reservation ? ' · gang reservation' : ''}` : 'placement';
  pl.classList.toggle('selected', selected?.kind === 'placement');
  const gang = $('gang');
  const unavailable = p ? Object.entries(p.unavailable) : [];
  gang.textContent = [
    p?.reservation ? `gang reservation held (target ${p.target})` : '',
    ...unavailable.map(([m, why]) => `${m} unavailable: ${why}`),
  ]
    .filter(Boolean)
    .join(' · ');
  const d = $('dropped');
  d.hidden = model.dropped === 0;
  d.textContent = `${model.dropped} frames dropped`;
};

const renderGpus = () => {
  const html = model.gpus
    .map((g) => {
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
      return `<div class="gpu st-${esc(g.state)}${sel}" data-testid="gpu-tile" data-gpu="${g.index}" data-state="${esc(g.state)}" data-model="${esc(g.model ?? '')}">
        <div class="top"><span class="name">GPU ${g.index}</span><span class="state">${esc(g.state)}</span></div>
        <div class="who" title="${esc(g.replica ?? '')}">${esc(who)}</div>
        <div class="mem" title="weights ${gb(g.weightsBytes)}, KV ${gb(g.kvBytes)}, free ${gb(free)}"><span class="weights" style="width:${w.toFixed(2)}%"></span><span class="kv" style="width:${kv.toFixed(2)}%"></span></div>
        <div class="memtext">${g.state === 'failed' ? 'memory unavailable' : `w ${gbn(g.weightsBytes)} · KV ${gbn(g.kvBytes)} · free ${gb(free)}`}</div>
      </div>`;
    })
    .join('');
  setHtml($('gpu-grid'), html);
};

const replicaCard = (r, gone) => {
  const pct = r.blocksTotal > 0 ? (100 * r.blocksUsed) / r.blocksTotal : 0;
  const head = r.state.split('.')[0];
  const sel = selected?.kind === 'actor' && selected.id === r.id ? ' selected' : '';
  const shown = gone && r.wasFailed && r.state !== 'failed' ? `${r.state} (failed)` : r.state;
  return `<div class="replica rs-${esc(head)}${r.wasFailed ? ' was-failed' : ''}${gone ? ' gone' : ''}${sel}" data-testid="replica" data-id="${esc(r.id)}" data-state="${esc(r.state)}" data-failed="${r.wasFailed ? 'true' : 'false'}">
    <div class="id">${esc(r.id)}</div>
    <div class="row"><span class="state">${esc(shown)}</span><span>epoch ${r.epoch}</span></div>
    <div class="row"><span>gpus ${esc(r.gpus.join(','))}</span><span>step ${r.step}</span></div>
    <div class="row"><span>queue ${r.waiting} · running ${r.running}</span><span>${r.steps} steps</span></div>
    <div class="row"><span>KV ${r.blocksUsed}/${r.blocksTotal} blocks</span></div>
    <div class="bar"><span style="width:${pct.toFixed(1)}%"></span></div>
  </div>`;
};

const renderReplicas = () => {
  const live = [...model.replicas.values()].sort((a, b) => a.id.localeCompare(b.id));
  setHtml(
    $('replica-list'),
    live.map((r) => replicaCard(r, false)).join('') + model.pastReplicas.map((r) => replicaCard(r, true)).join(''),
  );
};

const renderRequests = () => {
  const rows = [];
  const inFlight = [...model.inFlight.values()];
  const finished = model.finished
    .slice(-50)
    .reverse()
    .map((id) => model.actors.get(id))
    .filter(Boolean);
  for (const a of [...inFlight.slice(-150).reverse(), ...finished]) {
    const sel = selected?.kind === 'actor' && selected.id === a.id ? ' class="selected"' : '';
    rows.push(
      `<tr${sel} data-testid="request-row" data-id="${esc(a.id)}" data-state="${esc(a.state)}"><td>${esc(a.id)}</td><td>${esc(a.ctx.model)}</td><td class="rq-${esc(a.state)}">${esc(a.state)}${a.ctx.code ? ` · ${esc(a.ctx.code)}` : ''}</td><td>${esc(a.ctx.replica ?? '')}</td><td>${a.done || a.ctx.tokens ? (a.ctx.tokens ?? 0) : ''}</td></tr>`,
    );
  }
  setHtml($('request-rows'), rows.join(''));
  $('req-count').textContent = `${model.inFlight.size} in flight · ${model.finished.length} recently finished`;
};

const renderTimeline = () => {
  setHtml(
    $('timeline'),
    model.timeline
      .slice(-200)
      .reverse()
      .map(
        (e) =>
          `<li class="${esc(e.tone)}"${e.ref ? ` data-ref="${esc(e.ref)}"` : ''}><span class="t">${ms(e.t)}</span><span>${esc(e.text)}</span></li>`,
      )
      .join(''),
  );
};

const decisionHtml = (d) => {
  const cands = Array.isArray(d.candidates) ? d.candidates : [];
  const excluded = Array.isArray(d.excluded) ? d.excluded : [];
  const rows = cands
    .map(
      (c) =>
        `<tr><td class="${c.replica === d.chosen ? 'chosen' : ''}">${esc(c.replica)}</td><td>${Math.round(c.waitMs)} ms</td><td>${Math.round(c.ttftMs)} ms</td><td>${c.queued}/${c.running}</td><td>${c.freeBlocks}/${c.needBlocks}${c.headroom ? '' : ' ✗'}</td></tr>`,
    )
    .join('');
  return `<div class="decision ${esc(d.outcome)}" data-testid="decision">
    <div class="why">${d.kind ? `${esc(d.kind)} · ` : ''}${esc(d.outcome)}${d.chosen ? ` to ${esc(d.chosen)}` : ''} at ${ms(d.t)}: ${esc(d.reason)}</div>
    <div class="meta">${esc(d.model)}@${esc(d.version ?? '?')} · ${esc(d.priority)} · policy ${esc(d.policy)} · queue budget ${Math.round(d.budgetMs)} ms</div>
    ${rows ? `<table><tr><th>candidate</th><th>wait</th><th>ttft</th><th>queued/running</th><th>KV free/need</th></tr>${rows}</table>` : ''}
    ${excluded.map((x) => `<div class="meta">excluded ${esc(x.replica)}: ${esc(x.why)}</div>`).join('')}
  </div>`;
};

const historyHtml = (a) =>
  a.history.length === 0
    ? ''
    : `<h3>history</h3><table data-testid="history">${a.history
        .slice()
        .reverse()
        .map(
          (h) =>
            `<tr><td>${ms(h.t)}</td><td>${esc(h.s)}</td><td>${esc(h.ev.type)}${h.ev.code ? ` · ${esc(h.ev.code)}` : ''}${h.ev.replica ? ` → ${esc(h.ev.replica)}` : ''}${h.ev.message ? ` — ${esc(h.ev.message)}` : ''}</td></tr>`,
        )
        .join('')}</table>`;

const ctxHtml = (ctx) =>
  `<dl class="kv-list">${Object.entries(ctx)
    .filter(([, v]) => v !== null && v !== undefined && v !== '')
    .map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(Array.isArray(v) ? v.join(', ') : v)}</dd>`)
    .join('')}</dl>`;

/** A request's story: why it went where it went, and what happened to it since. */
const storyHtml = (a) => {
  const lines = [];
  for (const h of a.history) {
    const e = h.ev;
    if (e.type === 'request.rejected') lines.push(`rejected at ${ms(h.t)}: ${esc(e.code)} — ${esc(e.message)}`);
    else if (e.type === 'request.preempted')
      lines.push(
        `preempted at ${ms(h.t)} on ${esc(a.ctx.replica ?? 'its replica')} (KV blocks ran out; recomputed later)`,
      );
    else if (e.type === 'request.interrupted')
      lines.push(`interrupted at ${ms(h.t)} after ${e.tokens ?? 0} tokens: ${esc(e.code)} — ${esc(e.message)}`);
    else if (e.type === 'request.requeued')
      lines.push(
        `resumed at ${ms(h.t)} on ${esc(e.replica)}${a.history.some((x) => x.ev.type === 'request.interrupted') ? ' after the failure above' : ''}`,
      );
    else if (e.type === 'request.deadline' && h.s !== 'queued' && h.s !== 'requeued')
      lines.push(`${esc(h.s)} at ${ms(h.t)}: ${esc(a.ctx.message ?? 'its budget ran out')}`);
  }
  return lines.length > 0
    ? `<h3>what happened</h3><ul data-testid="story">${lines.map((l) => `<li>${l}</li>`).join('')}</ul>`
    : '';
};

const renderDetail = () => {
  const title = $('detail-title');
  const chart = $('chart');
  const body = $('detail-body');
  if (!selected) {
    chart.innerHTML = '';
    chart.dataset.key = '';
    setHtml(body, '');
    return;
  }
  let actor = null;
  let extra = '';
  if (selected.kind === 'gpu') {
    actor = gpuActor(model, selected.index);
    const g = model.gpus.find((x) => x.index === selected.index);
    if (g)
      extra = ctxHtml({
        shown: g.state,
        replica: g.replica ?? '—',
        model: g.model ?? '—',
        weights: gb(g.weightsBytes),
        'KV in use': gb(g.kvBytes),
        total: gb(g.memoryBytes),
      });
  } else if (selected.kind === 'placement') {
    actor = placementActor(model);
    if (model.placement)
      extra = ctxHtml({
        policy: model.placement.policy,
        mode: model.placement.mode,
        target: model.placement.target,
        'gang reservation': model.placement.reservation ? 'held' : 'none',
      });
  } else {
    actor = model.actors.get(selected.id) ?? null;
    const r = model.replicas.get(selected.id) ?? model.pastReplicas.find((x) => x.id === selected.id);
    if (r)
      extra = ctxHtml({
        queue: r.waiting,
        running: r.running,
        step: r.step,
        'KV blocks': `${r.blocksUsed}/${r.blocksTotal}`,
        gpus: r.gpus.join(','),
      });
  }
  if (!actor) {
    title.textContent = `${selected.id ?? ''} (no longer tracked)`;
    chart.innerHTML = '';
    chart.dataset.key = '';
    setHtml(body, '');
    return;
  }
  title.textContent = `${actor.id} · ${actor.m} · ${actor.state ?? '?'}`;
  const def = model.machines[actor.m];
  const key = `${actor.m}|${actor.state}|${actor.id}`;
  if (def && chart.dataset.key !== key) {
    chart.innerHTML = renderStatechart(def, actor.state);
    chart.dataset.key = key;
  }
  const decisions =
    actor.m === 'request'
      ? `<h3>decision trace</h3><div data-testid="decision-trace">${actor.trace.map(decisionHtml).join('') || '<div class="meta">no routing decision recorded</div>'}${storyHtml(actor)}</div>`
      : '';
  setHtml(body, `${extra}${actor.m === 'request' ? ctxHtml(actor.ctx) : ''}${decisions}${historyHtml(actor)}`);
};

function render() {
  dirty = false;
  renderHeader();
  renderGpus();
  renderReplicas();
  renderRequests();
  renderTimeline();
  renderDetail();
}

// ---- wiring ----

$('gpu-grid').addEventListener('click', (e) => {
  const tile = e.target.closest('[data-gpu]');
  if (tile) select({ kind: 'gpu', index: Number(tile.dataset.gpu) });
});
$('replica-list').addEventListener('click', (e) => {
  const card = e.target.closest('[data-id]');
  if (card) select({ kind: 'actor', id: card.dataset.id });
});
$('request-rows').addEventListener('click', (e) => {
  const row = e.target.closest('[data-id]');
  if (row) select({ kind: 'actor', id: row.dataset.id });
});
$('timeline').addEventListener('click', (e) => {
  const li = e.target.closest('[data-ref]');
  if (!li) return;
  const ref = li.dataset.ref;
  const g = /^gpu\.(\d+)$/.exec(ref);
  select(g ? { kind: 'gpu', index: Number(g[1]) } : { kind: 'actor', id: ref });
});
$('placement').addEventListener('click', () => select({ kind: 'placement' }));
$('file').addEventListener('change', async (e) => {
  const file = e.target.files?.[0];
  if (file) openRecordingText(await file.text(), file.name);
});
$('slider').addEventListener('input', (e) => {
  setPlaying(false);
  seek(Number(e.target.value));
});
$('play').addEventListener('click', () => setPlaying(!replay?.playing));

/** Test and debugging hook: the current view and selection. */
window.switchyardInspector = { model: () => model, select };

const params = new URLSearchParams(location.search);
const replayUrl = params.get('replay');
if (params.has('offline')) {
  setConn('offline: open a recording', '');
} else if (replayUrl) {
  fetch(replayUrl)
    .then((r) => (r.ok ? r.text() : Promise.reject(new Error(`HTTP ${r.status}`))))
    .then((text) => openRecordingText(text, replayUrl.split('/').pop()))
    .catch((e) => setConn(`cannot load ${replayUrl}: ${e.message}`, 'bad'));
} else {
  connect();
}
render();
