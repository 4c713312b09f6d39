// Draws a machine definition (from inspector/statechart.ts) as SVG: nested boxes laid out top to bottom in the
// order states are reached from each initial state, transitions as labelled arrows, the current state highlighted.
import { esc } from './html.js';

const SVG = 'http://www.w3.org/2000/svg';
const CHAR_W = 6.4;
const ATOM_H = 26;
const PAD = 10;
const HEAD = 20;
const COL_GAP = 28;
const ROW_GAP = 34;

/** The child of `node` that is `path` or contains it, or null. */
const childContaining = (node, path) => {
  for (const c of node.children) if (path === c.path || path.startsWith(`${c.path}.`)) return c;
  return null;
};

/** Rows of a compound state's children: breadth-first from the initial child along transitions between them. */
const ranksOf = (node, edges) => {
  const rank = new Map();
  const next = new Map(node.children.map((c) => [c.path, []]));
  for (const e of edges) {
    const a = childContaining(node, e.from);
    const b = childContaining(node, e.to);
    if (a && b && a !== b) next.get(a.path).push(b.path);
  }
  const start = node.children.find((c) => c.key === node.initial) ?? node.children[0];
  const queue = [start.path];
  rank.set(start.path, 0);
  while (queue.length > 0) {
    const p = queue.shift();
    for (const q of next.get(p) ?? []) {
      if (rank.has(q)) continue;
      rank.set(q, rank.get(p) + 1);
      queue.push(q);
    }
  }
  let last = Math.max(...rank.values());
  for (const c of node.children) if (!rank.has(c.path)) rank.set(c.path, ++last);
  // Final states share the bottom row, as terminal outcomes usually are drawn.
  const finals = node.children.filter((c) => c.type === 'final');
  if (finals.length > 0 && finals.length < node.children.length) {
    const bottom = Math.max(...node.children.filter((c) => c.type !== 'final').map((c) => rank.get(c.path))) + 1;
    for (const c of finals) rank.set(c.path, bottom);
  }
  const cols = [];
  for (const c of node.children) {
    const r = rank.get(c.path);
    (cols[r] ??= []).push(c);
  }
  return cols.filter((c) => c && c.length > 0);
};

/** Sizes every state (w, h) and lays out children relative to their parent: one row per step from the initial state. */
const measure = (node, edges) => {
  if (node.children.length === 0) {
    node.w = Math.max(64, node.key.length * CHAR_W + 22);
    node.h = ATOM_H;
    return;
  }
  for (const c of node.children) measure(c, edges);
  const rows = ranksOf(node, edges);
  const rowWidth = (row) => row.reduce((a, c) => a + c.w, 0) + COL_GAP * (row.length - 1);
  const inner = Math.max(...rows.map(rowWidth), node.key.length * CHAR_W);
  let y = HEAD + PAD;
  for (const row of rows) {
    const h = Math.max(...row.map((c) => c.h));
    let x = PAD + (inner - rowWidth(row)) / 2;
    for (const c of row) {
      c.rx = x;
      c.ry = y + (h - c.h) / 2;
      x += c.w + COL_GAP;
    }
    y += h + ROW_GAP;
  }
  node.w = inner + 2 * PAD;
  node.h = y - ROW_GAP + PAD;
};

const place = (node, x, y, boxes) => {
  node.x = x;
  node.y = y;
  boxes.set(node.path, node);
  for (const c of node.children) place(c, x + c.rx, y + c.ry, boxes);
};

/** The point where the segment from the box's centre towards (tx, ty) leaves the box. */
const border = (b, tx, ty) => {
  const cx = b.x + b.w / 2;
  const cy = b.y + b.h / 2;
  const dx = tx - cx;
  const dy = ty - cy;
  if (dx === 0 && dy === 0) return [cx, cy];
  const sx = dx !== 0 ? b.w / 2 / Math.abs(dx) : Infinity;
  const sy = dy !== 0 ? b.h / 2 / Math.abs(dy) : Infinity;
  const s = Math.min(sx, sy);
  return [cx + dx * s, cy + dy * s];
};

/** States that are active when the machine is in `statePath` (the state and its ancestors). */
export function activePaths(statePath) {
  const out = new Set(['']);
  if (!statePath) return out;
  const parts = statePath.split('.');
  for (let i = 1; i <= parts.length; i++) out.add(parts.slice(0, i).join('.'));
  return out;
}

const LANE_GAP = 9;
const LABEL_CHAR = 5.2;

/** The deepest state containing both paths (the root when they share nothing). */
const commonAncestor = (boxes, a, b) => {
  const pa = a.split('.');
  const pb = b.split('.');
  let i = 0;
  while (i < pa.length && i < pb.length && pa[i] === pb[i]) i++;
  return boxes.get(pa.slice(0, i).join('.')) ?? boxes.get('');
};

/** Renders `def` with `statePath` highlighted; returns an SVG string. */
export function renderStatechart(def, statePath) {
  const root = structuredClone(def.root);
  const edges = def.edges;
  measure(root, edges);
  const boxes = new Map();
  place(root, 0, 0, boxes);
  const active = activePaths(statePath);
  let minX = -8;
  let maxX = root.w + 8;
  const extend = (x0, x1) => {
    minX = Math.min(minX, x0);
    maxX = Math.max(maxX, x1);
  };
  const body = [];
  const drawBox = (n) => {
    const on = active.has(n.path) && n.path !== '';
    const cls = [
      'state-box',
      n.children.length > 0 ? 'compound' : '',
      n.type === 'final' ? 'final' : '',
      on ? 'active' : '',
    ]
      .filter(Boolean)
      .join(' ');
    body.push(
      `<rect class="${cls}" data-state="${esc(n.path)}" x="${n.x}" y="${n.y}" width="${n.w}" height="${n.h}" rx="${n.children.length > 0 ? 8 : 12}"/>`,
    );
    const tcls = on ? ' class="active"' : '';
    if (n.children.length > 0) body.push(`<text${tcls} x="${n.x + 8}" y="${n.y + 14}">${esc(n.key)}</text>`);
    else
      body.push(`<text${tcls} x="${n.x + n.w / 2}" y="${n.y + n.h / 2 + 4}" text-anchor="middle">${esc(n.key)}</text>`);
    if (n.initial) {
      const init = n.children.find((c) => c.key === n.initial);
      if (init)
        body.push(
          `<circle cx="${init.x + 12}" cy="${init.y - 14}" r="3" fill="#8793a0"/><path class="edge" marker-end="url(#arr)" d="M${init.x + 12},${init.y - 11} L${init.x + 12},${init.y - 1}"/>`,
        );
    }
    for (const c of n.children) drawBox(c);
  };
  drawBox(root);
  const lanes = new Map();
  const pairCount = new Map();
  const f = (x) => x.toFixed(1);
  for (const e of edges) {
    const a = boxes.get(e.from);
    const b = boxes.get(e.to);
    if (!a || !b || a === b) continue;
    const label = e.guard ? `${e.label} [${e.guard}]` : e.label;
    const hot = active.has(e.from) && e.from !== '' ? ' hot' : '';
    const labelW = label.length * LABEL_CHAR;
    if (e.from === '' || e.to.startsWith(`${e.from}.`)) {
      // A transition from an ancestor (the machine itself: "from any state"): a short arrow into the target's right side.
      const y = b.y + b.h / 2;
      body.push(`<path class="edge${hot}" marker-end="url(#arr)" d="M${b.x + b.w + 16},${y} L${b.x + b.w},${y}"/>`);
      body.push(`<text class="edge-label" x="${b.x + b.w + 19}" y="${y + 3}">* ${esc(label)}</text>`);
      extend(b.x, b.x + b.w + 24 + labelW);
      continue;
    }
    const acx = a.x + a.w / 2;
    const bcx = b.x + b.w / 2;
    const sameRow = a.y < b.y + b.h && b.y < a.y + a.h;
    const nextRow = b.y >= a.y + a.h && b.y - (a.y + a.h) <= ROW_GAP + 2;
    if (sameRow || nextRow) {
      const key = [e.from, e.to].sort().join('|');
      const k = pairCount.get(key) ?? 0;
      pairCount.set(key, k + 1);
      const [x1, y1] = border(a, bcx, b.y + b.h / 2);
      const [x2, y2] = border(b, acx, a.y + a.h / 2);
      const len = Math.hypot(x2 - x1, y2 - y1) || 1;
      // Parallel edges between the same pair bow out on alternate sides.
      const bow = (k % 2 === 0 ? 1 : -1) * (8 + 12 * Math.floor(k / 2)) * (e.from < e.to ? 1 : -1);
      const cx = (x1 + x2) / 2 + (-(y2 - y1) / len) * bow;
      const cy = (y1 + y2) / 2 + ((x2 - x1) / len) * bow;
      const lx = (x1 + 2 * cx + x2) / 4;
      const ly = (y1 + 2 * cy + y2) / 4;
      body.push(
        `<path class="edge${hot}" data-edge="${esc(e.from)}→${esc(e.to)}" marker-end="url(#arr)" d="M${f(x1)},${f(y1)} Q${f(cx)},${f(cy)} ${f(x2)},${f(y2)}"/>`,
      );
      body.push(`<text class="edge-label" x="${f(lx + 4)}" y="${f(ly + 3)}">${esc(label)}</text>`);
      extend(lx, lx + 4 + labelW);
      continue;
    }
    // Edges that skip rows or go back up run in a lane beside the smallest state holding both ends, so they never
    // cross the states between them.
    const lca = commonAncestor(boxes, e.from, e.to);
    const side = (acx + bcx) / 2 >= lca.x + lca.w / 2 ? 1 : -1;
    const laneKey = `${lca.path}|${side}`;
    const k = lanes.get(laneKey) ?? 0;
    lanes.set(laneKey, k + 1);
    const lane = side > 0 ? lca.x + lca.w + 8 + LANE_GAP * k : lca.x - 8 - LANE_GAP * k;
    const ax = side > 0 ? a.x + a.w : a.x;
    const bx = side > 0 ? b.x + b.w : b.x;
    const ay = a.y + a.h / 2 + (k % 3) * 3 - 3;
    const by = b.y + b.h / 2 + (k % 3) * 3 - 3;
    const r = Math.min(6, Math.abs(by - ay) / 2);
    const dy = by > ay ? r : -r;
    body.push(
      `<path class="edge${hot}" data-edge="${esc(e.from)}→${esc(e.to)}" marker-end="url(#arr)" d="M${f(ax)},${f(ay)} L${f(lane - side * r)},${f(ay)} Q${f(lane)},${f(ay)} ${f(lane)},${f(ay + dy)} L${f(lane)},${f(by - dy)} Q${f(lane)},${f(by)} ${f(lane - side * r)},${f(by)} L${f(bx)},${f(by)}"/>`,
    );
    const my = (ay + by) / 2;
    if (side > 0) {
      body.push(`<text class="edge-label" x="${f(lane + 3)}" y="${f(my)}">${esc(label)}</text>`);
      extend(lane, lane + 6 + labelW);
    } else {
      body.push(`<text class="edge-label" x="${f(lane - 3)}" y="${f(my)}" text-anchor="end">${esc(label)}</text>`);
      extend(lane - 6 - labelW, lane);
    }
  }
  const width = maxX - minX;
  const height = root.h + 24;
  return [
    `<svg xmlns="${SVG}" width="${Math.ceil(width)}" height="${Math.ceil(height)}" viewBox="${f(minX)} -12 ${Math.ceil(width)} ${Math.ceil(height)}" role="img" aria-label="statechart of ${esc(def.id)}" data-machine="${esc(def.id)}" data-active="${esc(statePath ?? '')}">`,
    '<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path class="arrow" d="M0,0 L10,5 L0,10 z"/></marker></defs>',
    ...body,
    '</svg>',
  ].join('');
}
