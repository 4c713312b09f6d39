// The inspector page: live over /v1/inspect, or replaying a recorded simulation with a time slider.
import { apply, createModel, framesOfRecording, gpuActor, placementActor, VERSION } from './model.js';
import { renderStatechart } from './statechart.js';
import { markup } from './html.js';
import {
  ctxHtml,
  gb,
  gpuTile,
  historyHtml,
  ms,
  replicaCard,
  requestDetailHtml,
  requestRow,
  timelineItem,
} from './views.js';

const $ = (id) => document.getElementById(id);
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
const setHtml = (el, content) => {
  const text = String(content);
  if (el.dataset.html === text) return;
  el.innerHTML = text;
  el.dataset.html = text;
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
        : 'refused: the inspector needs the admin or the inspector token: open the page as /inspector/#token=<token>; not retrying';
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

const renderGpus = () => setHtml($('gpu-grid'), markup`${model.gpus.map((g) => gpuTile(g, selected))}`);

const renderReplicas = () => {
  const live = [...model.replicas.values()].sort((a, b) => a.id.localeCompare(b.id));
  const cards = [
    ...live.map((r) => replicaCard(r, false, selected)),
    ...model.pastReplicas.map((r) => replicaCard(r, true, selected)),
  ];
  setHtml($('replica-list'), markup`${cards}`);
};

const renderRequests = () => {
  const inFlight = [...model.inFlight.values()];
  const finished = model.finished
    .slice(-50)
    .reverse()
    .map((id) => model.actors.get(id))
    .filter(Boolean);
  const rows = [...inFlight.slice(-150).reverse(), ...finished].map((a) => requestRow(a, selected));
  setHtml($('request-rows'), markup`${rows}`);
  $('req-count').textContent = `${model.inFlight.size} in flight · ${model.finished.length} recently finished`;
};

const renderTimeline = () => setHtml($('timeline'), markup`${model.timeline.slice(-200).reverse().map(timelineItem)}`);

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
  setHtml(body, markup`${extra}${actor.m === 'request' ? requestDetailHtml(actor) : ''}${historyHtml(actor)}`);
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
