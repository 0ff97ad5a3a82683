package graph

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// DNSStats is one client's lookups through one resolver over the range:
// what it asked (queries), how the answers went by response code, the
// queries that got no answer in time (timeouts) and how long answers took.
// JSON field names are part of the documented format (docs/graph.md).
type DNSStats struct {
	Proto    string `json:"proto"`
	Resolver string `json:"resolver"`
	tracer.DNSCounters
	// LatencyAvgUs is latency_sum_us / latency_count (0 without an
	// answer).
	LatencyAvgUs uint64 `json:"latency_avg_us"`
	// FailedLookups is NXDOMAIN + SERVFAIL + other error codes +
	// timeouts.
	FailedLookups uint64 `json:"failed"`
	// Reasons and Health (set by JudgeDNS) as on an edge.
	Reasons []string `json:"reasons,omitempty"`
	Health  string   `json:"health,omitempty"`
}

// mergeDNS adds the stats of add to those of into, per (proto,
// resolver), sorted by resolver then proto.
func mergeDNS(into, add []DNSStats) []DNSStats {
	for _, d := range add {
		i := slices.IndexFunc(into, func(x DNSStats) bool { return x.Proto == d.Proto && x.Resolver == d.Resolver })
		if i < 0 {
			d.Reasons, d.Health = nil, ""
			into = append(into, d)
			i = len(into) - 1
		} else {
			into[i].DNSCounters.Add(d.DNSCounters)
		}
		into[i].derive()
	}
	slices.SortFunc(into, func(a, b DNSStats) int {
		return cmp.Or(cmp.Compare(a.Resolver, b.Resolver), cmp.Compare(a.Proto, b.Proto))
	})
	return into
}

// derive sets the values computed from the counters.
func (d *DNSStats) derive() {
	d.LatencyAvgUs = 0
	if d.LatencyCount > 0 {
		d.LatencyAvgUs = d.LatencySumUs / d.LatencyCount
	}
	d.FailedLookups = d.DNSCounters.Failed()
}

// AddDNS puts each client's DNS stats (store.DNS of the graph's range) on
// its process node, adding a node for a client that has no flow in the
// range (one whose every lookup failed connects nowhere). g is a graph
// of format 1, as Build makes it; Group carries the stats to workload
// nodes.
func AddDNS(g *Graph, ds []store.DNSObservation, hosts []store.Host) {
	if len(ds) == 0 {
		return
	}
	idx := make(map[string]int, len(g.Nodes))
	for i, n := range g.Nodes {
		idx[n.ID] = i
	}
	hostAddr := map[string]string{}
	for _, h := range hosts {
		for _, a := range h.Addrs {
			if ip, err := netip.ParseAddr(a); err == nil && !ip.IsLoopback() {
				if _, ok := hostAddr[h.ID]; !ok {
					hostAddr[h.ID] = a
				}
			}
		}
	}
	added := false
	for _, d := range ds {
		id := ProcessID(d.HostID, d.Comm)
		i, ok := idx[id]
		if !ok {
			i = len(g.Nodes)
			idx[id] = i
			g.Nodes = append(g.Nodes, Node{ID: id, Kind: KindProcess, Host: d.HostID, Addr: hostAddr[d.HostID], Process: d.Comm})
			added = true
		}
		g.Nodes[i].DNS = mergeDNS(g.Nodes[i].DNS, []DNSStats{{Proto: d.Proto, Resolver: d.Resolver, DNSCounters: d.DNSCounters}})
	}
	if added {
		slices.SortFunc(g.Nodes, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	}
}
