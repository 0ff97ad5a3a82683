package agent

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/tracer"
)

// The cap on edges per node bounds what one local process can add to the
// store and the metrics however many peers it has (a port scan, a UDP
// server hearing from every address of the Internet): a local end (its
// namespace, command name and workload) keeps at most MaxEdgesPerNode
// distinct edges; the flows of any further edge are added, exactly, to
// one edge per direction and protocol whose remote end is Other (inbound
// keeps its local service address and port). An edge is held from its
// first interval until it has been idle for EdgeIdle; meanwhile its flows
// are stored as they are.

// Other is the remote end of the edge that holds a local end's folded flows.
const Other = "_other"

// DefaultMaxEdgesPerNode is --max-edges-per-node's default.
const DefaultMaxEdgesPerNode = 1000

// MaxEdgesPerNodeLimit is the largest --max-edges-per-node.
const MaxEdgesPerNodeLimit = 1 << 20

// EdgeIdle is how long an edge is held after its last interval: past it,
// its place goes to the next new edge of its local end.
const EdgeIdle = time.Hour

// EdgeCap is the cap on edges per local end and what it holds.
type EdgeCap struct {
	// MaxEdgesPerNode is the most distinct edges one local end holds;
	// 0: no cap.
	MaxEdgesPerNode int
	st              *foldState
}

// held is the number of edges the cap holds over every local end.
func (c *EdgeCap) held() int {
	if c.st == nil {
		return 0
	}
	return c.st.held
}

// foldState is what the cap remembers between intervals.
type foldState struct {
	nodes map[foldNode]*foldEdges
	now   func() time.Time
	// held is the edges held over every node.
	held int
	// lastExpire: idle edges are forgotten at most once a minute.
	lastExpire time.Time
	// lastBatch is the last interval counted (an interval collected
	// again is folded again but not counted twice).
	lastBatch string
	// Counted since the agent started, and up to the last log line.
	foldedFlows, loggedFlows uint64
	lastLog                  time.Time
	capped                   int       // local ends at the cap after the last interval
	fresh                    []pending // apply's, reused: new edges of the interval
	counter                  prometheus.Counter
	edgesHeld, nodesCapped   prometheus.Gauge
}

// foldNode is a local end: its namespace, process and workload.
type foldNode struct {
	netns          uint32
	comm, workload string
}

// foldEdge is an edge of a local end: what the store keys a flow by
// besides its host and process.
type foldEdge struct {
	dir                 tracer.Direction
	proto               tracer.Proto
	local, remote, peer string
	port                uint16
}

type foldEdges struct {
	// seen holds each edge's last interval, by pointer: a held edge's
	// interval is one map lookup, not a lookup and an assignment.
	seen map[foldEdge]*time.Time
	// capped: an edge was folded since the local end last had room;
	// logged: that was logged (once until it has room again).
	capped, logged bool
}

// intFlag is a command-line int with bounds (a pflag.Value).
type intFlag struct {
	p      *int
	lo, hi int
	zeroIs string // what 0 means; "": 0 is not allowed unless lo is 0
}

// IntFlag sets *p to def and returns a flag value that takes an integer
// from lo to hi (or 0, which means zeroIs, when zeroIs is not ""). It
// says its range (Allowed, cli.Ranged), which the error of a value it
// refuses shows.
func IntFlag(p *int, def, lo, hi int, zeroIs string) interface {
	String() string
	Set(string) error
	Type() string
	Allowed() string
} {
	*p = def
	return &intFlag{p: p, lo: lo, hi: hi, zeroIs: zeroIs}
}

func (f *intFlag) String() string { return strconv.Itoa(*f.p) }
func (f *intFlag) Type() string   { return "int" }

// Allowed is the range the flag takes: "0 (no cap) or 1 to 1048576".
func (f *intFlag) Allowed() string {
	if f.zeroIs != "" {
		return fmt.Sprintf("0 (%s) or %d to %d", f.zeroIs, f.lo, f.hi)
	}
	return fmt.Sprintf("%d to %d", f.lo, f.hi)
}

func (f *intFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err == nil && (n >= f.lo && n <= f.hi || n == 0 && f.zeroIs != "") {
		*f.p = n
		return nil
	}
	return errors.New("allowed " + f.Allowed())
}

// fold applies the cap to an interval's flows, before the metrics and
// the store see them, and counts and logs what it folded; host names a
// network namespace's host as the store does (nil: by its inode).
func (c *EdgeCap) fold(iv *tracer.Interval, log *slog.Logger, m *metrics.Metrics, host func(netns uint32) string) {
	if c.MaxEdgesPerNode <= 0 {
		return
	}
	if c.st == nil {
		c.st = newFoldState(m)
	}
	st := c.st
	var folded int
	iv.Flows, folded = st.apply(iv.Flows, c.MaxEdgesPerNode)
	if iv.BatchID != "" && iv.BatchID == st.lastBatch {
		return // counted when it was first collected
	}
	st.lastBatch = iv.BatchID
	st.foldedFlows += uint64(folded)
	capped := 0
	for n, e := range st.nodes {
		if !e.capped {
			continue
		}
		capped++
		if !e.logged {
			e.logged = true
			key, v := hostAttr(host, n.netns)
			log.Warn("local end reached --max-edges-per-node: flows to its further new peers are added to one edge to "+Other,
				key, v, "process", n.comm, "workload", n.workload, "max_edges_per_node", c.MaxEdgesPerNode, "idle_release", EdgeIdle)
		}
	}
	st.capped = capped
	if now := st.now(); now.Sub(st.lastLog) >= time.Minute {
		c.logFolded(log)
	}
	if st.counter != nil {
		st.counter.Add(float64(folded))
		st.edgesHeld.Set(float64(st.held))
		st.nodesCapped.Set(float64(capped))
	}
}

// hostAttr is the key of a local end's namespace in the log: host, its
// host id as the store names it (hostd/qa-d), or netns, its inode, where
// no host ids are known.
func hostAttr(host func(uint32) string, netns uint32) (string, any) {
	if host == nil {
		return "netns", netns
	}
	return "host", host(netns)
}

// logFolded logs the flows folded since the last such line, if any: at
// most once a minute while folding goes on (fold), and at stop (Run), so
// that the lines add up to deptrace_edges_folded_flows_total.
func (c *EdgeCap) logFolded(log *slog.Logger) {
	st := c.st
	if st == nil || st.foldedFlows == st.loggedFlows {
		return
	}
	now := st.now()
	attrs := []any{"flows", st.foldedFlows - st.loggedFlows}
	if !st.lastLog.IsZero() {
		attrs = append(attrs, "since", st.lastLog.Format(time.RFC3339))
	}
	log.Warn("flows folded into "+Other+" edges by --max-edges-per-node", append(attrs,
		"flows_total", st.foldedFlows, "local_ends_capped", st.capped, "edges_held", st.held)...)
	st.loggedFlows, st.lastLog = st.foldedFlows, now
}

func newFoldState(m *metrics.Metrics) *foldState {
	st := &foldState{nodes: map[foldNode]*foldEdges{}, now: time.Now}
	if m == nil {
		return st
	}
	st.counter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "deptrace_edges_folded_flows_total",
		Help: "Flows added to a remote=\"" + Other + "\" edge because their local end already held --max-edges-per-node edges.",
	})
	st.edgesHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "deptrace_edges_held",
		Help: "Distinct edges the cap on edges per local end holds (each idle for less than 1h).",
	})
	st.nodesCapped = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "deptrace_local_ends_capped",
		Help: "Local ends at --max-edges-per-node whose new edges are folded.",
	})
	m.Registry().MustRegister(st.counter, st.edgesHeld, st.nodesCapped)
	return st
}

// pending is a new edge of an interval: its flow is flows[i].
type pending struct {
	node foldNode
	edge foldEdge
	i    int
}

// weight orders the new edges of one interval: those that carried
// traffic are held before those that only failed (a scan's), so that
// within one interval the cap keeps the edges that worked.
func weight(f *tracer.Flow) uint64 {
	return f.Connections + f.DatagramsSent + f.DatagramsReceived
}

// apply folds flows past the cap; it returns the flows to keep (the held
// edges' flows, then one per folded group), in flows' own array, and how
// many it folded.
func (st *foldState) apply(flows []tracer.Flow, max int) ([]tracer.Flow, int) {
	now := st.now()
	st.expire(now)
	fresh := st.fresh[:0]
	defer func() { st.fresh = fresh[:0] }()
	var (
		lastNode  foldNode
		lastEdges *foldEdges
		room      bool // a local end with new edges has room for some
	)
	for i := range flows {
		f := &flows[i]
		n := nodeOf(f)
		es := lastEdges
		if es == nil || n != lastNode { // a drain's flows of one process often come together
			es = st.nodes[n]
			if es == nil {
				es = &foldEdges{seen: map[foldEdge]*time.Time{}}
				st.nodes[n] = es
			}
			lastNode, lastEdges = n, es
		}
		e := edgeOf(f)
		if seen, ok := es.seen[e]; ok {
			*seen = now
			continue
		}
		room = room || len(es.seen) < max
		fresh = append(fresh, pending{n, e, i})
	}
	if len(fresh) == 0 {
		return flows, 0
	}
	if room {
		// Which new edges a local end holds matters only while it has
		// room: a full one folds every new edge whatever the order.
		slices.SortStableFunc(fresh, func(a, b pending) int {
			return cmp.Compare(weight(&flows[b.i]), weight(&flows[a.i]))
		})
	}
	fold := make([]bool, len(flows))
	n := 0
	lastEdges = nil
	for _, p := range fresh {
		es := lastEdges
		if es == nil || p.node != lastNode {
			es = st.nodes[p.node]
			lastNode, lastEdges = p.node, es
		}
		if room { // else nothing is held below, so nothing is held twice
			if _, ok := es.seen[p.edge]; ok { // two flows of one edge (never from one drain)
				continue
			}
		}
		if len(es.seen) < max {
			at := now
			es.seen[p.edge] = &at
			st.held++
			continue
		}
		es.capped = true
		fold[p.i] = true
		n++
	}
	if n == 0 {
		return flows, 0
	}
	// In place: the kept flows first, in order, then one flow per folded
	// group (each group takes at least one folded flow's place).
	type group struct {
		node  foldNode
		dir   tracer.Direction
		proto tracer.Proto
		local string
		port  uint16
	}
	at := map[group]int{}
	var groups []tracer.Flow
	for i := range flows {
		if !fold[i] {
			continue
		}
		f := flows[i]
		g := group{node: nodeOf(&f), dir: f.Direction, proto: f.Proto}
		if f.Direction == tracer.Inbound {
			g.local, g.port = f.LocalAddr, f.Port // the local service stays
		}
		j, ok := at[g]
		if !ok {
			f.LocalAddr, f.Port = g.local, g.port
			f.RemoteAddr, f.RemoteName, f.PeerPID, f.PeerComm = Other, "", 0, ""
			at[g] = len(groups)
			groups = append(groups, f)
			continue
		}
		o := &groups[j]
		o.Counters.Add(f.Counters)
		if !f.FirstSeen.IsZero() && (o.FirstSeen.IsZero() || f.FirstSeen.Before(o.FirstSeen)) {
			o.FirstSeen = f.FirstSeen
		}
		if f.LastSeen.After(o.LastSeen) {
			o.LastSeen = f.LastSeen
		}
	}
	out := flows[:0]
	for i := range flows {
		if !fold[i] {
			out = append(out, flows[i])
		}
	}
	return append(out, groups...), n
}

// expire forgets edges idle for EdgeIdle, and local ends left with none,
// at most once a minute.
func (st *foldState) expire(now time.Time) {
	if now.Sub(st.lastExpire) < time.Minute {
		return
	}
	st.lastExpire = now
	for n, es := range st.nodes {
		for e, seen := range es.seen {
			if now.Sub(*seen) > EdgeIdle {
				delete(es.seen, e)
				st.held--
				es.capped, es.logged = false, false // logged again when it fills again
			}
		}
		if len(es.seen) == 0 {
			delete(st.nodes, n)
		}
	}
}

func nodeOf(f *tracer.Flow) foldNode {
	return foldNode{netns: f.NetNS, comm: f.Comm, workload: f.Workload}
}

func edgeOf(f *tracer.Flow) foldEdge {
	return foldEdge{dir: f.Direction, proto: f.Proto, local: f.LocalAddr, remote: f.RemoteAddr, peer: f.PeerComm, port: f.Port}
}

// lostAttrs names every cause of an interval's losses in the agent's log
// line, in the order of tracer.Losses: the total, then each cause that
// lost something, with a hint where a flag helps.
func lostAttrs(l tracer.Losses, cfg tracer.Config) []any {
	attrs := []any{"total", l.Total()}
	for _, c := range []struct {
		name string
		n    uint64
		hint string
	}{
		{"flow_map_full", l.FlowMapFull, fmt.Sprintf("raise --flow-map-size (now %d) or shorten --interval", cfg.FlowMapSize)},
		{"flow_alloc_failed", l.FlowAllocFailed, ""},
		{"port_map_full", l.PortMapFull, fmt.Sprintf("raise --port-map-size (now %d)", cfg.PortMapSize)},
		{"udp_peer_unknown", l.UDPPeerUnknown, ""},
		{"sock_storage_failed", l.SockStorageFailed, ""},
		{"recursion_misses", l.RecursionMisses, ""},
	} {
		if c.n == 0 {
			continue
		}
		attrs = append(attrs, c.name, c.n)
		if c.hint != "" {
			attrs = append(attrs, c.name+"_hint", c.hint)
		}
	}
	return attrs
}
