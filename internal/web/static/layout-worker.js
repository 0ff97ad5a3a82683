// deptrace layout worker: lays out the map left to right with dagre
// (vendored, MIT) off the page's main thread, so that a map of 2,000
// nodes stays usable while dagre orders its layers.
//
// In:  {gen, nodes: [[id, width, height, group]], edges: [[from, to]]}
//      (group: '' for none; a group's nodes are kept together, dagre's
//      compound graphs)
// Out: {gen, ms, positions: {id: [x, y]}, compound: bool} or {gen, error}
/* global dagre, importScripts */
'use strict';
importScripts('vendor/dagre-3.1.3.min.js');

function layout(msg, compound) {
  const d = new dagre.graphlib.Graph({ multigraph: false, compound });
  d.setGraph({ rankdir: 'LR', nodesep: 12, ranksep: 90, edgesep: 6, marginx: 0, marginy: 0 });
  d.setDefaultEdgeLabel(() => ({}));
  const groups = new Set();
  for (const [id, width, height, group] of msg.nodes) {
    d.setNode(id, { width, height });
    if (compound && group) {
      const g = '\u0000group:' + group;
      if (!groups.has(g)) { groups.add(g); d.setNode(g, {}); }
      d.setParent(id, g);
    }
  }
  for (const [s, t] of msg.edges) if (s !== t) d.setEdge(s, t, { weight: 1 });
  dagre.layout(d);
  const positions = {};
  for (const [id] of msg.nodes) { const n = d.node(id); positions[id] = [n.x, n.y]; }
  return positions;
}

self.onmessage = (ev) => {
  const msg = ev.data;
  const t0 = performance.now();
  // Groups as dagre clusters keep a group's nodes together; dagre's
  // compound layout fails on some shapes, then the plain one is used.
  let positions = null, compound = msg.compound;
  if (compound) {
    try { positions = layout(msg, true); } catch (err) { compound = false; }
  }
  try {
    if (!positions) positions = layout(msg, false);
    self.postMessage({ gen: msg.gen, ms: Math.round(performance.now() - t0), positions, compound });
  } catch (err) {
    self.postMessage({ gen: msg.gen, error: String(err && err.message || err) });
  }
};
