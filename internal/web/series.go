package web

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// Series bounds: a series has at most maxPoints points, each a whole
// number of minutes (the store's finest buckets).
const (
	defaultPoints = 30
	maxPoints     = 120
)

// seriesPoint is one step of an edge's history: its counters summed over
// [t, t+step).
type seriesPoint struct {
	T time.Time `json:"t"`
	tracer.Counters
	ConnectLatencyAvgUs uint64 `json:"connect_latency_avg_us"`
	Unhealthy           bool   `json:"unhealthy"`
	// Health is the step's state by the server's thresholds: ok,
	// degraded or unhealthy.
	Health string `json:"health"`
}

type seriesAnswer struct {
	From   string        `json:"from"`
	To     string        `json:"to"`
	Proto  string        `json:"proto"`
	Port   int           `json:"port"`
	Since  time.Time     `json:"since"`
	Until  time.Time     `json:"until"`
	StepS  int64         `json:"step_seconds"`
	Points []seriesPoint `json:"points"`
}

// nodeTraffic is a node's connections one way in one step: the sums of
// its edges' counters (client's point of view, as on the edges).
type nodeTraffic struct {
	tracer.Counters
	ConnectLatencyAvgUs uint64 `json:"connect_latency_avg_us"`
	// Edges is how many edges had traffic; Unhealthy and Degraded how
	// many of them were so judged over the step.
	Edges     int `json:"edges"`
	Unhealthy int `json:"unhealthy"`
	Degraded  int `json:"degraded"`
}

func (n *nodeTraffic) add(e *graph.Edge) {
	n.Counters.Add(e.Counters)
	n.Edges++
	switch e.Health {
	case graph.HealthUnhealthy:
		n.Unhealthy++
	case graph.HealthDegraded:
		n.Degraded++
	}
	if n.ConnectLatencyCount > 0 {
		n.ConnectLatencyAvgUs = n.ConnectLatencySumUs / n.ConnectLatencyCount
	}
}

// nodeDNS is a node's DNS lookups in one step, summed over its
// resolvers (the store's dns_minutes and rollups, as /api/dns reads
// them): every counter of tracer.DNSCounters, the average latency, the
// failed lookups, how many resolvers it asked, and the worst resolver's
// health over the step by the server's DNS thresholds.
type nodeDNS struct {
	tracer.DNSCounters
	LatencyAvgUs  uint64 `json:"latency_avg_us"`
	FailedLookups uint64 `json:"failed"`
	Resolvers     int    `json:"resolvers"`
	Health        string `json:"health"`
}

// dnsOf sums n's lookups per resolver, nil when it made none.
func dnsOf(n *graph.Node) *nodeDNS {
	if len(n.DNS) == 0 {
		return nil
	}
	d := &nodeDNS{Health: graph.HealthOK, Resolvers: len(n.DNS)}
	rank := map[string]int{graph.HealthOK: 0, graph.HealthDegraded: 1, graph.HealthUnhealthy: 2}
	for _, r := range n.DNS {
		d.DNSCounters.Add(r.DNSCounters)
		if rank[r.Health] > rank[d.Health] {
			d.Health = r.Health
		}
	}
	if d.LatencyCount > 0 {
		d.LatencyAvgUs = d.LatencySumUs / d.LatencyCount
	}
	d.FailedLookups = d.DNSCounters.Failed()
	return d
}

// nodePoint is one step of a node's history: what reached it (in: the
// edges it serves), what it sent (out: the edges it is the client of),
// and its DNS lookups (absent in a step without any).
type nodePoint struct {
	T   time.Time   `json:"t"`
	In  nodeTraffic `json:"in"`
	Out nodeTraffic `json:"out"`
	DNS *nodeDNS    `json:"dns,omitempty"`
}

type nodeSeriesAnswer struct {
	Node   string      `json:"node"`
	Since  time.Time   `json:"since"`
	Until  time.Time   `json:"until"`
	StepS  int64       `json:"step_seconds"`
	Points []nodePoint `json:"points"`
}

// maxIDLen bounds a node id in a query: ids are a kind, a host id, and a
// workload, process or address.
const maxIDLen = 1024

// validID checks a node id given as from, to or node.
func validID(name, v string) error {
	if len(v) > maxIDLen {
		return badParam("invalid %s: %d bytes, allowed a node id of at most %d", name, len(v), maxIDLen)
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
		return badParam("invalid %s %s: allowed a node id as /api/graph gives it, without control characters", name, quote(v))
	}
	return nil
}

// handleSeries answers one edge's or one node's history over the range.
// An edge: from, to, proto and port name it as /api/graph gives it; a
// node: node is its id (group_by as there for both). points (default 30,
// at most 120) splits the range into steps of whole minutes (one more
// point when the range starts inside a minute).
// The range is read and joined once (graph.Joiner), then each step is
// read from the store like a range of its own and summed onto the range's
// edges (an edge's series keeps only its own), plus, for a node, the
// step's DNS lookups (the store keeps them per minute, like the flows).
func (s *Server) handleSeries(w http.ResponseWriter, r *http.Request) {
	q, err := newQuery(r.URL.RawQuery, s.now(), "since", "until", "group_by", "from", "to", "proto", "port", "points", "node")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	since, until, err := q.window()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if until.IsZero() {
		until = q.now
	}
	if since.IsZero() {
		since = until.Add(-time.Hour)
	}
	if !since.Before(until) {
		s.fail(w, r, badParam("invalid since %s: allowed a time before until", since.Format(time.RFC3339)))
		return
	}
	by, err := q.groupBy()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	node := q.str("node")
	from, to := q.str("from"), q.str("to")
	proto, port := "", -1
	if q.has("node") {
		if node == "" {
			s.fail(w, r, badParam("missing node: allowed a node id as /api/graph gives it"))
			return
		}
		if q.has("from") || q.has("to") || q.has("proto") || q.has("port") {
			s.fail(w, r, badParam("node given with from, to, proto or port: allowed either node (a node's history) or from, to, proto and port (an edge's)"))
			return
		}
		if err := validID("node", node); err != nil {
			s.fail(w, r, err)
			return
		}
	} else {
		if from == "" || to == "" {
			s.fail(w, r, badParam("missing from or to: allowed the ids of an edge's ends, as /api/graph gives them (or node, for a node's history)"))
			return
		}
		for _, x := range [][2]string{{"from", from}, {"to", to}} {
			if err := validID(x[0], x[1]); err != nil {
				s.fail(w, r, err)
				return
			}
		}
		if proto, err = q.proto(); err != nil || proto == "" {
			s.fail(w, r, badParam("invalid proto %s: allowed %s", quote(q.str("proto")), "tcp, udp, unix"))
			return
		}
		if port, err = q.port(); err != nil || port < 0 {
			s.fail(w, r, badParam("invalid port %s: allowed 0 to 65535", quote(q.str("port"))))
			return
		}
	}
	points := defaultPoints
	if v := q.str("points"); v != "" {
		if points, err = strconv.Atoi(v); err != nil || points < 1 || points > maxPoints {
			s.fail(w, r, badParam("invalid points %s: allowed 1 to %d", quote(v), maxPoints))
			return
		}
	}
	// The step divides the range asked for into points whole minutes;
	// the first step starts on the minute since falls in, so a range that
	// starts inside a minute has one point more.
	span := until.Sub(since)
	step := ((span/time.Duration(points) + time.Minute - 1) / time.Minute) * time.Minute
	if !since.Add(span).Equal(until) {
		// Longer than a Duration holds (Sub saturates at 292 years):
		// whole minutes from whole seconds, rounded up.
		step = time.Duration((until.Unix()-since.Unix())/60/int64(points)+1) * time.Minute
	}
	start := since.Truncate(time.Minute)
	if step < time.Minute {
		step = time.Minute
	}
	ctx := r.Context()
	hosts, err := s.st.Hosts(ctx)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ids, err := s.st.Identities(ctx, store.Range{Since: start, Until: until})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The range is read and joined once (graph.Joiner), as /api/graph
	// reads it: an edge keeps its ends in every step even when its
	// client's and its server's records fell into different minutes. An
	// edge's series joins only the flows of its protocol that could be
	// its own: its port, and on loopback any port (a NAT rule such as
	// Docker's embedded DNS sends a client's queries to another port,
	// where the server's record has them).
	var rangeKeep func(*store.Observation) bool
	if node == "" {
		rangeKeep = func(o *store.Observation) bool {
			if o.Proto != proto {
				return false
			}
			if int(o.Port) == port {
				return true
			}
			a, err := netip.ParseAddr(o.LocalAddr)
			return err == nil && a.IsLoopback()
		}
	}
	rng := store.Range{Since: start, Until: until}
	all, err := s.st.Observations(ctx, rng)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// kept is what rangeKeep accepts of obs, which may be the cache's:
	// not filtered in place.
	kept := func(obs []store.Observation) []store.Observation {
		if rangeKeep == nil {
			return obs
		}
		var out []store.Observation
		for i := range obs {
			if rangeKeep(&obs[i]) {
				out = append(out, obs[i])
			}
		}
		return out
	}
	listeners, err := s.st.Listeners(ctx, rng)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	joiner := graph.NewJoiner(kept(all), hosts, listeners)
	// each builds the graph of every step, of the range's edges keep
	// accepts (with the clients' DNS lookups of the step when dns), and
	// hands it over. Each step is read from the store as a range of its
	// own.
	each := func(keep func(*graph.Edge) bool, dns bool, f func(t time.Time, g *graph.Graph)) error {
		for t := start; t.Before(until); t = t.Add(step) {
			end := t.Add(step)
			if end.After(until) {
				end = until
			}
			obs, err := s.st.Observations(ctx, store.Range{Since: t, Until: end})
			if err != nil {
				return err
			}
			g := joiner.Step(kept(obs), keep)
			if dns {
				ds, err := s.st.DNS(ctx, store.Range{Since: t, Until: end})
				if err != nil {
					return err
				}
				graph.AddDNS(&g, ds, hosts)
			}
			graph.Name(&g, ids)
			g = graph.Group(g, by)
			g.Judge(s.health)
			if dns {
				g.JudgeDNS(s.dns)
			}
			f(t, &g)
		}
		return nil
	}
	if node != "" {
		ans := nodeSeriesAnswer{Node: node, Since: start, Until: until, StepS: int64(step / time.Second), Points: []nodePoint{}}
		seen := false
		err = each(nil, true, func(t time.Time, g *graph.Graph) {
			p := nodePoint{T: t}
			for i := range g.Nodes {
				if g.Nodes[i].ID == node {
					p.DNS = dnsOf(&g.Nodes[i])
					seen = true
				}
			}
			for i := range g.Edges {
				e := &g.Edges[i]
				if e.To == node {
					p.In.add(e)
				}
				if e.From == node {
					p.Out.add(e)
				}
			}
			ans.Points = append(ans.Points, p)
		})
		if err == nil && !seen {
			err = s.known(r, by, node, "", "", "", 0)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		s.json(w, ans)
		return
	}
	ans := seriesAnswer{From: from, To: to, Proto: proto, Port: port, Since: start, Until: until, StepS: int64(step / time.Second), Points: []seriesPoint{}}
	seen := false
	err = each(func(e *graph.Edge) bool { return e.Proto == proto && int(e.Port) == port }, false, func(t time.Time, g *graph.Graph) {
		p := seriesPoint{T: t, Health: graph.HealthOK}
		for _, e := range g.Edges {
			if e.From == from && e.To == to && e.Proto == proto && int(e.Port) == port {
				p.Counters, p.ConnectLatencyAvgUs, p.Unhealthy, p.Health = e.Counters, e.ConnectLatencyAvgUs, e.Unhealthy, e.Health
				seen = true
			}
		}
		ans.Points = append(ans.Points, p)
	})
	if err == nil && !seen {
		err = s.known(r, by, "", from, to, proto, port)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.json(w, ans)
}

// known checks that a series asks for what the store holds: the node, or
// the edge from, to, proto and port, in the graph of all history grouped
// by by (what /api/graph gives without since or until). A node or edge
// the store holds but that had no traffic in the range has a history of
// zeros; one it never held is a typo, answered 404 naming the parameter,
// as /api/look answers a target that matches nothing. It is asked only
// when the range's steps did not have it, and answered from s.seen where
// it can: all history is weeks of data, read again on every click on an
// idle node otherwise.
func (s *Server) known(r *http.Request, by, node, from, to, proto string, port int) error {
	ids := []string{node}
	if node == "" {
		ids = []string{from, to}
	}
	key := graph.EdgeKey{From: from, To: to, Proto: proto, Port: uint16(port)}
	if s.seen.has(by, ids, key, time.Now()) {
		return nil
	}
	set, err := s.everSeen(r.Context(), by)
	if err != nil {
		return err
	}
	if node != "" {
		if !set.nodes[node] {
			return &notFoundError{fmt.Errorf("unknown node %s: no such node in the store (group_by %s); allowed a node id as /api/graph gives it", quote(node), by)}
		}
		return nil
	}
	for _, x := range [][2]string{{"from", from}, {"to", to}} {
		if !set.nodes[x[1]] {
			return &notFoundError{fmt.Errorf("unknown %s %s: no such node in the store (group_by %s); allowed a node id as /api/graph gives it", x[0], quote(x[1]), by)}
		}
	}
	if !set.edges[key] {
		return &notFoundError{fmt.Errorf("unknown edge: the store has no edge from %s to %s over %s port %d (group_by %s); allowed from, to, proto and port of an edge as /api/graph gives it", quote(from), quote(to), proto, port, by)}
	}
	return nil
}

// everSeen reads the graph of all history grouped by by, and keeps its
// node ids and edge keys in s.seen.
func (s *Server) everSeen(ctx context.Context, by string) (*seenSet, error) {
	t0 := time.Now()
	g, _, err := s.loadGraph(ctx, store.Range{})
	if err != nil {
		return nil, err
	}
	g = graph.Group(g, by)
	set := &seenSet{at: t0, nodes: make(map[string]bool, len(g.Nodes)), edges: make(map[graph.EdgeKey]bool, len(g.Edges))}
	for _, n := range g.Nodes {
		set.nodes[n.ID] = true
	}
	for _, e := range g.Edges {
		set.edges[graph.KeyOf(e)] = true
	}
	s.seen.put(by, set)
	s.log.Debug("read all history to tell an idle node or edge from an unknown one", "component", "web",
		"group_by", by, "nodes", len(set.nodes), "edges", len(set.edges), "took", time.Since(t0))
	return set, nil
}

// seenMaxAge bounds how long a seenSet answers. What it can get wrong
// is what was deleted after it was read (retention, the store's size
// ceiling): such a node or edge is answered as idle, with zeros, not
// 404. Both delete the oldest buckets, so a node leaves all history only
// after long idle, and this bound keeps the wrong answer from lasting,
// while an idle node's series still reads all history at most once in
// seenMaxAge per group_by.
const seenMaxAge = 10 * time.Minute

// seenSet is what the store held in all history, grouped one way: the
// node ids and edge keys of the graph /api/graph gives without since or
// until, as read at at (the wall clock, not Options.Now: its age is how
// long deletions may have gone unseen).
type seenSet struct {
	at    time.Time
	nodes map[string]bool
	edges map[graph.EdgeKey]bool
}

// everSeenCache keeps a seenSet per group_by. Only a hit is answered
// from it: a miss reads all history again (Server.everSeen), so a node
// or edge that is new since is found, and one never held still costs a
// read, as it did before (a typo, not what the page asks).
type everSeenCache struct {
	mu   sync.Mutex
	sets map[string]*seenSet
}

// has reports whether the set of by, younger than seenMaxAge at now,
// holds every id of ids and, when ids are an edge's two ends, the edge
// key.
func (c *everSeenCache) has(by string, ids []string, key graph.EdgeKey, now time.Time) bool {
	c.mu.Lock()
	set := c.sets[by]
	c.mu.Unlock()
	if set == nil || now.Sub(set.at) >= seenMaxAge {
		return false
	}
	for _, id := range ids {
		if !set.nodes[id] {
			return false
		}
	}
	return len(ids) == 1 || set.edges[key]
}

// put keeps set unless a set read later is there: of two reads of all
// history that overlap, the older may finish last.
func (c *everSeenCache) put(by string, set *seenSet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sets == nil {
		c.sets = map[string]*seenSet{}
	}
	if old := c.sets[by]; old == nil || !old.at.After(set.at) {
		c.sets[by] = set
	}
}
