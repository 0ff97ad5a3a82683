// deptrace service map: fetches /api/graph (and /api/diff in diff mode),
// draws it with sigma (WebGL) or lists it as a table. All page state lives
// in the URL so that a link shows the same thing.
(() => {
  'use strict';

  const $ = (s) => document.querySelector(s);
  const LARGE = 2000; // nodes beyond which the page opens on the table
  const PAGE = 500; // table rows added per "Show more"
  const RANGES = ['15m', '1h', '24h', '7d', 'all', 'custom'];

  // ---- state and URL -------------------------------------------------
  const state = {
    view: '', q: '', focus: '', depth: '1', range: '1h', since: '', until: '',
    diff: false, weight: 'connections', group: 'namespace', by: 'workload', sort: 'client', dir: 'asc',
    unhealthy: false, rows: PAGE,
  };
  const collapsed = new Set();
  // collapseChosen: the user collapsed or expanded a group since the
  // grouping was chosen; until then the page decides (openCollapsed).
  let collapseChosen = false;

  // urlNotes say which of the link's values the page could not show as
  // given, and what it shows instead ("range 2h is not offered: showing
  // 1 h"): the next load puts them on the status line.
  let urlNotes = [];
  function readURL() {
    const p = new URLSearchParams(location.search);
    const notes = [];
    // pick gives a parameter's value when it is one of allowed; another
    // value is noted, with what is shown instead (show names it).
    const pick = (k, allowed, show, what) => {
      const v = p.get(k);
      if (v === null || !allowed || allowed.includes(v)) return v;
      notes.push((what || k) + ' ' + JSON.stringify(v).slice(1, -1) + ' is not offered: showing ' + show + ' (allowed ' + allowed.join(', ') + ')');
      return null;
    };
    state.view = pick('view', ['map', 'table'], 'the default view') || '';
    state.q = p.get('q') || '';
    state.focus = p.get('focus') || '';
    state.depth = pick('depth', ['0', '1', '2', '3'], 'depth 1', 'depth') || '1';
    state.since = absTime(p.get('since') || '');
    state.until = absTime(p.get('until') || '');
    state.range = pick('range', RANGES, 'the last 1 h', 'range') || (state.since || state.until ? 'custom' : '1h');
    if (state.range === 'custom' && !state.since && !state.until) {
      notes.push('range custom needs since or until: showing the last 1 h');
      state.range = '1h';
    }
    state.diff = p.get('diff') === '1';
    state.weight = pick('weight', ['connections', 'bytes'], 'connections') || 'connections';
    state.group = pick('group', ['namespace', 'host', 'k8s'], 'network namespaces', 'group') || 'namespace';
    state.by = pick('by', ['workload', 'process', 'host'], 'workloads', 'node (by)') || 'workload';
    state.sort = p.get('sort') || 'client';
    state.dir = pick('dir', ['asc', 'desc'], 'ascending', 'dir') || 'asc';
    state.unhealthy = p.get('unhealthy') === '1';
    // groups=expanded: every group open, as the user chose (openCollapsed).
    collapseChosen = p.get('groups') === 'expanded';
    urlNotes = notes;
  }

  // Custom ranges are absolute times: a datetime-local input's value (or
  // a link's time without an offset) is the browser's local time, sent
  // with its offset (2026-11-30T05:01:00+09:00), so that the server,
  // wherever it runs, reads the time the user meant. Ages (2h) and other
  // forms the API takes are sent as they are.
  const LOCAL = /^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d)(?::(\d\d)(?:\.\d+)?)?$/;
  const pad2 = (v) => String(v).padStart(2, '0');
  function rfc3339(d) {
    const off = -d.getTimezoneOffset();
    const z = off === 0 ? 'Z' : (off > 0 ? '+' : '-') + pad2(Math.floor(Math.abs(off) / 60)) + ':' + pad2(Math.abs(off) % 60);
    return d.getFullYear() + '-' + pad2(d.getMonth() + 1) + '-' + pad2(d.getDate()) + 'T' + pad2(d.getHours()) + ':' + pad2(d.getMinutes()) + ':' + pad2(d.getSeconds()) + z;
  }
  function absTime(v) {
    // A '+' a link left unencoded reads as a space: an offset after a time
    // of day ("T10:00 09:00"), not the API's "2006-01-02 15:04" form.
    v = v.trim().replace(/(T\d\d:\d\d(?::\d\d(?:\.\d+)?)?) (\d\d:\d\d)$/, '$1+$2');
    const m = LOCAL.exec(v);
    if (!m) return v;
    const d = new Date(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +(m[6] || 0));
    return isNaN(d) ? v : rfc3339(d);
  }
  // localInput is an absolute time as a datetime-local input shows it: the
  // browser's local time ('' for what is no absolute time, such as 2h).
  function localInput(v) {
    if (!/^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)$/i.test(v)) return '';
    const d = new Date(v);
    if (isNaN(d)) return '';
    return rfc3339(d).slice(0, d.getSeconds() ? 19 : 16);
  }

  // writeURL keeps the address in step with the state: push (a navigation
  // the user may want to go back from: a focus, the view, the range, the
  // grouping) adds a history entry, else the entry is replaced.
  function writeURL(push) {
    const p = new URLSearchParams();
    if (state.view) p.set('view', state.view);
    if (state.q) p.set('q', state.q);
    if (state.focus) { p.set('focus', state.focus); p.set('depth', state.depth); }
    if (state.range === 'custom') {
      if (state.since) p.set('since', state.since);
      if (state.until) p.set('until', state.until);
    } else if (state.range !== '1h') p.set('range', state.range);
    if (state.diff) p.set('diff', '1');
    if (state.weight !== 'connections') p.set('weight', state.weight);
    if (state.group !== 'namespace') p.set('group', state.group);
    if (state.by !== 'workload') p.set('by', state.by);
    if (collapseChosen && collapsed.size === 0) p.set('groups', 'expanded');
    if (state.view === 'table') {
      if (state.sort !== 'client' || state.dir !== 'asc') { p.set('sort', state.sort); p.set('dir', state.dir); }
      if (state.unhealthy) p.set('unhealthy', '1');
    }
    const qs = p.toString();
    const url = qs ? '?' + qs : location.pathname;
    if (push && '?' + qs !== location.search && !(qs === '' && location.search === '')) history.pushState(null, '', url);
    else history.replaceState(null, '', url);
  }

  // ---- formatting ----------------------------------------------------
  const endpoint = (addr, port) => (addr.includes(':') ? '[' + addr + ']' : addr) + ':' + port;
  function label(n) {
    if (!n) return '?';
    if (n.kind === 'group') return n.name + ' (' + n.count + ' nodes, collapsed)';
    // A server without a port is the agent's fold of further servers, one
    // per protocol: 'udp _other (external)'.
    if (n.kind === 'external') return (n.port ? n.proto + ' ' + endpoint(n.addr, n.port) : (n.proto ? n.proto + ' ' : '') + n.addr) + ' (external)';
    if (n.kind === 'host') return 'host ' + n.host + (n.addr ? ' (' + n.addr + ')' : '');
    if (n.kind === 'workload') {
      // As graph.Label: the workload's name, its processes when they
      // differ, the host.
      let name = n.name || '?';
      if (n.process && n.process !== name) name += ' (' + n.process + ')';
      else if (!n.workload) name += who(n);
      return name + ' on ' + n.host + (n.addr ? ' (' + n.addr + ')' : '');
    }
    const proc = (n.process || '?') + who(n);
    if (n.kind === 'service') return n.proto + ' ' + endpoint(n.addr || n.host, n.port) + ' ' + proc + ' on ' + n.host;
    return proc + ' on ' + n.host + (n.addr ? ' (' + n.addr + ')' : '');
  }
  // idLabel and who name a process's identity as `deptrace graph` does
  // (graph.Who): the pod and its container, else the container, else
  // the systemd unit; with the workload first.
  function idLabel(n) {
    if (n.pod_name) return n.k8s_container ? n.pod_name + ':' + n.k8s_container : n.pod_name;
    if (n.container_name) return n.container_name;
    if (n.container_id) return n.container_id.slice(0, 12);
    return n.unit || '';
  }
  function who(n) {
    const name = idLabel(n);
    if (n.workload && name && name !== n.workload) return ' [' + n.workload + ' ' + name + ']';
    if (n.workload || name) return ' [' + (n.workload || name) + ']';
    return '';
  }
  // shortName is what the map writes on a node: the workload's name, the
  // container's or the process's.
  function shortName(n) {
    if (n.kind === 'host') return n.host;
    if (n.workload) return n.workload.slice(n.workload.lastIndexOf('/') + 1);
    return n.name || n.container_name || n.process || '?';
  }
  // shortLabel is what the map writes on a node: an external one by its
  // DNS name or address and port, a process nobody saw by the ports it
  // was asked for ("? tcp/9001"). index() adds the host to labels that
  // several nodes share (mapLabels).
  function shortLabel(n) {
    if (n.kind === 'group') return n.name + ' ×' + n.count;
    if (n.kind === 'external') {
      const name = n.remote_name || (n.port ? endpoint(n.addr, n.port) : (n.proto ? n.proto + ' ' : '') + n.addr);
      return n.remote_name && n.port ? name + ':' + n.port : name;
    }
    const s = shortName(n);
    if (n.kind === 'service') return s === '?' ? '? ' + n.proto + '/' + n.port : s + ' :' + n.port;
    if (s === '?' && n.services && n.services.length) {
      return '? ' + n.services.slice(0, 2).map((x) => (x.proto === 'unix' ? 'unix ' + x.addr : x.proto + '/' + x.port)).join(', ') + (n.services.length > 2 ? ', …' : '');
    }
    return s;
  }
  // shortHost is a host id's machine (web-1 of web-1/netns:4026532288.41).
  const shortHost = (h) => (h || '').split('/')[0];
  // mapLabels gives every node its map label, the host added (its
  // machine, else its whole id) where two nodes would read the same:
  // two webapps on two machines are "webapp on web-1" and "webapp on web-2".
  function mapLabels(nodes) {
    const labels = new Map(), count = new Map();
    const bump = (l) => count.set(l, (count.get(l) || 0) + 1);
    for (const n of nodes.values()) { const l = shortLabel(n); labels.set(n.id, l); bump(l); }
    const twice = (n) => n.kind !== 'external' && n.kind !== 'host' && n.host && count.get(labels.get(n.id)) > 1;
    const dup = [...nodes.values()].filter(twice);
    for (const n of dup) { const l = labels.get(n.id) + ' on ' + shortHost(n.host); labels.set(n.id, l); bump(l); }
    for (const n of dup) if (count.get(labels.get(n.id)) > 1 && n.host !== shortHost(n.host)) labels.set(n.id, shortLabel(n) + ' on ' + n.host);
    return labels;
  }
  const num = (v) => (v || 0).toLocaleString('en');
  function bytes(v) {
    v = v || 0;
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : v) + ' ' + u[i];
  }
  function when(t) {
    if (!t || t.startsWith('0001-')) return '—';
    const d = new Date(t);
    return isNaN(d) ? t : d.toLocaleString();
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  const setStatus = (s) => { $('#status').textContent = s; };

  // The server judges health by rates over the range (docs/graph.md,
  // "Health"): a red edge is one it marks unhealthy, never one
  // retransmitted segment.
  const unhealthy = (e) => !!e.unhealthy;
  // health is ok, degraded or unhealthy (a server older than the
  // degraded state only says unhealthy or not).
  const healthOf = (x) => x.health || (x.unhealthy ? 'unhealthy' : 'ok');
  const RANK = { ok: 0, degraded: 1, unhealthy: 2 };
  const worst = (a, b) => (RANK[b] > RANK[a] ? b : a);
  const weightOf = (e) => (state.weight === 'bytes'
    ? (e.bytes_sent || 0) + (e.bytes_received || 0)
    : (e.connections || 0) || (e.datagrams_sent || 0) + (e.datagrams_received || 0));

  // ---- data ----------------------------------------------------------
  let data = null;

  function rangeParams() {
    if (state.range === 'custom') return { since: state.since, until: state.until };
    if (state.range === 'all') return {};
    return { since: state.range };
  }
  const qs = (o) => new URLSearchParams(Object.entries(o).filter(([, v]) => v)).toString();

  async function getJSON(url) {
    const r = await fetch(url, { headers: { Accept: 'application/json' } });
    const body = await r.json().catch(() => ({ error: 'bad answer from ' + url }));
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  // An edge is its ends, protocol and port: one pair of workloads can
  // have several (graph format 2).
  const edgeKey = (e) => e.from + '\u2192' + e.to + ' ' + e.proto + '/' + e.port;

  function index(g, d) {
    const D = { nodes: new Map(), edges: [], out: new Map(), inn: new Map(), linked: new Map(), byKey: new Map(), text: new Map() };
    for (const n of g.nodes) D.nodes.set(n.id, n);
    // Edges are the parsed answer's own objects, completed in place:
    // no copy of each of (up to) 50,000 edges.
    const add = (x, status) => {
      x.key = edgeKey(x);
      x.status = status;
      x.bad = unhealthy(x);
      x.health = healthOf(x);
      D.edges.push(x);
      D.byKey.set(x.key, x);
      if (!D.out.has(x.from)) D.out.set(x.from, []);
      if (!D.inn.has(x.to)) D.inn.set(x.to, []);
      D.out.get(x.from).push(x);
      D.inn.get(x.to).push(x);
    };
    const appeared = new Set(d ? d.appeared.map(edgeKey) : []);
    for (const e of g.edges) add(e, appeared.has(edgeKey(e)) ? 'appeared' : 'same');
    if (d) {
      for (const n of d.nodes) if (!D.nodes.has(n.id)) D.nodes.set(n.id, n);
      for (const e of d.disappeared) add(e, 'disappeared');
    }
    // A service and the process that serves it are one entity: focusing
    // on either shows what the process depends on and what uses it.
    for (const n of D.nodes.values()) {
      if (n.kind !== 'service' || !n.process) continue;
      const p = 'process:' + n.host + '/' + n.process;
      if (!D.nodes.has(p)) continue;
      if (!D.linked.has(p)) D.linked.set(p, []);
      if (!D.linked.has(n.id)) D.linked.set(n.id, []);
      D.linked.get(p).push(n.id);
      D.linked.get(n.id).push(p);
    }
    for (const n of D.nodes.values()) D.text.set(n.id, (label(n) + ' ' + n.id).toLowerCase());
    D.short = mapLabels(D.nodes);
    return D;
  }

  // loadKey is what the data loaded depends on; loads counts them, so
  // that only the latest one's answer is shown.
  const loadKey = () => JSON.stringify([rangeParams(), state.by, state.diff]);
  let loadedKey = '', loads = 0;
  async function load() {
    const gen = ++loads;
    document.body.dataset.state = 'loading';
    setStatus('loading…');
    const rp = rangeParams();
    const wantDiff = state.diff && rp.since;
    const withBy = Object.assign({}, rp, state.by === 'workload' ? {} : { group_by: state.by });
    const key = loadKey();
    let g, d;
    try {
      [g, d] = await Promise.all([
        getJSON('/api/graph?' + qs(withBy)),
        wantDiff ? getJSON('/api/diff?' + qs(withBy)) : Promise.resolve(null),
      ]);
    } catch (err) {
      if (gen !== loads) return;
      setStatus('error: ' + err.message);
      document.body.dataset.state = 'error';
      return;
    }
    if (gen !== loads) return; // a newer load is on its way
    data = index(g, d);
    data.diff = d;
    loadedKey = key;
    let note = urlNotes.map((x) => ' · ' + x).join('') + minuteNote();
    urlNotes = [];
    if (state.diff && !rp.since) note += ' · diff needs a range with a start';
    if (!state.view) {
      state.view = data.nodes.size > LARGE ? 'table' : 'map';
      if (state.view === 'table') note += ' · large graph: opened on the table';
    }
    if (state.focus && !data.nodes.has(state.focus)) {
      note += ' · focus ' + state.focus + ' is not in this range';
      state.focus = '';
    }
    baseStatus = data.nodes.size + ' nodes, ' + data.edges.length + ' edges' +
      (d_summary(data.diff)) + note;
    openCollapsed();
    render();
  }

  // minuteNote: the store keeps counts per minute, and a minute a custom
  // range cuts counts whole (docs/graph.md, "Rollups and time ranges"):
  // a range narrower than a minute, or not on whole minutes, shows the
  // whole minutes it cuts, and the status line says which.
  function minuteNote() {
    if (state.range !== 'custom') return '';
    const a = localInput(state.since) ? new Date(state.since) : null, b = localInput(state.until) ? new Date(state.until) : null;
    const cut = (d) => d && (d.getSeconds() || d.getMilliseconds());
    if (!(cut(a) || cut(b) || (a && b && b - a < 60000))) return '';
    const M = 60000;
    const fmt = (d) => d.toLocaleString([], { year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit' });
    const from = a ? new Date(Math.floor(a / M) * M) : null, to = b ? new Date(Math.max(Math.ceil(b / M) * M, from ? +from + M : 0)) : null;
    return ' · the store keeps counts per whole minute: showing ' + (from ? fmt(from) : 'the start') + ' to ' + (to ? fmt(to) : 'now');
  }

  // The status line: the counts and notes, and on the map whether it
  // opened on its groups.
  let folded = '';
  const statusLine = () => baseStatus + (state.view === 'map' ? folded : '');

  // A map of more than OVERVIEW nodes is too dense to read whole (its
  // labels a few pixels tall): it opens with its groups collapsed, one
  // node each, when that leaves at most half as many nodes, so that the
  // first picture is one of groups with readable labels and their edges
  // added up (an unhealthy edge keeps its group edge red). A click on a
  // group, or Expand all, opens it. Once the user collapses or expands
  // anything, the page leaves the choice to them until the grouping
  // changes. openCollapsed returns the status line's note.
  const OVERVIEW = 150;
  let baseStatus = '';
  function openCollapsed() {
    if (collapseChosen || !data) return (folded = '');
    collapsed.clear();
    const groups = new Set();
    let loose = 0;
    for (const n of data.nodes.values()) {
      const k = groupOf(n);
      if (k) groups.add(k); else loose++;
    }
    folded = '';
    if (data.nodes.size <= OVERVIEW || groups.size < 2 || groups.size + loose > data.nodes.size / 2) return '';
    for (const k of groups) collapsed.add(k);
    folded = ' · map: its ' + groups.size + ' groups collapsed (click one, or Expand all)';
    return folded;
  }
  // chooseCollapse records that the user collapsed or expanded something.
  const chooseCollapse = () => { collapseChosen = true; folded = ''; setStatus(statusLine()); writeURL(); };

  function d_summary(d) {
    return d ? ' · ' + d.appeared.length + ' appeared, ' + d.disappeared.length + ' disappeared' : '';
  }

  // ---- neighbourhood and search -------------------------------------
  // neighbourhood walks edges both ways (and service<->process links) up
  // to depth levels (0: all), returning each node's distance.
  function neighbourhood(id, depth) {
    const dist = new Map([[id, 0]]);
    let frontier = [id];
    for (let lvl = 1; frontier.length && (depth === 0 || lvl <= depth); lvl++) {
      const next = [];
      const visit = (m, l) => { if (!dist.has(m)) { dist.set(m, l); next.push(m); } };
      for (const n of frontier) {
        for (const e of data.out.get(n) || []) visit(e.to, lvl);
        for (const e of data.inn.get(n) || []) visit(e.from, lvl);
        // The entity's other half sits at the same distance.
        for (const m of data.linked.get(n) || []) if (!dist.has(m)) { dist.set(m, dist.get(n)); frontier.push(m); }
      }
      frontier = next;
    }
    // Pull in the linked halves of the last ring too.
    for (const n of [...dist.keys()]) for (const m of data.linked.get(n) || []) if (!dist.has(m)) dist.set(m, dist.get(n));
    return dist;
  }

  function matches() {
    const q = state.q.trim().toLowerCase();
    if (!q || !data) return [];
    const out = [];
    for (const [id, t] of data.text) if (t.includes(q)) out.push(id);
    return out;
  }

  // ---- map -----------------------------------------------------------
  let renderer = null;
  let display = null;
  let pinned = false;

  // groupOf is the box a node sits in: its network namespace (an agent's
  // host id), its machine (the part of the id before the first /), or
  // its Kubernetes namespace ('' when it has none: no box). Endpoints
  // without an agent are in one of two boxes: "external", the servers
  // called, and "external clients", what only calls in. One box for
  // both would put agentless clients beside an unreachable server, and
  // collapsed it would draw paths through it that do not exist
  // (client -> external -> lb).
  const EXT_CLIENTS = 'external clients', EXT_SERVERS = 'external';
  // (An endpoint both called and calling is in no box: collapsed with
  // others, it would join their clients to its servers.)
  function externalGroup(n) {
    const i = data ? (data.inn.get(n.id) || []).length : 0, o = data ? (data.out.get(n.id) || []).length : 0;
    if (i && o) return '';
    return i || (!o && n.port) ? EXT_SERVERS : EXT_CLIENTS;
  }
  const groupOf = (n) => {
    const ext = n.kind === 'external' || !n.host;
    if (state.group === 'k8s') return n.pod_namespace ? 'k8s/' + n.pod_namespace : ext ? externalGroup(n) : '';
    if (ext) return externalGroup(n);
    return state.group === 'host' ? shortHost(n.host) : n.host;
  };
  const COLORS = { workload: '#3366cc', host: '#109618', process: '#3366cc', service: '#109618', external: '#888888', group: '#8e44ad' };

  // An edge's colour is its health, in diff mode too: red unhealthy,
  // amber degraded. A healthy edge is grey, or in diff mode green when it
  // appeared and pale blue when it disappeared (drawn from the window
  // before). In diff mode an edge that appeared or disappeared also
  // carries a badge ("new", "gone") and an appeared one is drawn wider,
  // so that a new failing edge reads both red and new.
  const EDGE = { ok: '#9aa5b8', degraded: '#f59f00', unhealthy: '#e03131', appeared: '#2b8a3e', disappeared: '#74c0fc' };
  const diffing = () => !!(state.diff && data && data.diff);
  function edgeColor(e) {
    if (e.bad) return EDGE.unhealthy;
    if (e.health === 'degraded') return EDGE.degraded;
    if (diffing() && (e.status === 'appeared' || e.status === 'disappeared')) return EDGE[e.status];
    return EDGE.ok;
  }
  const BADGE = { appeared: 'new', disappeared: 'gone' };
  const edgeSize = (w, big) => (big ? Math.min(3, 0.3 + Math.log10(1 + w) / 3) : Math.min(8, 1.5 + Math.log10(1 + w)));

  // Layout: deterministic and linear in the number of nodes, so 10,000
  // nodes place in milliseconds and the same data always looks the same.
  // Groups (hosts or namespaces) sit on a sunflower spiral, largest in the
  // middle; a group's nodes on a small sunflower around its centre. A
  // focused view is radial: the focus in the middle, rings by distance.
  const GOLDEN = Math.PI * (3 - Math.sqrt(5));

  function buildDisplay() {
    const G = new graphology.Graph({ type: 'directed', multi: false, allowSelfLoops: true });
    const big = data.nodes.size > LARGE;
    const base = big ? 1.5 : 5;
    const deg = (id) => (data.out.get(id) || []).length + (data.inn.get(id) || []).length;
    const nodeAttrs = (n, x, y) => ({
      x, y, label: data.short.get(n.id) || shortLabel(n), size: base + Math.log2(1 + deg(n.id)) * (big ? 0.5 : 1.5), kind: n.kind,
      size0: base + Math.log2(1 + deg(n.id)) * (big ? 0.5 : 1.5), // its size at zoom 1 (layered)
      // A node the server judged (dropping service, failing DNS) is red or
      // orange like its edges; its reasons are in the details.
      color: healthOf(n) === 'unhealthy' ? '#e03131' : healthOf(n) === 'degraded' ? '#f59f00' : COLORS[n.kind] || '#555',
      health: healthOf(n),
      box: state.focus ? '' : groupOf(n),
    });
    let place; // node id -> displayed node id
    if (state.focus) {
      const dist = neighbourhood(state.focus, Number(state.depth));
      const rings = new Map();
      for (const [id, dd] of dist) { if (!rings.has(dd)) rings.set(dd, []); rings.get(dd).push(id); }
      for (const [dd, ids] of rings) {
        ids.sort();
        ids.forEach((id, i) => {
          const a = (2 * Math.PI * i) / ids.length + dd * 0.3;
          const r = dd === 0 ? i * 2 : dd * 10 + (ids.length > 40 ? (i % 3) * 2 : 0);
          G.addNode(id, nodeAttrs(data.nodes.get(id), r * Math.cos(a), r * Math.sin(a)));
        });
      }
      place = (id) => (dist.has(id) ? id : null);
    } else {
      const groups = new Map();
      for (const n of data.nodes.values()) {
        const k = groupOf(n);
        if (!groups.has(k)) groups.set(k, []);
        groups.get(k).push(n.id);
      }
      const order = [...groups.keys()].sort((a, b) => groups.get(b).length - groups.get(a).length || (a < b ? -1 : 1));
      const where = new Map();
      let area = 0;
      order.forEach((k, i) => {
        const ids = groups.get(k).sort();
        const rho = Math.sqrt(ids.length) * 1.2 + 1;
        area += rho * rho * 4;
        const R = i === 0 ? 0 : Math.sqrt(area);
        const cx = R * Math.cos(i * GOLDEN), cy = R * Math.sin(i * GOLDEN);
        if (collapsed.has(k)) {
          const gid = 'group:' + k;
          const size = base + 2 + Math.sqrt(ids.length);
          G.addNode(gid, { x: cx, y: cy, label: k + ' ×' + ids.length, size, size0: size, color: COLORS.group, kind: 'group', group: k, count: ids.length });
          for (const id of ids) where.set(id, gid);
          return;
        }
        ids.forEach((id, j) => {
          const r = Math.sqrt(j + 0.5) * 1.2;
          G.addNode(id, nodeAttrs(data.nodes.get(id), cx + r * Math.cos(j * GOLDEN), cy + r * Math.sin(j * GOLDEN)));
          where.set(id, id);
        });
      });
      place = (id) => where.get(id) || null;
    }
    for (const e of data.edges) {
      const s = place(e.from), t = place(e.to);
      if (s === null || t === null) continue;
      const w = weightOf(e);
      if (G.hasEdge(s, t)) {
        // Edges between collapsed groups add up.
        const a = G.getEdgeAttributes(s, t);
        a.keys.push(e.key);
        a.w += w;
        a.bad = a.bad || e.bad;
        a.health = worst(a.health, e.health);
        if (e.status !== 'same') a.status = e.status;
        continue;
      }
      G.addEdge(s, t, { keys: [e.key], w, bad: e.bad, health: e.health, status: e.status });
    }
    const diff = diffing();
    G.forEachEdge((k, a) => {
      a.size = edgeSize(a.w, big) + (diff && a.status === 'appeared' ? 1.5 : 0);
      a.color = edgeColor(a);
      if (diff && BADGE[a.status]) { a.label = BADGE[a.status]; a.forceLabel = true; a.labelColor = a.status === 'appeared' ? '#1b5e20' : '#1864ab'; }
    });
    G.setAttribute('layout', state.focus ? 'radial' : 'grouped');
    return G;
  }

  // A map of up to LAYERED nodes (after grouping and collapsing) is laid
  // out left to right in a web worker (layout-worker.js): clients left,
  // what they depend on to their right, one column per hop, ordered so
  // that edges cross as little as the layers allow, each box's nodes kept
  // together; by dagre (vendored, MIT) up to 250 nodes and 1,000 edges,
  // beyond by the worker's own linear layered layout. The map is drawn
  // and usable at once with the grouped layout, and moves to the layered
  // one when the worker answers (progressive rendering). Larger maps keep
  // the grouped layout.
  const LAYERED = 2000;
  let worker = null, workerBusy = false, layoutGen = 0;
  const wantsLayered = (G) => !state.focus && G.order <= LAYERED && typeof Worker !== 'undefined';

  // The layered map's geometry, in graph units, which are the page's
  // pixels at zoom 1 (the page never opens it larger, onLayout): a node
  // is its dot and its label (14 px Arial, as sigma draws it, 3 px right
  // of the dot); a box is PAD around its nodes with a TITLE above them,
  // at least as wide as its title; boxes (and nodes in none) are GAP
  // apart. The layout worker leaves that room, measureBoxes draws
  // exactly that, and below zoom 1 labels and titles shrink with the
  // map (drawLabel, placeBoxes): no box overlaps another, no title
  // covers a label.
  const GEO = { pad: 8, title: 20, gap: 8 };
  const LABEL = { size: 14, font: 'Arial', weight: 'normal', gap: 3 };
  let measurer = null;
  function textWidth(text, font) {
    if (!measurer) measurer = document.createElement('canvas').getContext('2d');
    measurer.font = font;
    return measurer.measureText(text).width;
  }
  // extent is a node's room around its dot: [left, right, half height].
  const extent = (a) => [a.size0, a.size0 + LABEL.gap + (a.label ? textWidth(a.label, LABEL.weight + ' ' + LABEL.size + 'px ' + LABEL.font) + 2 : 0), Math.max(a.size0, LABEL.size / 2 + 2)];
  const titleText = (key, n) => '▾ ' + key + ' (' + n + ')';
  // titleWidths measures the boxes' title buttons as the page draws them
  // (app.css), 4 px from the box's left and 8 px to spare on its right.
  const titleWidth = new Map();
  function measureTitles(texts) {
    const probe = el('div', undefined, 'box');
    probe.style.cssText = 'visibility: hidden; width: 100000px';
    const bs = texts.filter((x) => !titleWidth.has(x)).map((x) => probe.appendChild(el('button', x)));
    $('#boxes').append(probe);
    for (const b of bs) titleWidth.set(b.textContent, Math.ceil(b.getBoundingClientRect().width) + 12);
    probe.remove();
  }

  function requestLayout(G) {
    const gen = ++layoutGen;
    if (!wantsLayered(G)) return;
    if (worker && workerBusy) { worker.terminate(); worker = null; } // a stale layout: drop it
    if (!worker) {
      worker = new Worker('/static/layout-worker.js');
      worker.onmessage = onLayout;
      worker.onerror = (ev) => { workerBusy = false; $('#map').dataset.layout = 'grouped'; setStatus('layout failed: ' + (ev.message || 'worker error')); };
    }
    const nodes = [], edges = [], count = new Map(), titles = {};
    G.forEachNode((id, a) => {
      a.ext = extent(a);
      const box = a.kind === 'group' ? '' : a.box || '';
      nodes.push([id, ...a.ext, box]);
      if (box) count.set(box, (count.get(box) || 0) + 1);
    });
    // Boxes are drawn for up to MAXBOXES groups: beyond, no room is left
    // for them.
    const drawn = count.size <= MAXBOXES;
    if (drawn) measureTitles([...count].map(([k, c]) => titleText(k, c)));
    for (const [k, c] of count) titles[k] = drawn ? titleWidth.get(titleText(k, c)) : 0;
    G.forEachEdge((k, a, s, t) => edges.push([s, t]));
    workerBusy = true;
    $('#map').dataset.layout = 'laying-out';
    worker.postMessage({ gen, nodes, edges, titles, geo: drawn ? GEO : { pad: 0, title: 0, gap: GEO.gap } });
  }

  function onLayout(ev) {
    workerBusy = false;
    const m = ev.data;
    if (m.gen !== layoutGen || !display || !renderer) return; // a map since replaced
    if (m.error) { $('#map').dataset.layout = 'grouped'; setStatus('layout failed: ' + m.error); return; }
    // A layout much taller than the map (few columns of many nodes) is
    // stretched sideways up to the map's proportions, so that its edges
    // show when it is seen whole.
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const p of Object.values(m.positions)) { x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]); }
    const el0 = $('#map'), aspect = el0.clientWidth / Math.max(1, el0.clientHeight);
    const stretch = x1 > x0 ? Math.min(30, Math.max(1, ((y1 - y0) * aspect) / (x1 - x0))) : 1;
    // Sigma's y axis points up; the layout's down.
    display.updateEachNodeAttributes((id, a) => {
      const p = m.positions[id];
      if (p) { a.x = p[0] * stretch; a.y = -p[1]; }
      a.size = a.size0;
      return a;
    });
    display.setAttribute('layout', 'layered');
    measureBoxes();
    // The map is opened whole, never larger than zoom 1 (a graph unit a
    // pixel): sigma fits the bounding box of what is drawn (nodes,
    // labels, boxes) to the map, and a box wider than the map at zoom 1
    // keeps it there. Below zoom 1 the dots shrink with the map, as its
    // labels and titles do.
    const bb = { x0: Infinity, x1: -Infinity, y0: Infinity, y1: -Infinity };
    const grow = (x0, x1, y0, y1) => { bb.x0 = Math.min(bb.x0, x0); bb.x1 = Math.max(bb.x1, x1); bb.y0 = Math.min(bb.y0, y0); bb.y1 = Math.max(bb.y1, y1); };
    display.forEachNode((id, a) => { if (a.ext) grow(a.x - a.ext[0], a.x + a.ext[1], a.y - a.ext[2], a.y + a.ext[2]); });
    for (const b of boxes) grow(b.x0, b.x1, b.y0, b.y1);
    renderer.setSetting('stagePadding', 20);
    renderer.setCustomBBox({ x: [bb.x0, bb.x1], y: [bb.y0, bb.y1] });
    renderer.getCamera().setState({ x: 0.5, y: 0.5, ratio: 1, angle: 0 });
    renderer.refresh();
    const fit = unit();
    if (fit > 1) {
      const cx = (bb.x0 + bb.x1) / 2, cy = (bb.y0 + bb.y1) / 2, hw = ((bb.x1 - bb.x0) / 2) * fit, hh = ((bb.y1 - bb.y0) / 2) * fit;
      renderer.setCustomBBox({ x: [cx - hw, cx + hw], y: [cy - hh, cy + hh] });
      renderer.refresh();
    }
    const k = Math.min(1, unit());
    // (A dot stays 1.5 px at least: so small, titles are hidden and
    // labels a few pixels tall.)
    display.updateEachNodeAttributes((id, a) => { a.size = Math.max(a.size0 * k, Math.min(a.size0, 1.5)); return a; }, { attributes: ['size'] });
    renderer.refresh();
    const box = $('#map');
    box.dataset.layoutMs = String(m.ms);
    box.dataset.layoutEngine = m.engine;
    box.dataset.layout = 'layered';
    document.body.dataset.layeredMs = String(Math.round(performance.now()));
  }

  // unit is the pixels a graph unit takes at the camera's zoom.
  const unit = () => {
    const a = renderer.graphToViewport({ x: 0, y: 0 }), b = renderer.graphToViewport({ x: 1000, y: 0 });
    return Math.hypot(b.x - a.x, b.y - a.y) / 1000;
  };
  // drawLabel draws a node's label as sigma does (its defaultDrawNodeLabel),
  // at most 14 px and smaller with the map below zoom 1 on a layered map,
  // so that it stays in the room the layout gave it; drawn records where
  // each label went in the last frame (for the tests).
  let drawn = new Map(), labelScale = 1;
  function drawLabel(ctx, d, settings) {
    if (!d.label) return;
    const size = settings.labelSize * labelScale;
    ctx.fillStyle = (settings.labelColor.attribute && d[settings.labelColor.attribute]) || settings.labelColor.color || '#000';
    ctx.font = settings.labelWeight + ' ' + size + 'px ' + settings.labelFont;
    const x = d.x + d.size + LABEL.gap * labelScale, y = d.y + size / 3;
    ctx.fillText(d.label, x, y);
    const m = ctx.measureText(d.label);
    drawn.set(d.key, { left: x, right: x + m.width, top: y - m.actualBoundingBoxAscent, bottom: y + m.actualBoundingBoxDescent, label: d.label });
  }
  function beforeLabels() {
    drawn = new Map();
    labelScale = display && display.getAttribute('layout') === 'layered' ? Math.min(1, unit()) : 1;
  }

  // position is where the map draws a node (window.deptrace, for tests).
  const position = (id) => (display && display.hasNode(id) ? { x: display.getNodeAttribute(id, 'x'), y: display.getNodeAttribute(id, 'y') } : null);

  // ---- boxes: groups drawn around their nodes -------------------------
  // Each group (namespace, host or Kubernetes namespace) with nodes on the
  // map gets a box around them, in graph coordinates, redrawn in screen
  // coordinates after each frame; its title collapses it. On the layered
  // map a box is GEO's (in graph units: the room the layout left it); on
  // the grouped one (before the layout, or beyond LAYERED nodes) a fixed
  // padding in pixels.
  const MAXBOXES = 200;
  let boxes = [];
  function measureBoxes() {
    const by = new Map();
    const layered = display && display.getAttribute('layout') === 'layered';
    if (display && !state.focus) {
      display.forEachNode((id, a) => {
        if (!a.box || a.kind === 'group') return;
        let b = by.get(a.box);
        if (!b) by.set(a.box, b = { key: a.box, n: 0, lw: 0, x0: Infinity, y0: Infinity, x1: -Infinity, y1: -Infinity });
        b.n++;
        if (layered && a.ext) { // y up: the title on top
          b.x0 = Math.min(b.x0, a.x - a.ext[0]); b.x1 = Math.max(b.x1, a.x + a.ext[1]);
          b.y0 = Math.min(b.y0, a.y - a.ext[2]); b.y1 = Math.max(b.y1, a.y + a.ext[2]);
          return;
        }
        if (a.x >= b.x1) b.lw = (a.label || '').length; // the label right of the rightmost node
        b.x0 = Math.min(b.x0, a.x); b.x1 = Math.max(b.x1, a.x);
        b.y0 = Math.min(b.y0, a.y); b.y1 = Math.max(b.y1, a.y);
      });
    }
    boxes = by.size <= MAXBOXES ? [...by.values()].sort((a, b) => (a.key < b.key ? -1 : 1)) : [];
    const layer = $('#boxes');
    layer.textContent = '';
    for (const b of boxes) {
      b.layered = layered;
      if (layered) { // as the layout worker's rects()
        b.x0 -= GEO.pad; b.y0 -= GEO.pad; b.y1 += GEO.pad + GEO.title;
        b.x1 = Math.max(b.x1 + GEO.pad, b.x0 + (titleWidth.get(titleText(b.key, b.n)) || 0));
      }
      const d = el('div', undefined, 'box');
      d.dataset.group = b.key;
      const t = el('button', titleText(b.key, b.n));
      t.type = 'button';
      t.title = 'Collapse ' + b.key + ' into one node' + (b.key === EXT_SERVERS ? ' (servers without an agent that the map\'s nodes call)' : b.key === EXT_CLIENTS ? ' (clients without an agent that call the map\'s nodes)' : '');
      t.addEventListener('click', () => { collapsed.add(b.key); chooseCollapse(); renderGroups(); renderMap(); });
      d.append(t);
      layer.append(d);
      b.el = d;
      b.title = t;
    }
    $('#map').dataset.boxes = String(boxes.length);
    placeBoxes();
  }
  function placeBoxes() {
    if (!renderer) return;
    const pad = 12, title = 18;
    const u = boxes.length && boxes[0].layered ? unit() : 1;
    for (const b of boxes) {
      const p = renderer.graphToViewport({ x: b.x0, y: b.y1 });
      const q = renderer.graphToViewport({ x: b.x1, y: b.y0 });
      let l = Math.min(p.x, q.x), t = Math.min(p.y, q.y), w = Math.abs(q.x - p.x), h = Math.abs(q.y - p.y);
      if (b.layered) {
        // Below zoom 1 the title shrinks with the box (its room in it is
        // GEO.title units); too small to read, only the outline is left.
        b.title.style.transform = u < 1 ? 'scale(' + u.toFixed(4) + ')' : '';
        b.title.style.maxWidth = Math.max(0, w / Math.min(1, u) - 8).toFixed(1) + 'px';
        b.el.classList.toggle('small', u < 0.5);
      } else {
        // Wide enough for the labels of its rightmost nodes and its title.
        w = Math.max(w + 2 * pad + b.lw * 7 + 6, (b.key.length + 7) * 6.5 + 12);
        l -= pad; t -= pad + title; h += 2 * pad + title;
        // Zoomed out, a box too small for its title keeps only its outline.
        b.el.classList.toggle('small', Math.abs(q.y - p.y) < 8 && boxes.length > 20);
      }
      b.el.style.transform = 'translate(' + l.toFixed(1) + 'px,' + t.toFixed(1) + 'px)';
      b.el.style.width = w.toFixed(1) + 'px';
      b.el.style.height = h.toFixed(1) + 'px';
    }
  }

  function renderMap() {
    const box = $('#map');
    if (renderer) { renderer.kill(); renderer = null; }
    display = buildDisplay();
    const big = display.order > LARGE;
    const layeredView = wantsLayered(display);
    // Every node of a map of up to 250 is labelled (layered, or a focus's
    // neighbourhood): sigma would otherwise leave some dots unnamed.
    const labelAll = !big && display.order <= 250;
    box.dataset.layout = display.getAttribute('layout');
    try {
      renderer = new Sigma(display, box, {
        defaultEdgeType: big ? 'line' : 'arrow', // arrow heads are invisible at that scale
        // In diff mode, the "new" and "gone" badges of edges.
        renderEdgeLabels: diffing() && !big,
        edgeLabelColor: { attribute: 'labelColor', color: '#1d2330' }, edgeLabelSize: 12, edgeLabelWeight: 'bold',
        enableEdgeEvents: display.size <= 20000,
        hideEdgesOnMove: big || display.size > 5000,
        // A layered map labels every node it can: up to 250, all of them.
        labelRenderedSizeThreshold: big ? 10 : labelAll ? 0 : 4,
        labelDensity: big ? 0.05 : labelAll ? 10 : 1,
        labelSize: LABEL.size, labelFont: LABEL.font, labelWeight: LABEL.weight,
        defaultDrawNodeLabel: drawLabel,
        zIndex: true,
        stagePadding: layeredView ? 150 : 50, // room for the labels of the rightmost column
        nodeReducer: (id, a) => reduceNode(id, a),
        edgeReducer: (id, a) => reduceEdge(id, a),
      });
    } catch (err) {
      box.textContent = '';
      box.append(el('p', 'The map needs WebGL, which this browser does not provide (' + err.message + '). The table view lists every edge.', 'error'));
      box.dataset.nodes = box.dataset.edges = '0';
      return;
    }
    renderer.on('enterNode', ({ node }) => { if (!pinned) showNode(node); });
    renderer.on('clickNode', ({ node }) => {
      const a = display.getNodeAttributes(node);
      if (a.kind === 'group') { collapsed.delete(a.group); chooseCollapse(); renderGroups(); renderMap(); return; }
      setFocus(node);
    });
    renderer.on('enterEdge', ({ edge }) => { if (!pinned) showEdge(edge); });
    renderer.on('clickEdge', ({ edge }) => { pinned = true; showEdge(edge); });
    renderer.on('clickStage', () => { pinned = false; });
    renderer.on('beforeRender', beforeLabels);
    renderer.on('afterRender', placeBoxes);
    box.dataset.nodes = String(display.order);
    box.dataset.edges = String(display.size);
    let bad = 0, deg = 0, app = 0, gone = 0;
    display.forEachEdge((k, a) => {
      bad += a.bad ? 1 : 0; deg += !a.bad && a.health === 'degraded' ? 1 : 0;
      app += a.status === 'appeared' ? 1 : 0; gone += a.status === 'disappeared' ? 1 : 0;
    });
    box.dataset.unhealthy = String(bad);
    box.dataset.degraded = String(deg);
    box.dataset.appeared = String(app);
    box.dataset.disappeared = String(gone);
    box.dataset.focus = state.focus;
    measureBoxes();
    requestLayout(display);
  }

  // matchSet: the nodes the search matches; matchGroups: the groups that
  // hold one, whose node a collapsed group lights up in their place.
  let matchSet = new Set(), matchGroups = new Set();
  const matched = (id, a) => matchSet.has(id) || (a.kind === 'group' && matchGroups.has(a.group));
  function reduceNode(id, a) {
    if (!matchSet.size) return a;
    if (matched(id, a)) return Object.assign({}, a, { highlighted: true, forceLabel: true, zIndex: 1 });
    return Object.assign({}, a, { color: '#d9dde3', label: '', zIndex: 0 });
  }
  function reduceEdge(id, a) {
    if (!matchSet.size) return a;
    const [s, t] = display.extremities(id);
    if (matched(s, display.getNodeAttributes(s)) || matched(t, display.getNodeAttributes(t))) return a;
    return Object.assign({}, a, { color: '#eef0f3' });
  }

  // ---- details, focus, matches, groups -------------------------------
  function dl(pairs) {
    const d = el('dl');
    for (const [k, v] of pairs) { d.append(el('dt', k), el('dd', v)); }
    return d;
  }
  function processesOf(e) {
    const f = data.nodes.get(e.from), t = data.nodes.get(e.to);
    const name = (n) => (n ? (n.process || '?') + who(n) : '?');
    return name(f) + ' → ' + name(t);
  }

  // services lists what a workload listens on, with its accept queue.
  function services(n) {
    if (!n.services || !n.services.length) return '—';
    return n.services.map((s) => (s.proto === 'unix' ? 'unix ' + s.addr : s.proto + '/' + s.port) +
      (s.listener ? ' (backlog ' + s.listener.backlog_limit + ', queue max ' + s.listener.queue_max + ', drops ' + s.listener.drops + ')' : '') +
      (s.unanswered ? ' nothing answers' : s.unhealthy ? ' DROPPING' : '')).join(', ');
  }

  // identityPairs are the identity fields a node has (docs/graph.md).
  function identityPairs(n) {
    const pairs = [];
    if (n.workload) pairs.push(['workload', n.workload]);
    if (n.pod_name) pairs.push(['pod', (n.pod_namespace ? n.pod_namespace + '/' : '') + n.pod_name]);
    if (n.k8s_container) pairs.push(['pod container', n.k8s_container]);
    if (n.container_name) pairs.push(['container', n.container_name]);
    if (n.container_image) pairs.push(['image', n.container_image]);
    if (n.container_runtime) pairs.push(['runtime', n.container_runtime]);
    if (n.container_id) pairs.push(['container id', n.container_id.slice(0, 12)]);
    if (n.unit) pairs.push(['unit', n.unit]);
    return pairs;
  }

  // healthText is a state with its reasons: "degraded: 2 of 12 …".
  const healthText = (x) => { const h = healthOf(x); return (x.reasons || []).length && h !== 'ok' ? h + ': ' + x.reasons.join('; ') : h; };

  // showNode fills the details with a node's counters; with history (a
  // click, not a hover), also its history over the range.
  function showNode(id, history) {
    const box = $('#details');
    box.textContent = '';
    const a = display && display.hasNode(id) ? display.getNodeAttributes(id) : null;
    if (a && a.kind === 'group') {
      box.append(el('h3', 'Group ' + a.group), dl([['nodes', num(a.count)], ['click', 'expand the group']]));
      return;
    }
    const n = data.nodes.get(id);
    if (!n) return;
    // Its traffic over the range (in diff mode, edges that disappeared
    // are the window before's: not counted), as its history charts below
    // give it per step from /api/series?node=: to it, the edges it
    // serves, as their clients counted; from it, the edges it is the
    // client of.
    const now = (e) => e.status !== 'disappeared';
    const ins = (data.inn.get(id) || []).filter(now), outs = (data.out.get(id) || []).filter(now);
    let first = '', last = '';
    for (const e of [...ins, ...outs]) {
      if (e.first_seen && !e.first_seen.startsWith('0001-') && (!first || e.first_seen < first)) first = e.first_seen;
      if (e.last_seen && e.last_seen > last) last = e.last_seen;
    }
    box.append(el('h3', label(n)), dl([
      ['kind', n.kind], ['host', n.host || '—'], ['address', n.addr || '—'],
      ...(n.kind === 'workload' || n.kind === 'host' ? [['listens', services(n)]] : [['port', n.port ? n.proto + '/' + n.port : '—']]),
      ['process', n.process || '—'],
      ...(n.remote_name ? [['DNS name', n.remote_name]] : []),
      ...identityPairs(n),
      ['health', healthText(n)],
      ['first seen', when(first)], ['last seen', when(last)],
    ]));
    box.append(trafficBlock('to', 'Traffic to it (as its clients counted)', ins, 'sent to it', 'received from it'),
      trafficBlock('from', 'Traffic from it (as it counted)', outs, 'sent', 'received'));
    if (n.dns && n.dns.length) box.append(dnsTable(n.dns));
    if (history) nodeHistory(n, box);
    else historyFor = '';
  }

  // sumEdges adds up edges' counters as a whole: counters summed, the
  // maxima as the largest, RTT's minimum as the smallest measured.
  function sumEdges(es) {
    const t = { edges: es.length, unhealthy: 0, degraded: 0, rtt_min_us: 0 };
    for (const e of es) {
      for (const [k, v] of Object.entries(e)) {
        if (typeof v !== 'number' || k === 'port' || k.endsWith('_avg_us') || k === 'rtt_min_us') continue;
        t[k] = k.endsWith('_max_us') ? Math.max(t[k] || 0, v) : (t[k] || 0) + v;
      }
      if (e.rtt_samples && e.rtt_min_us && (!t.rtt_min_us || e.rtt_min_us < t.rtt_min_us)) t.rtt_min_us = e.rtt_min_us;
      if (e.health === 'unhealthy') t.unhealthy++; else if (e.health === 'degraded') t.degraded++;
    }
    return t;
  }
  // trafficPairs are edges' traffic in words: connections with their
  // failures by cause, datagrams, bytes both ways, connect latency and
  // RTT (averages of the sums over the counts), resets, retransmissions.
  function trafficPairs(t, sent, received) {
    const pairs = [['edges', num(t.edges) + (t.unhealthy ? ', ' + num(t.unhealthy) + ' unhealthy' : '') + (t.degraded ? ', ' + num(t.degraded) + ' degraded' : '')]];
    const dg = (t.datagrams_sent || 0) + (t.datagrams_received || 0);
    if (t.connections || t.failed_connections || !dg) pairs.push(['connections', num(t.connections)]);
    if (t.failed_connections) {
      const why = CAUSES.filter(([k]) => t[k]).map(([k, name]) => num(t[k]) + ' ' + name);
      pairs.push(['failed connections', num(t.failed_connections) + (why.length ? ' (' + why.join(', ') + ')' : '')]);
    }
    if (dg) pairs.push(['datagrams', num(t.datagrams_sent) + ' sent, ' + num(t.datagrams_received) + ' received']);
    pairs.push(['bytes', bytes(t.bytes_sent) + ' ' + sent + ', ' + bytes(t.bytes_received) + ' ' + received]);
    if (t.connect_latency_count) {
      pairs.push(['connect latency', us(t.connect_latency_sum_us / t.connect_latency_count) + ' average, ' + us(t.connect_latency_max_us) + ' max (' + num(t.connect_latency_count) + ' connects)']);
    }
    if (t.rtt_samples) {
      pairs.push(['RTT', us(t.rtt_sum_us / t.rtt_samples) + ' average, ' + us(t.rtt_min_us) + ' to ' + us(t.rtt_max_us) + ' (' + num(t.rtt_samples) + ' samples)']);
    }
    if (t.resets_sent || t.resets_received) pairs.push(['resets', num(t.resets_sent) + ' sent, ' + num(t.resets_received) + ' received']);
    if (t.retransmits) pairs.push(['retransmitted segments', num(t.retransmits)]);
    return pairs;
  }
  function trafficBlock(which, title, es, sent, received) {
    const d = el('section', undefined, 'traffic');
    d.dataset.traffic = which;
    d.append(el('h4', title));
    if (!es.length) d.append(el('p', 'none in this range'));
    else d.append(dl(trafficPairs(sumEdges(es), sent, received)));
    return d;
  }

  // dnsTable lists a client's lookups per resolver (docs/graph.md, "DNS
  // per client"): queries, failures by rcode, timeouts, latency, health.
  function dnsTable(dns) {
    const t = el('table', '', 'dns');
    t.dataset.dns = String(dns.length);
    const head = el('tr');
    for (const c of ['resolver', 'queries', 'NXDOMAIN', 'SERVFAIL', 'other', 'timeouts', 'latency avg/max', 'health']) head.append(el('th', c));
    t.append(el('caption', 'DNS lookups per resolver'), head);
    for (const d of dns) {
      const tr = el('tr');
      const h = healthOf(d);
      tr.className = h === 'unhealthy' ? 'unhealthy' : h === 'degraded' ? 'degraded' : '';
      tr.dataset.resolver = d.resolver + '/' + d.proto;
      const lat = d.latency_count ? us(d.latency_avg_us || d.latency_sum_us / d.latency_count) + ' / ' + us(d.latency_max_us) : '—';
      for (const v of [d.resolver + '/' + d.proto, num(d.queries), num(d.nxdomain || 0), num(d.servfail || 0), num(d.other_errors || 0),
        num(d.timeouts || 0), lat, healthText(d) + (d.unparsed ? ' (' + num(d.unparsed) + ' unparsed)' : '')]) tr.append(el('td', v));
      t.append(tr);
    }
    return t;
  }

  function showEdge(key) {
    const box = $('#details');
    box.textContent = '';
    const keys = display.getEdgeAttribute(key, 'keys');
    for (const k of keys.slice(0, 20)) {
      const e = data.byKey.get(k);
      if (!e) continue;
      box.append(el('h3', label(data.nodes.get(e.from)) + ' → ' + label(data.nodes.get(e.to))), dl([
        ['protocol', e.proto + '/' + e.port], ['processes', processesOf(e)],
        ['health', healthText(e)], ...(diffing() ? [['change', e.status === 'same' ? 'in both windows' : e.status === 'appeared' ? 'appeared (not in the window before)' : 'disappeared (only in the window before)']] : []),
        ['first seen', when(e.first_seen)], ['last seen', when(e.last_seen)],
        ...trafficPairs(sumEdges([e]), 'sent', 'received').slice(1),
      ]));
    }
    if (keys.length > 20) box.append(el('p', '… and ' + (keys.length - 20) + ' more edges in this group'));
    const first = data.byKey.get(keys[0]);
    if (pinned && first && first.status !== 'disappeared') edgeHistory(first, box); // on click, not on hover
    else historyFor = '';
  }

  // ---- history charts ------------------------------------------------
  // Small charts of a series from /api/series, drawn by uPlot (vendored,
  // ../vendor/README.md): one bar (or one point of a line) per step.
  // The chart's element has data-chart (what it shows), data-points (the
  // number of steps, read back from uPlot's data), its uPlot instance as
  // .uplot, and an aria-label with its totals; hovering a step shows its
  // time and values in the legend under it.
  const CHART_W = 280, CHART_H = 100;
  // chart: series [{name, color, get(pt)}]; kind 'bars' stacks them, 'lines'
  // draws each as a line. Returns [heading, chart element, totals].
  function chart(id, title, pts, series, kind, fmt, unit) {
    fmt = fmt || num;
    const bars = kind === 'bars';
    const vals = pts.map((pt) => series.map((sr) => sr.get(pt) || 0));
    const totals = series.map(() => 0);
    for (const v of vals) v.forEach((x, j) => { totals[j] = bars ? totals[j] + x : Math.max(totals[j], x); });
    const xs = pts.map((pt) => Date.parse(pt.t) / 1000);
    // Stacked bars: series j is drawn as the sum of it and those after it,
    // first to last, so each shows its own share on top of the next.
    const ys = series.map((sr, j) => vals.map((v) => (bars ? v.slice(j).reduce((a, b) => a + b, 0) : v[j])));
    const step = xs.length > 1 ? xs[1] - xs[0] : 60;
    const div = el('div', '', 'history-chart');
    div.dataset.chart = id;
    div.setAttribute('role', 'img');
    const axis = { font: '10px sans-serif', stroke: '#555', grid: { stroke: '#e3e6eb', width: 1 }, ticks: { show: false } };
    const u = new uPlot({
      width: CHART_W, height: CHART_H,
      cursor: { points: { show: false }, drag: { x: false, y: false } },
      scales: {
        x: { time: true, range: (_, mn, mx) => [mn - step / 2, mx + step / 2] },
        y: { range: (_, mn, mx) => [0, mx > 0 ? mx : 1] },
      },
      // Times as hh:mm; the value axis marks 0 and the top only.
      axes: [Object.assign({ size: 20, values: (_, vs) => vs.map((v) => new Date(v * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })) }, axis),
        Object.assign({ size: 46, splits: (u) => [0, u.scales.y.max], values: (_, vs) => vs.map((v) => fmt(v)) }, axis)],
      series: [{ value: (_, v) => (v == null ? '' : new Date(v * 1000).toLocaleTimeString()) },
        ...series.map((sr, j) => ({
          label: sr.name, stroke: sr.color, fill: bars ? sr.color : undefined, width: bars ? 0 : 1.5,
          paths: bars ? uPlot.paths.bars({ size: [0.85, Infinity], gap: 1 }) : undefined,
          points: { show: false },
          value: (u, v, si, i) => (i == null ? '' : fmt(vals[i][j]) + (unit || '')),
          show: bars || totals[j] > 0,
        }))],
    }, [xs, ...ys], div);
    div.uplot = u;
    div.dataset.points = String(u.data[0].length);
    div.setAttribute('aria-label', title + ': ' + series.map((sr, j) => sr.name + ' ' + (bars ? fmt(totals[j]) + (unit || '') + ' in all' : 'max ' + fmt(totals[j]) + (unit || ''))).join(', '));
    return [el('h4', title), div, totals];
  }
  const CAUSES = [['failed_refused', 'refused', '#e03131'], ['failed_timeout', 'timed out', '#f08c00'], ['failed_reset', 'reset', '#ae3ec9'], ['failed_unreachable', 'unreachable', '#5c7cfa']];
  // causes are the failure series of a point's counters: each known cause,
  // and what the failed count has beyond them (an agent that did not say).
  const causes = (c) => [...CAUSES.map(([k, name, color]) => ({ name, color, get: (pt) => c(pt)[k] })),
    { name: 'other', color: '#868e96', get: (pt) => Math.max(0, (c(pt).failed_connections || 0) - CAUSES.reduce((a, [k]) => a + (c(pt)[k] || 0), 0)) }];
  const us = (v) => (v >= 1000 ? (v / 1000).toFixed(v >= 10000 ? 0 : 1) + ' ms' : Math.round(v) + ' µs');

  // seriesParams are /api/series's range and grouping for the page's state.
  function seriesParams(p) {
    Object.assign(p, rangeParams());
    if (state.by !== 'workload') p.group_by = state.by;
    if (!p.since) p.since = '24h'; // all history: the last day, per step
    return new URLSearchParams(Object.entries(p).filter(([, v]) => v)).toString();
  }

  // edgeHistory draws an edge's counters over the range, per step, from
  // /api/series: connections (datagrams for UDP) as bars, failed
  // connections in red over them; then failures by cause, connect
  // latency and bytes.
  let historyFor = '';
  async function edgeHistory(e, box) {
    const want = 'edge ' + e.key + '|' + JSON.stringify(rangeParams()) + state.by;
    historyFor = want;
    const holder = el('div', 'loading history…', 'history');
    box.append(holder);
    let ans;
    try {
      ans = await getJSON('/api/series?' + seriesParams({ from: e.from, to: e.to, proto: e.proto, port: String(e.port) }));
    } catch (err) {
      holder.textContent = 'history: ' + err.message;
      return;
    }
    if (historyFor !== want) return;
    const udp = e.proto === 'udp';
    const per = ans.step_seconds / 60 + ' min';
    const pts = ans.points;
    const vol = (pt) => (udp ? (pt.datagrams_sent || 0) + (pt.datagrams_received || 0) : pt.connections || 0);
    const [h, vc, t] = chart('volume', 'History: ' + (udp ? 'datagrams' : 'connections') + ' per ' + per, pts, [
      { name: udp ? 'datagrams' : 'connections', color: '#3366cc', get: vol },
      { name: 'failed', color: '#e03131', get: (pt) => pt.failed_connections },
    ], 'bars');
    // The first chart's label reads as before: "connections per 2 min: 5 in all, 3 failed".
    vc.setAttribute('aria-label', (udp ? 'datagrams' : 'connections') + ' per ' + per + ': ' + num(t[0]) + ' in all, ' + num(t[1]) + ' failed');
    holder.textContent = '';
    holder.append(h, vc);
    if (!udp) {
      if (t[1]) holder.append(...chart('failures', 'Failed connections by cause', pts, causes((pt) => pt), 'bars').slice(0, 2));
      holder.append(...chart('latency', 'Connect latency', pts, [
        { name: 'avg', color: '#3366cc', get: (pt) => pt.connect_latency_avg_us },
        { name: 'max', color: '#f08c00', get: (pt) => pt.connect_latency_max_us },
      ], 'lines', us).slice(0, 2));
      // Smoothed RTT, when the agent measured it (docs/flows.md).
      if (pts.some((pt) => pt.rtt_samples)) {
        holder.append(...chart('rtt', 'RTT', pts, [
          { name: 'avg', color: '#3366cc', get: (pt) => (pt.rtt_samples ? pt.rtt_sum_us / pt.rtt_samples : 0) },
          { name: 'max', color: '#f08c00', get: (pt) => pt.rtt_max_us },
        ], 'lines', us).slice(0, 2));
      }
    }
    holder.append(...chart('bytes', 'Bytes per ' + per, pts, [
      { name: 'sent', color: '#1098ad', get: (pt) => pt.bytes_sent },
      { name: 'received', color: '#74b816', get: (pt) => pt.bytes_received },
    ], 'bars', bytes).slice(0, 2));
    const bad = pts.filter((pt) => pt.health === 'unhealthy').length, deg = pts.filter((pt) => pt.health === 'degraded').length;
    if (bad || deg) holder.append(el('p', (bad ? bad + ' steps unhealthy' : '') + (bad && deg ? ', ' : '') + (deg ? deg + ' degraded' : ''), bad ? 'bad' : 'warn'));
  }

  // nodeHistory draws a node's traffic over the range from
  // /api/series?node=: connections per second in (it serves) and out (it
  // is the client), failures by cause, connect latency and bytes; and its
  // DNS lookups by outcome and their latency, when it made any.
  async function nodeHistory(n, box) {
    if (n.kind === 'group') return;
    const want = 'node ' + n.id + '|' + JSON.stringify(rangeParams()) + state.by;
    historyFor = want;
    const holder = el('div', 'loading history…', 'history');
    holder.dataset.node = n.id;
    box.append(holder);
    let ans;
    try {
      ans = await getJSON('/api/series?' + seriesParams({ node: n.id }));
    } catch (err) {
      holder.textContent = 'history: ' + err.message;
      return;
    }
    if (historyFor !== want) return;
    const pts = ans.points, step = ans.step_seconds;
    const rate = (v) => (v || 0) / step;
    const r2 = (v) => (v >= 10 ? Math.round(v).toLocaleString('en') : v.toFixed(v >= 1 ? 1 : 2));
    const both = (pt) => { const o = {}; for (const k of ['failed_connections', ...CAUSES.map((c) => c[0])]) o[k] = (pt.in[k] || 0) + (pt.out[k] || 0); return o; };
    holder.textContent = '';
    holder.append(...chart('connections', 'Connections/s (' + step / 60 + '-min steps)', pts, [
      { name: 'in', color: '#3366cc', get: (pt) => rate(pt.in.connections) },
      { name: 'out', color: '#1098ad', get: (pt) => rate(pt.out.connections) },
    ], 'lines', r2).slice(0, 2));
    const [fh, fc, ft] = chart('failures', 'Failed connections by cause (in and out)', pts, causes(both), 'bars');
    if (ft.some((x) => x)) holder.append(fh, fc);
    else holder.append(el('h4', 'No failed connections'));
    holder.append(...chart('latency', 'Connect latency', pts, [
      { name: 'avg in', color: '#3366cc', get: (pt) => pt.in.connect_latency_avg_us },
      { name: 'max in', color: '#f08c00', get: (pt) => pt.in.connect_latency_max_us },
      { name: 'avg out', color: '#1098ad', get: (pt) => pt.out.connect_latency_avg_us },
    ], 'lines', us).slice(0, 2));
    // Edge counters are the client's view: what reaches a node is what
    // its clients sent and what it received as a client.
    holder.append(...chart('bytes', 'Bytes per ' + step / 60 + ' min', pts, [
      { name: 'to it', color: '#74b816', get: (pt) => (pt.in.bytes_sent || 0) + (pt.out.bytes_received || 0) },
      { name: 'from it', color: '#1098ad', get: (pt) => (pt.in.bytes_received || 0) + (pt.out.bytes_sent || 0) },
    ], 'bars', bytes).slice(0, 2));
    // Its DNS lookups, when it made any in the range (points without
    // lookups have no dns): answers by code and timeouts, stacked, then
    // the answers' latency.
    if (pts.some((pt) => pt.dns)) {
      const d = (k) => (pt) => (pt.dns ? pt.dns[k] || 0 : 0);
      holder.append(...chart('dns', 'DNS lookups per ' + step / 60 + ' min', pts, [
        { name: 'NOERROR', color: '#3366cc', get: d('noerror') },
        { name: 'NXDOMAIN', color: '#ae3ec9', get: d('nxdomain') },
        { name: 'SERVFAIL', color: '#e03131', get: d('servfail') },
        { name: 'other', color: '#868e96', get: d('other_errors') },
        { name: 'timed out', color: '#f08c00', get: d('timeouts') },
      ], 'bars').slice(0, 2));
      holder.append(...chart('dns-latency', 'DNS answer latency', pts, [
        { name: 'avg', color: '#3366cc', get: d('latency_avg_us') },
        { name: 'max', color: '#f08c00', get: d('latency_max_us') },
      ], 'lines', us).slice(0, 2));
      const bad = pts.filter((pt) => pt.dns && pt.dns.health === 'unhealthy').length, deg = pts.filter((pt) => pt.dns && pt.dns.health === 'degraded').length;
      if (bad || deg) holder.append(el('p', 'DNS: ' + (bad ? bad + ' steps unhealthy' : '') + (bad && deg ? ', ' : '') + (deg ? deg + ' degraded' : ''), bad ? 'bad' : 'warn'));
    }
  }

  // volume is an edge's traffic in words: connections, datagrams (UDP,
  // unix datagram sockets), or both when it has both.
  function volume(e) {
    const dg = (e.datagrams_sent || 0) + (e.datagrams_received || 0), parts = [];
    if (e.connections || e.failed_connections || !dg) parts.push(num(e.connections) + (e.connections === 1 ? ' connection' : ' connections'));
    if (dg) parts.push(num(dg) + (dg === 1 ? ' datagram' : ' datagrams'));
    return parts.join(', ');
  }

  function edgeItem(e, peer) {
    const li = el('li');
    const b = el('button', label(data.nodes.get(peer)), 'link');
    b.type = 'button';
    b.addEventListener('click', () => setFocus(peer));
    li.append(b, el('span', ' ' + (e.proto === 'unix' ? 'unix' : e.proto + '/' + e.port) + ' · ' + volume(e) + (e.health !== 'ok' ? ' · ' + e.health : '') + (diffing() && e.status !== 'same' ? ' · ' + e.status : ''), e.bad ? 'bad' : e.health === 'degraded' ? 'warn' : ''));
    return li;
  }

  function renderFocus() {
    const panel = $('#focus-panel');
    panel.hidden = !state.focus;
    if (!state.focus) return;
    const n = data.nodes.get(state.focus);
    $('#focus-name').textContent = label(n);
    const ids = [state.focus, ...(data.linked.get(state.focus) || [])];
    const deps = $('#deps'), dependents = $('#dependents');
    deps.textContent = dependents.textContent = '';
    for (const id of ids) {
      for (const e of data.out.get(id) || []) deps.append(edgeItem(e, e.to));
      for (const e of data.inn.get(id) || []) dependents.append(edgeItem(e, e.from));
    }
    if (!deps.children.length) deps.append(el('li', '(none)'));
    if (!dependents.children.length) dependents.append(el('li', '(none)'));
  }

  function renderMatches() {
    const ids = matches();
    matchSet = new Set(ids);
    matchGroups = new Set(ids.map((id) => groupOf(data.nodes.get(id))));
    $('#map').dataset.matches = String(ids.length);
    const panel = $('#matches-panel');
    panel.hidden = !state.q;
    const ul = $('#matches');
    ul.textContent = '';
    for (const id of ids.slice(0, 50)) {
      const li = el('li');
      const b = el('button', label(data.nodes.get(id)), 'link');
      b.type = 'button';
      b.addEventListener('click', () => setFocus(id));
      li.append(b);
      ul.append(li);
    }
    if (!ids.length && state.q) ul.append(el('li', 'no node matches “' + state.q + '”'));
    if (ids.length > 50) ul.append(el('li', '… ' + (ids.length - 50) + ' more'));
    if (renderer) renderer.refresh();
  }

  function renderGroups() {
    const groups = new Map();
    for (const n of data.nodes.values()) {
      const k = groupOf(n);
      groups.set(k, (groups.get(k) || 0) + 1);
    }
    const ul = $('#groups');
    ul.textContent = '';
    groups.delete(''); // nodes in no box (Kubernetes namespace: not in a pod)
    const keys = [...groups.keys()].sort();
    const q = state.q.toLowerCase();
    const shown = keys.filter((k) => !q || k.toLowerCase().includes(q)).slice(0, 300);
    for (const k of shown) {
      const li = el('li');
      const b = el('button', collapsed.has(k) ? 'Expand' : 'Collapse');
      b.type = 'button';
      b.setAttribute('aria-label', (collapsed.has(k) ? 'Expand ' : 'Collapse ') + k);
      b.addEventListener('click', () => {
        if (collapsed.has(k)) collapsed.delete(k); else collapsed.add(k);
        chooseCollapse();
        renderGroups();
        if (state.view === 'map') renderMap();
      });
      li.append(el('span', k + ' (' + groups.get(k) + ')'), b);
      ul.append(li);
    }
    if (keys.length > shown.length) ul.append(el('li', (keys.length - shown.length) + ' more groups: search to find one'));
  }

  // setFocus focuses on a node ('' clears the focus), a step Back undoes.
  function setFocus(id) {
    state.focus = id || '';
    pinned = false;
    $('#groups-panel').hidden = state.view !== 'map' || !!state.focus;
    writeURL(true);
    renderFocus();
    if (state.view === 'map') renderMap();
    if (id) { showNode(id, true); pinned = true; } // its history stays until a click elsewhere
  }

  // ---- table ---------------------------------------------------------
  const COLUMNS = [
    { key: 'change', label: 'Change', get: (e) => e.status, diffOnly: true },
    { key: 'client', label: 'Client', get: (e) => label(data.nodes.get(e.from)) },
    { key: 'server', label: 'Server address:port', get: (e) => serverEndpoint(data.nodes.get(e.to), e) },
    { key: 'processes', label: 'Processes (client → server)', get: processesOf },
    { key: 'proto', label: 'Proto', get: (e) => e.proto },
    { key: 'connections', label: 'Connections', get: (e) => e.connections || 0, num: true },
    { key: 'datagrams', label: 'Datagrams', get: (e) => (e.datagrams_sent || 0) + (e.datagrams_received || 0), num: true },
    { key: 'failed_connections', label: 'Failed', get: (e) => e.failed_connections || 0, num: true },
    { key: 'bytes_sent', label: 'Sent', get: (e) => e.bytes_sent || 0, num: true, fmt: bytes },
    { key: 'bytes_received', label: 'Received', get: (e) => e.bytes_received || 0, num: true, fmt: bytes },
    // The state with its reasons, as the details show it: what the search
    // finds; sorted worst first, then by reason.
    { key: 'health', label: 'Health', get: (e) => healthText(e), sortBy: (e) => (2 - RANK[e.health]) + healthText(e), first: 'asc' },
    { key: 'first_seen', label: 'First seen', get: (e) => e.first_seen || '', fmt: when },
    { key: 'last_seen', label: 'Last seen', get: (e) => e.last_seen || '', fmt: when },
  ];
  function serverEndpoint(n, e) {
    if (!n) return '?';
    if (n.kind === 'workload' || n.kind === 'host') {
      if (e.proto === 'unix') return 'unix ' + (e.addrs && e.addrs.length ? e.addrs.join(', ') + ' ' : '') + 'on ' + n.host;
      return endpoint(n.addr || n.host || '?', e.port) + ' on ' + n.host;
    }
    if (n.kind === 'external' && !n.port) return label(n); // a fold: 'tcp _other (external)'
    const where = endpoint(n.addr || n.host || '?', n.port);
    return n.kind === 'service' ? where + ' on ' + n.host : where;
  }
  function rowText(e, cols) {
    if (e.text === undefined) e.text = cols.map((c) => (c.fmt ? c.fmt(c.get(e)) : c.get(e))).join(' ').toLowerCase();
    return e.text;
  }
  const columns = () => COLUMNS.filter((c) => !c.diffOnly || (state.diff && data && data.diff));

  function renderTable() {
    const cols = columns();
    if (!cols.some((c) => c.key === state.sort)) state.sort = 'client';
    const head = $('#edges thead tr');
    head.textContent = '';
    for (const c of cols) {
      const th = el('th');
      th.scope = 'col';
      th.setAttribute('aria-sort', c.key === state.sort ? (state.dir === 'asc' ? 'ascending' : 'descending') : 'none');
      const b = el('button', c.label + (c.key === state.sort ? (state.dir === 'asc' ? ' ▲' : ' ▼') : ''));
      b.type = 'button';
      b.dataset.sort = c.key;
      b.addEventListener('click', () => {
        if (state.sort === c.key) state.dir = state.dir === 'asc' ? 'desc' : 'asc';
        else { state.sort = c.key; state.dir = c.first || (c.num ? 'desc' : 'asc'); }
        writeURL();
        renderTable();
      });
      th.append(b);
      head.append(th);
    }
    // Only the sort column is computed for every edge, and the row text
    // only while searching: 50,000 edges sort in a blink.
    const q = state.q.trim().toLowerCase();
    let rows = data.edges;
    if (state.unhealthy) rows = rows.filter((e) => e.bad);
    if (q) rows = rows.filter((e) => rowText(e, cols).includes(q));
    if (state.focus) {
      const near = neighbourhood(state.focus, Number(state.depth));
      rows = rows.filter((e) => near.has(e.from) && near.has(e.to));
    }
    const sc = cols.find((c) => c.key === state.sort);
    const sign = state.dir === 'asc' ? 1 : -1;
    const keyed = rows.map((e) => [(sc.sortBy || sc.get)(e), e]);
    keyed.sort((a, b) => (a[0] < b[0] ? -sign : a[0] > b[0] ? sign : 0));
    rows = keyed.map((k) => ({ e: k[1] }));
    const body = $('#edges tbody');
    body.textContent = '';
    const frag = document.createDocumentFragment();
    for (const r of rows.slice(0, state.rows)) {
      r.v = cols.map((c) => c.get(r.e));
      const tr = el('tr');
      tr.className = (r.e.bad ? 'unhealthy ' : r.e.health === 'degraded' ? 'degraded ' : '') + (r.e.status !== 'same' ? r.e.status : '');
      cols.forEach((c, i) => {
        const td = el('td', c.fmt ? c.fmt(r.v[i]) : c.num ? num(r.v[i]) : String(r.v[i]), (c.num ? 'num ' : '') + c.key);
        tr.append(td);
      });
      frag.append(tr);
    }
    body.append(frag);
    const shown = Math.min(rows.length, state.rows);
    $('#edges').dataset.rows = String(rows.length);
    $('#edges').dataset.shown = String(shown);
    $('#table-count').textContent = data.edges.length ? 'showing ' + num(shown) + ' of ' + num(rows.length) + ' edges'
      : 'no edges in this range yet: agents (deptrace agent) write them to the store; try a longer range';
    $('#more').hidden = $('#all-rows').hidden = shown >= rows.length;
  }

  // ---- wiring --------------------------------------------------------
  function render(push) {
    $('#view-map').setAttribute('aria-pressed', String(state.view === 'map'));
    $('#view-table').setAttribute('aria-pressed', String(state.view === 'table'));
    $('#map-view').hidden = state.view !== 'map';
    $('#table-view').hidden = state.view !== 'table';
    $('#groups-panel').hidden = state.view !== 'map' || !!state.focus;
    document.body.dataset.view = state.view;
    writeURL(push);
    if (!data) return;
    setStatus(statusLine());
    // The legend names what is drawn: in diff mode, the badges too.
    $('#legend').classList.toggle('diff', diffing());
    // An empty range says so, and what to do about it.
    const empty = data.nodes.size === 0;
    $('#empty').hidden = !empty;
    if (empty) {
      $('#empty').textContent = 'No dependencies in this range' + (state.range === 'all' ? '' : ' (' + rangeName() + ')') + ' yet. ' +
        'The store fills as agents write to it: run `deptrace agent` (as root) on the hosts to trace, with the --store this server reads, ' +
        'and wait a minute for their first write (`deptrace doctor` says whether an agent can reach the store), ' +
        (state.range === 'all' ? 'then reload.' : 'or choose a longer range (all history).');
    }
    renderFocus();
    renderMatches();
    if (state.view === 'map') {
      renderGroups();
      renderMap();
    } else {
      if (renderer) { renderer.kill(); renderer = null; }
      layoutGen++; // a layout still running is for a map no longer shown
      boxes = [];
      $('#boxes').textContent = '';
      renderTable();
    }
    // Ready once a frame has been painted with the data (sigma draws in
    // an animation frame): what the tests wait for and the benchmark
    // reports, in milliseconds since navigation started.
    requestAnimationFrame(() => requestAnimationFrame(() => {
      document.body.dataset.readyMs = String(Math.round(performance.now()));
      document.body.dataset.state = 'ready';
    }));
  }

  const rangeName = () => (state.range === 'custom' ? 'custom' : state.range === 'all' ? 'all history' : 'the last ' + state.range.replace(/(\d+)/, '$1 '));

  function syncControls() {
    $('#range').value = state.range;
    $('#custom').hidden = state.range !== 'custom';
    $('#since').value = localInput(state.since);
    $('#until').value = localInput(state.until);
    $('#diff').checked = state.diff;
    $('#search').value = state.q;
    $('#weight').value = state.weight;
    $('#group').value = state.group;
    $('#by').value = state.by;
    $('#depth').value = state.depth;
    $('#only-unhealthy').checked = state.unhealthy;
  }

  function wire() {
    // Navigations a user may want to go back from (the view, the range,
    // the grouping, a focus) add a history entry; popstate restores it.
    $('#view-map').addEventListener('click', () => { if (state.view !== 'map') { state.view = 'map'; render(true); } });
    $('#view-table').addEventListener('click', () => { if (state.view !== 'table') { state.view = 'table'; state.rows = PAGE; render(true); } });
    $('#range').addEventListener('change', (ev) => {
      state.range = ev.target.value;
      $('#custom').hidden = state.range !== 'custom';
      if (state.range !== 'custom') { state.since = state.until = ''; writeURL(true); load(); }
    });
    // The inputs are the browser's local time: sent with its offset.
    $('#apply-custom').addEventListener('click', () => {
      const since = $('#since').value, until = $('#until').value;
      if (!since && !until) { setStatus('custom range: give a start (from), an end (to), or both'); return; }
      if (since && until && new Date(since) >= new Date(until)) { setStatus('custom range: from must be before to'); return; }
      state.since = since ? absTime(since) : '';
      state.until = until ? absTime(until) : '';
      writeURL(true);
      load();
    });
    $('#diff').addEventListener('change', (ev) => { state.diff = ev.target.checked; writeURL(); load(); });
    let typing = 0;
    $('#search').addEventListener('input', (ev) => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        state.q = ev.target.value;
        state.rows = PAGE;
        writeURL();
        renderMatches();
        if (state.view === 'table') renderTable(); else renderGroups();
      }, 150);
    });
    $('#search').addEventListener('keydown', (ev) => {
      if (ev.key !== 'Enter') return;
      state.q = ev.target.value;
      const ids = matches();
      renderMatches();
      if (ids.length) setFocus(ids[0]);
    });
    $('#weight').addEventListener('change', (ev) => { state.weight = ev.target.value; writeURL(); if (state.view === 'map') renderMap(); });
    $('#group').addEventListener('change', (ev) => {
      state.group = ev.target.value;
      collapseChosen = false;
      openCollapsed();
      render(true);
    });
    $('#by').addEventListener('change', (ev) => { state.by = ev.target.value; state.focus = ''; writeURL(true); load(); });
    $('#depth').addEventListener('change', (ev) => { state.depth = ev.target.value; writeURL(); render(); });
    $('#clear-focus').addEventListener('click', () => { setFocus(''); render(); });
    $('#collapse-all').addEventListener('click', () => {
      for (const n of data.nodes.values()) if (groupOf(n)) collapsed.add(groupOf(n));
      chooseCollapse();
      renderGroups();
      renderMap();
    });
    $('#expand-all').addEventListener('click', () => { collapsed.clear(); chooseCollapse(); renderGroups(); renderMap(); });
    $('#only-unhealthy').addEventListener('change', (ev) => { state.unhealthy = ev.target.checked; writeURL(); renderTable(); });
    $('#more').addEventListener('click', () => { state.rows += PAGE; renderTable(); });
    // Esc clears the focus (in the search box, once its text is gone).
    document.addEventListener('keydown', (ev) => {
      if (ev.key !== 'Escape' || !state.focus || ev.defaultPrevented) return;
      if (ev.target && ev.target.id === 'search' && ev.target.value) return;
      setFocus('');
      render();
    });
    // Back and Forward: the state of the entry, loading again only when
    // what the data depends on (range, node kind, diff) changed.
    window.addEventListener('popstate', () => {
      const group = state.group;
      readURL();
      syncControls();
      pinned = false;
      $('#details').textContent = 'Hover or click a node or an edge.';
      if (!data || loadKey() !== loadedKey) { load(); return; }
      if (urlNotes.length) { baseStatus += urlNotes.map((x) => ' · ' + x).join(''); urlNotes = []; }
      if (state.focus && !data.nodes.has(state.focus)) state.focus = '';
      if (state.group !== group) openCollapsed();
      render();
      if (state.focus) { showNode(state.focus, true); pinned = true; }
    });
    $('#all-rows').addEventListener('click', () => { state.rows = Infinity; renderTable(); });
  }

  readURL();
  syncControls();
  wire();
  render();
  load();
  window.deptrace = {
    state, get data() { return data; }, get display() { return display; }, neighbourhood, position,
    clickEdge: (k) => { pinned = true; showEdge(k); },
    clickNode: (id) => setFocus(id),
    // labelled lists the nodes whose label sigma drew in the last frame.
    labelled: () => (renderer ? [...renderer.displayedNodeLabels] : []),
    // labels are the rectangles (viewport pixels) of the labels drawn in
    // the last frame, as measured on the canvas that drew them.
    labels: () => [...drawn.entries()].map(([id, r]) => Object.assign({ id }, r)),
  };
})();
