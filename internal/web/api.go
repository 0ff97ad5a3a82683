package web

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// notFoundError is a target that matches nothing in the selected range:
// HTTP 404.
type notFoundError struct{ err error }

func (e *notFoundError) Error() string { return e.err.Error() }

// targetNotFound is graph.Resolve's error for target, which quotes the
// target whole, with the target cut as every error quotes a value.
func targetNotFound(err error, target string) error {
	return &notFoundError{errors.New(strings.Replace(err.Error(), strconv.Quote(target), quote(target), 1))}
}

// loadGraph builds the graph of range r the way look, graph and diff do,
// so that whatever makes the store's queries faster makes these too.
func (s *Server) loadGraph(ctx context.Context, r store.Range) (graph.Graph, []store.Host, error) {
	return graph.Load(ctx, s.st, r)
}

// filters are the CLI's query filters, as query parameters.
type filters struct {
	since, until time.Time
	target       string
	depth        int
	reverse      bool
	proto        string
	port         int    // -1: any
	groupBy      string // graph.ByWorkload, ByProcess or ByHost
}

var filterParams = []string{"since", "until", "target", "depth", "reverse", "proto", "port", "group_by"}

func (q query) filters(defDepth int) (filters, error) {
	var f filters
	var err error
	if f.since, f.until, err = q.window(); err != nil {
		return f, err
	}
	f.target = q.str("target")
	if f.reverse, err = q.bool("reverse"); err != nil {
		return f, err
	}
	if f.reverse && !q.has("depth") {
		defDepth = 0 // like look --reverse: all the way up
	}
	if f.depth, err = q.depth(defDepth); err != nil {
		return f, err
	}
	if f.proto, err = q.proto(); err != nil {
		return f, err
	}
	if f.groupBy, err = q.groupBy(); err != nil {
		return f, err
	}
	f.port, err = q.port()
	return f, err
}

func (f filters) rng() store.Range { return store.Range{Since: f.since, Until: f.until} }

// keepEdges returns g restricted to the edges keep accepts and the nodes
// they touch.
func keepEdges(g graph.Graph, keep func(graph.Edge) bool) graph.Graph {
	out := graph.Graph{Format: g.Format, Nodes: []graph.Node{}, Edges: []graph.Edge{}}
	used := map[string]bool{}
	for _, e := range g.Edges {
		if keep(e) {
			out.Edges = append(out.Edges, e)
			used[e.From], used[e.To] = true, true
		}
	}
	for _, n := range g.Nodes {
		if used[n.ID] {
			out.Nodes = append(out.Nodes, n)
		}
	}
	return out
}

// protoPort applies proto and port: only edges of that protocol and server
// port.
func (f filters) protoPort(g graph.Graph) graph.Graph {
	if f.proto == "" && f.port < 0 {
		return g
	}
	return keepEdges(g, func(e graph.Edge) bool {
		return (f.proto == "" || e.Proto == f.proto) && (f.port < 0 || int(e.Port) == f.port)
	})
}

// around applies target, depth and reverse: the part of g within depth of
// target in both directions, or with reverse only what depends on target.
func (f filters) around(g graph.Graph, hosts []store.Host) (graph.Graph, error) {
	if f.target == "" {
		return g, nil
	}
	roots, err := graph.Resolve(g, hosts, f.target)
	if err != nil {
		return graph.Graph{}, targetNotFound(err, f.target)
	}
	if !f.reverse {
		return graph.Reachable(g, roots, f.depth, graph.TargetPort(f.target)), nil
	}
	edges := map[graph.EdgeKey]bool{}
	var walk func([]*graph.Branch)
	walk = func(bs []*graph.Branch) {
		for _, b := range bs {
			edges[graph.KeyOf(b.Edge)] = true
			walk(b.Children)
		}
	}
	for _, t := range graph.Look(g, roots, f.depth, false, true, graph.TargetPort(f.target)) {
		walk(t.Inbound)
	}
	return keepEdges(g, func(e graph.Edge) bool { return edges[graph.KeyOf(e)] }), nil
}

// selected is the graph the filters select, grouped by group_by (or the
// process/service graph of format 1 with v1).
func (s *Server) selected(ctx context.Context, f filters, v1 bool) (graph.Graph, []store.Host, error) {
	g, hosts, err := s.loadGraph(ctx, f.rng())
	if err != nil {
		return graph.Graph{}, nil, err
	}
	if !v1 {
		g = graph.Group(g, f.groupBy)
	}
	g.Judge(s.health)
	g.JudgeDNS(s.dns)
	g, err = f.around(f.protoPort(g), hosts)
	return g, hosts, err
}

// handleGraph answers what `deptrace graph --format json` prints, without
// the indentation (28 MB instead of 39 MB for 50,000 edges); format=1
// what --format json-v1 prints.
func (s *Server) handleGraph(w http.ResponseWriter, r *http.Request) {
	q, err := newQuery(r.URL.RawQuery, s.now(), append(filterParams, "format")...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f, err := q.filters(0)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v1 := false
	switch q.str("format") {
	case "", "2":
	case "1":
		v1 = true
		if by := q.str("group_by"); by != "" {
			s.fail(w, r, badParam("invalid group_by %s with format 1: format 1 is the process and service graph, never grouped; allowed group_by with format 2", quote(by)))
			return
		}
	default:
		s.fail(w, r, badParam("invalid format %s: allowed 2 (the default) or 1 (deprecated: process and service nodes)", quote(q.str("format"))))
		return
	}
	g, _, err := s.selected(r.Context(), f, v1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := graph.WriteCompactJSON(w, g); err != nil {
		s.log.Debug("write graph", "err", err)
	}
}

// lookBranch and lookTree are look's trees in JSON.
type lookBranch struct {
	Edge     graph.Edge   `json:"edge"`
	Peer     graph.Node   `json:"peer"`
	Repeat   bool         `json:"repeat"`
	Children []lookBranch `json:"children"`
}

type lookTree struct {
	Root     graph.Node   `json:"root"`
	Outbound []lookBranch `json:"outbound"` // null with reverse
	Inbound  []lookBranch `json:"inbound"`
}

type lookAnswer struct {
	Target  string     `json:"target"`
	Depth   int        `json:"depth"`
	Reverse bool       `json:"reverse"`
	Since   *time.Time `json:"since"`
	Until   *time.Time `json:"until"`
	Trees   []lookTree `json:"trees"`
}

func branches(bs []*graph.Branch) []lookBranch {
	out := make([]lookBranch, 0, len(bs))
	for _, b := range bs {
		out = append(out, lookBranch{Edge: b.Edge, Peer: b.Peer, Repeat: b.Repeat, Children: branches(b.Children)})
	}
	return out
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// handleLook answers what `deptrace look TARGET` prints, as trees.
func (s *Server) handleLook(w http.ResponseWriter, r *http.Request) {
	q, err := newQuery(r.URL.RawQuery, s.now(), filterParams...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f, err := q.filters(1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if f.target == "" {
		s.fail(w, r, badParam("missing target: allowed a host (id or name), an address, address:port, a workload, pod, container or unit, or a process name"))
		return
	}
	g, hosts, err := s.loadGraph(r.Context(), f.rng())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	g = graph.Group(g, f.groupBy)
	g.Judge(s.health)
	g.JudgeDNS(s.dns)
	g = f.protoPort(g)
	roots, err := graph.Resolve(g, hosts, f.target)
	if err != nil {
		s.fail(w, r, targetNotFound(err, f.target))
		return
	}
	ans := lookAnswer{Target: f.target, Depth: f.depth, Reverse: f.reverse, Since: timePtr(f.since), Until: timePtr(f.until), Trees: []lookTree{}}
	for _, t := range graph.Look(g, roots, f.depth, !f.reverse, true, graph.TargetPort(f.target)) {
		lt := lookTree{Root: t.Root, Inbound: branches(t.Inbound)}
		if !f.reverse {
			lt.Outbound = branches(t.Outbound)
		}
		ans.Trees = append(ans.Trees, lt)
	}
	s.json(w, ans)
}

type diffAnswer struct {
	Since       time.Time    `json:"since"`
	Until       time.Time    `json:"until"`
	BeforeSince time.Time    `json:"before_since"`
	BeforeUntil time.Time    `json:"before_until"`
	Appeared    []graph.Edge `json:"appeared"`
	Disappeared []graph.Edge `json:"disappeared"`
	// Nodes are the ends of every listed edge, from either window.
	Nodes []graph.Node `json:"nodes"`
}

// diffParams name /api/diff's window in its errors.
var diffParams = cli.WindowNames{Since: "since", Until: "until", BeforeSince: "before_since", BeforeUntil: "before_until"}

// handleDiff answers what `deptrace diff` prints: edges of [since, until)
// missing from the window before, and the reverse.
func (s *Server) handleDiff(w http.ResponseWriter, r *http.Request) {
	q, err := newQuery(r.URL.RawQuery, s.now(), append(filterParams, "before_since", "before_until")...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f, err := q.filters(0)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if f.since.IsZero() {
		s.fail(w, r, badParam("missing since: diff compares [since, until) with the window before it; allowed RFC 3339, \"15:04\" or an age such as 1h"))
		return
	}
	if f.until.IsZero() {
		f.until = q.now
		if !f.since.Before(f.until) {
			s.fail(w, r, badParam("invalid since %s: allowed a time before now", f.since.Format(time.RFC3339)))
			return
		}
	}
	// The window before: [before_since, before_until), each end defaulted
	// from the other and the current window as the CLI's diff does
	// (cli.BeforeWindow).
	before := filters{target: f.target, depth: f.depth, reverse: f.reverse, proto: f.proto, port: f.port, groupBy: f.groupBy}
	if before.since, err = q.time("before_since"); err != nil {
		s.fail(w, r, err)
		return
	}
	if before.until, err = q.time("before_until"); err != nil {
		s.fail(w, r, err)
		return
	}
	if before.since, before.until, err = cli.BeforeWindow(f.since, f.until, before.since, before.until, diffParams); err != nil {
		s.fail(w, r, badParam("%v", err))
		return
	}
	after, _, errA := s.selected(r.Context(), f, false)
	prev, _, errB := s.selected(r.Context(), before, false)
	var nf *notFoundError
	switch {
	case errA != nil && !errors.As(errA, &nf):
		s.fail(w, r, errA)
		return
	case errB != nil && !errors.As(errB, &nf):
		s.fail(w, r, errB)
		return
	case errA != nil && errB != nil:
		s.fail(w, r, errA) // the target is in neither window
		return
	}
	appeared, disappeared := graph.Diff(prev, after)
	ans := diffAnswer{Since: f.since, Until: f.until, BeforeSince: before.since, BeforeUntil: before.until,
		Appeared: nonNil(appeared), Disappeared: nonNil(disappeared), Nodes: []graph.Node{}}
	ends := map[string]bool{}
	for _, e := range append(appeared, disappeared...) {
		ends[e.From], ends[e.To] = true, true
	}
	for _, g := range []graph.Graph{after, prev} {
		for _, n := range g.Nodes {
			if ends[n.ID] {
				ans.Nodes = append(ans.Nodes, n)
				delete(ends, n.ID)
			}
		}
	}
	s.json(w, ans)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// dnsClient is one client's lookups in /api/dns: the process on its host
// (with its identity, when deptrace knows it), summed over its resolvers,
// and per resolver.
type dnsClient struct {
	Host    string `json:"host"`
	Process string `json:"process"`
	PID     uint32 `json:"pid"`
	tracer.Identity
	// Name is how the page names the client: its workload, pod,
	// container, unit, or process.
	Name          string           `json:"name"`
	Queries       uint64           `json:"queries"`
	FailedLookups uint64           `json:"failed"`
	Health        string           `json:"health"`
	Resolvers     []graph.DNSStats `json:"resolvers"`
	FirstSeen     time.Time        `json:"first_seen"`
	LastSeen      time.Time        `json:"last_seen"`
}

type dnsAnswer struct {
	Since   *time.Time  `json:"since"`
	Until   *time.Time  `json:"until"`
	Clients []dnsClient `json:"clients"`
	// Total is the number of clients that matched; Clients holds the
	// first limit of them, the worst health first, then the most failed
	// lookups.
	Total int `json:"total"`
}

// Limits of /api/dns's limit parameter.
const (
	dnsDefaultLimit = 500
	dnsMaxLimit     = 10000
)

var dnsParams = []string{"since", "until", "host", "process", "resolver", "failing", "limit"}

// handleDNS answers each client's DNS lookups over [since, until), per
// resolver, judged by the server's DNS thresholds (Options.DNSHealth): host, process and resolver
// select exactly; failing=true keeps the clients that are unhealthy or
// degraded; limit bounds the answer (default 500, at most 10000).
func (s *Server) handleDNS(w http.ResponseWriter, r *http.Request) {
	q, err := newQuery(r.URL.RawQuery, s.now(), dnsParams...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	since, until, err := q.window()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	failing, err := q.bool("failing")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit, err := q.limit(dnsDefaultLimit, dnsMaxLimit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resolver := q.str("resolver")
	if resolver != "" {
		if _, err := netip.ParseAddrPort(resolver); err != nil {
			s.fail(w, r, badParam("invalid resolver %s: allowed ADDRESS:PORT, such as 127.0.0.53:53 or [2001:db8::53]:53", quote(resolver)))
			return
		}
	}
	host, process := q.str("host"), q.str("process")
	ds, err := s.st.DNS(r.Context(), store.Range{Since: since, Until: until})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type key struct{ host, comm, container, unit, pod string }
	byClient := map[key]*dnsClient{}
	var order []key
	for _, d := range ds {
		if (host != "" && d.HostID != host) || (process != "" && d.Comm != process) || (resolver != "" && d.Resolver != resolver) {
			continue
		}
		k := key{d.HostID, d.Comm, d.ContainerID, d.Unit, d.PodUID}
		c := byClient[k]
		if c == nil {
			c = &dnsClient{Host: d.HostID, Process: d.Comm, Identity: d.Identity, FirstSeen: d.FirstSeen}
			byClient[k] = c
			order = append(order, k)
		}
		if !d.LastSeen.Before(c.LastSeen) {
			c.PID, c.LastSeen = d.PID, d.LastSeen
		}
		if d.FirstSeen.Before(c.FirstSeen) {
			c.FirstSeen = d.FirstSeen
		}
		st := graph.DNSStats{Proto: d.Proto, Resolver: d.Resolver, DNSCounters: d.DNSCounters}
		st.Judge(s.dns)
		c.Resolvers = append(c.Resolvers, st)
	}
	ans := dnsAnswer{Since: timePtr(since), Until: timePtr(until), Clients: []dnsClient{}}
	rank := map[string]int{graph.HealthUnhealthy: 0, graph.HealthDegraded: 1, graph.HealthOK: 2}
	for _, k := range order {
		c := byClient[k]
		c.Health = graph.HealthOK
		for _, st := range c.Resolvers {
			c.Queries += st.Queries
			c.FailedLookups += st.FailedLookups
			if rank[st.Health] < rank[c.Health] {
				c.Health = st.Health
			}
		}
		if failing && c.Health == graph.HealthOK {
			continue
		}
		c.Name = clientName(c.Identity, c.Process)
		ans.Clients = append(ans.Clients, *c)
	}
	slices.SortStableFunc(ans.Clients, func(a, b dnsClient) int {
		return cmp.Or(cmp.Compare(rank[a.Health], rank[b.Health]), cmp.Compare(b.FailedLookups, a.FailedLookups))
	})
	ans.Total = len(ans.Clients)
	ans.Clients = ans.Clients[:min(limit, len(ans.Clients))]
	s.json(w, ans)
}

// clientName is how a client is called: its workload, pod, container
// or systemd unit, else its process.
func clientName(id tracer.Identity, process string) string {
	switch {
	case id.Workload != "":
		return id.Workload
	case id.PodName != "":
		return id.PodNamespace + "/" + id.PodName
	case id.ContainerName != "":
		return id.ContainerName
	case id.Unit != "":
		return id.Unit
	}
	return process
}
