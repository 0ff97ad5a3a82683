// deptrace layout worker: lays out the map left to right off the page's
// main thread, so that a map of 2,000 nodes stays usable meanwhile.
//
// Up to DAGRE_NODES nodes and DAGRE_EDGES edges: dagre (vendored, MIT),
// whose crossing minimisation is the better one but grows much faster
// than the graph (400 nodes and 2,000 edges take it over 10 s). Beyond:
// a layered layout of the same shape in linear passes (below).
//
// In:  {gen, nodes: [[id, left, right, half, group]], edges: [[from, to]],
//       titles: {group: width}, geo: {pad, title, gap}}
//      A node's extent around its dot, in layout units (the page's pixels
//      at zoom 1): left of the dot, right of it (its label included) and
//      half its height. group is '' for none; a group's nodes are kept
//      together and drawn in a box: pad around its nodes, a title of
//      title units above them at least titles[group] wide. Boxes, and
//      nodes in none, are laid out gap apart: no box overlaps another and
//      no title covers a node's label.
// Out: {gen, ms, engine, positions: {id: [x, y]}} (the dots' centres) or
//      {gen, error}
/* global dagre, importScripts */
'use strict';
importScripts('vendor/dagre-3.1.3.min.js');

const DAGRE_NODES = 250, DAGRE_EDGES = 1000;
const RANKSEP = 90, NODESEP = 10;

// rects are the boxes of a layout (layout units, y down) and the nodes
// in no box, each with the indices of its nodes: the page draws the same
// (app.js, measureBoxes).
function rects(msg, xs, ys) {
  const { pad, title } = msg.geo;
  const by = new Map();
  msg.nodes.forEach(([, left, right, half, group], i) => {
    const k = group || '\u0000' + i;
    let r = by.get(k);
    if (!r) by.set(k, r = { group, x0: Infinity, x1: -Infinity, y0: Infinity, y1: -Infinity, ids: [] });
    r.ids.push(i);
    r.x0 = Math.min(r.x0, xs[i] - left); r.x1 = Math.max(r.x1, xs[i] + right);
    r.y0 = Math.min(r.y0, ys[i] - half); r.y1 = Math.max(r.y1, ys[i] + half);
  });
  for (const r of by.values()) {
    if (!r.group) continue;
    r.x0 -= pad; r.y0 -= pad + title; r.y1 += pad;
    r.x1 = Math.max(r.x1 + pad, r.x0 + (msg.titles[r.group] || 0));
  }
  return [...by.values()];
}

// separate moves boxes (and nodes in none) down, whole, until none is
// within gap of another: taken from the top, each is placed below every
// one already placed that it would overlap. Columns stay columns, and
// a box's nodes keep their places in it.
function separate(msg, xs, ys) {
  const gap = msg.geo.gap;
  const rs = rects(msg, xs, ys).sort((a, b) => a.y0 - b.y0 || a.x0 - b.x0);
  const placed = [];
  for (const r of rs) {
    let dy = 0;
    for (let moved = true; moved;) {
      moved = false;
      for (const p of placed) {
        if (p.x0 < r.x1 + gap && r.x0 < p.x1 + gap && p.y0 < r.y1 + dy + gap && r.y0 + dy < p.y1 + gap) {
          dy = p.y1 + gap - r.y0;
          moved = true;
        }
      }
    }
    r.y0 += dy; r.y1 += dy;
    for (const i of r.ids) ys[i] += dy;
    placed.push(r);
  }
}

const groups0 = (msg) => msg.nodes.some((x) => x[4]);

function withDagre(msg, compound) {
  const { pad, title, gap } = msg.geo;
  // Nodes of two boxes one above the other need room for both boxes'
  // padding, the lower one's title and the gap: dagre puts nodesep
  // between nodes of one cluster and nodesep + 2 edgesep between two.
  const between = 2 * pad + title + gap;
  const d = new dagre.graphlib.Graph({ multigraph: false, compound });
  d.setGraph({
    // A cluster's borders are ranks of their own: between two columns of
    // clusters, ranksep comes twice.
    rankdir: 'LR', ranksep: Math.max(compound && groups0(msg) ? RANKSEP / 2 : RANKSEP, 2 * pad + gap + 30), marginx: 0, marginy: 0,
    nodesep: compound ? NODESEP : between, edgesep: compound ? Math.ceil((between - NODESEP) / 2) : 6,
  });
  d.setDefaultEdgeLabel(() => ({}));
  const groups = new Set();
  // A node as wide as its dot and label, or its box's title; as tall
  // as it is.
  const width = msg.nodes.map(([, left, right, , group]) => Math.max(left + right, group ? (msg.titles[group] || 0) - 2 * pad : 0));
  msg.nodes.forEach(([id, , , half, group], i) => {
    d.setNode(id, { width: width[i], height: 2 * half });
    if (compound && group) {
      const g = '\u0000group:' + group;
      if (!groups.has(g)) { groups.add(g); d.setNode(g, {}); }
      d.setParent(id, g);
    }
  });
  for (const [s, t] of msg.edges) if (s !== t) d.setEdge(s, t, { weight: 1 });
  dagre.layout(d);
  const xs = new Float64Array(msg.nodes.length), ys = new Float64Array(msg.nodes.length);
  // dagre centres a column's nodes; the page draws a label right of its
  // dot: the dots of a column are aligned on its left edge instead.
  const colLeft = new Map();
  msg.nodes.forEach(([id], i) => {
    const n = d.node(id), k = Math.round(n.x);
    colLeft.set(k, Math.min(colLeft.has(k) ? colLeft.get(k) : Infinity, n.x - width[i] / 2));
    xs[i] = n.x; ys[i] = n.y;
  });
  msg.nodes.forEach(([, left], i) => { xs[i] = colLeft.get(Math.round(xs[i])) + left; });
  separate(msg, xs, ys);
  const positions = {};
  msg.nodes.forEach(([id], i) => { positions[id] = [xs[i], ys[i]]; });
  return positions;
}

// linear is a layered layout in passes linear in nodes + edges:
//  1. cycles broken by a depth-first search (back edges reversed);
//  2. ranks by longest path from the sources (clients left);
//  3. each rank ordered by group, then four barycentre sweeps (down, up)
//     that order a rank's nodes by the mean place of their neighbours in
//     other ranks, a group's nodes kept together at its mean;
//  4. x from the rank; y from the group's band and the order in it.
function linear(msg) {
  const n = msg.nodes.length;
  const index = new Map(msg.nodes.map(([id], i) => [id, i]));
  const group = msg.nodes.map((x) => x[4] || '');
  const left = msg.nodes.map((x) => x[1]), right = msg.nodes.map((x) => x[2]), half = msg.nodes.map((x) => x[3]);
  const out = Array.from({ length: n }, () => []);
  const edges = [];
  for (const [s, t] of msg.edges) {
    const a = index.get(s), b = index.get(t);
    if (a === undefined || b === undefined || a === b) continue;
    edges.push([a, b]);
    out[a].push(b);
  }
  // 1. Depth-first search (iterative): an edge to a node on the stack is
  // a back edge.
  const state = new Uint8Array(n); // 0 new, 1 on the stack, 2 done
  const back = new Set();
  for (let r = 0; r < n; r++) {
    if (state[r]) continue;
    const stack = [[r, 0]];
    state[r] = 1;
    while (stack.length) {
      const top = stack[stack.length - 1];
      const [v, i] = top;
      if (i < out[v].length) {
        top[1]++;
        const w = out[v][i];
        if (state[w] === 1) back.add(v * n + w);
        else if (!state[w]) { state[w] = 1; stack.push([w, 0]); }
      } else { state[v] = 2; stack.pop(); }
    }
  }
  const succ = Array.from({ length: n }, () => []), pred = Array.from({ length: n }, () => []);
  for (const [a, b] of edges) {
    const [s, t] = back.has(a * n + b) ? [b, a] : [a, b];
    succ[s].push(t); pred[t].push(s);
  }
  // 2. Longest path from the sources, in topological order (Kahn).
  const rank = new Int32Array(n), deg = new Int32Array(n);
  for (let v = 0; v < n; v++) deg[v] = pred[v].length;
  const queue = [];
  for (let v = 0; v < n; v++) if (!deg[v]) queue.push(v);
  for (let q = 0; q < queue.length; q++) {
    const v = queue[q];
    for (const w of succ[v]) {
      rank[w] = Math.max(rank[w], rank[v] + 1);
      if (--deg[w] === 0) queue.push(w);
    }
  }
  // A server with no outgoing edges sits one rank right of its nearest
  // client rather than at the far right: pull sinks left to the smallest
  // rank their clients allow.
  for (let v = 0; v < n; v++) {
    if (succ[v].length || !pred[v].length) continue;
    let r = 0;
    for (const u of pred[v]) r = Math.max(r, rank[u] + 1);
    rank[v] = r;
  }
  let ranks = 0;
  for (let v = 0; v < n; v++) ranks = Math.max(ranks, rank[v] + 1);
  const layers = Array.from({ length: ranks }, () => []);
  for (let v = 0; v < n; v++) layers[rank[v]].push(v);
  const pos = new Float64Array(n); // place in its rank, 0..1
  const place = () => {
    for (const L of layers) L.forEach((v, i) => { pos[v] = L.length > 1 ? i / (L.length - 1) : 0.5; });
  };
  for (const L of layers) L.sort((a, b) => (group[a] < group[b] ? -1 : group[a] > group[b] ? 1 : a - b));
  place();
  // 3. Barycentre sweeps over all neighbours (both directions), grouped.
  const bary = new Float64Array(n);
  for (let sweep = 0; sweep < 4; sweep++) {
    const order = sweep % 2 ? layers.slice().reverse() : layers;
    for (const L of order) {
      const gsum = new Map();
      for (const v of L) {
        let s = 0, c = 0;
        for (const w of succ[v]) { s += pos[w]; c++; }
        for (const w of pred[v]) { s += pos[w]; c++; }
        bary[v] = c ? s / c : pos[v];
        const g = gsum.get(group[v]) || [0, 0];
        g[0] += bary[v]; g[1]++;
        gsum.set(group[v], g);
      }
      const gm = (v) => { const g = gsum.get(group[v]); return group[v] ? g[0] / g[1] : bary[v]; };
      L.sort((a, b) => gm(a) - gm(b) || (group[a] < group[b] ? -1 : group[a] > group[b] ? 1 : 0) || bary[a] - bary[b] || a - b);
      L.forEach((v, i) => { pos[v] = L.length > 1 ? i / (L.length - 1) : 0.5; });
    }
  }
  // 4. Coordinates: columns as wide as their widest node (its dot and
  // label), the dots on the column's left edge, ranksep apart; each group
  // a horizontal band across the columns, as tall as its largest column
  // plus its box's padding and title, gap from the next (so that no box
  // overlaps another and no title covers a label), bands ordered by
  // their nodes' mean place; a node without a group is a band of its
  // own, without a box.
  const { pad, title, gap } = msg.geo;
  const band = (v) => group[v] || '\u0000' + v;
  const bands = new Map(); // band -> {sum, n, rows: Map(rank -> count)}
  for (const L of layers) {
    for (const v of L) {
      const k = band(v);
      let b = bands.get(k);
      if (!b) bands.set(k, b = { sum: 0, n: 0, rows: new Map(), boxed: !!group[v] });
      b.sum += pos[v]; b.n++;
      b.rows.set(rank[v], (b.rows.get(rank[v]) || 0) + 1);
    }
  }
  let hmax = 8;
  for (let v = 0; v < n; v++) hmax = Math.max(hmax, half[v]);
  const rowH = 2 * hmax + NODESEP;
  const order = [...bands.entries()].sort((a, b) => a[1].sum / a[1].n - b[1].sum / b[1].n || (a[0] < b[0] ? -1 : 1));
  let y = 0;
  for (const [, b] of order) {
    b.tallest = Math.max(...b.rows.values());
    b.y = y + (b.boxed ? pad + title : 0); // the first row's top
    y = b.y + b.tallest * rowH - NODESEP + (b.boxed ? pad : 0) + gap;
  }
  const total = y;
  const positions = {};
  let x = 0;
  const sep = Math.max(RANKSEP, 2 * pad + gap + 30);
  for (const L of layers) {
    let w = 0;
    for (const v of L) w = Math.max(w, left[v] + right[v]);
    const used = new Map();
    for (const v of L) { // L is in barycentre order: kept within a band
      const b = bands.get(band(v));
      const i = used.get(b) || 0;
      used.set(b, i + 1);
      const rows = b.rows.get(rank[v]);
      positions[msg.nodes[v][0]] = [x + left[v], b.y + ((b.tallest - rows) / 2 + i) * rowH + hmax - total / 2];
    }
    x += w + sep;
  }
  return positions;
}

self.onmessage = (ev) => {
  const msg = ev.data;
  const t0 = performance.now();
  try {
    let positions = null, engine = 'linear';
    if (msg.nodes.length <= DAGRE_NODES && msg.edges.length <= DAGRE_EDGES) {
      // Groups as dagre clusters keep a group's nodes together; dagre's
      // compound layout fails on some shapes, then the plain one is used.
      try { positions = withDagre(msg, true); engine = 'dagre-compound'; } catch (err) { positions = null; }
      if (!positions) { positions = withDagre(msg, false); engine = 'dagre'; }
    } else {
      positions = linear(msg);
    }
    self.postMessage({ gen: msg.gen, ms: Math.round(performance.now() - t0), engine, positions });
  } catch (err) {
    self.postMessage({ gen: msg.gen, error: String((err && err.message) || err) });
  }
};
