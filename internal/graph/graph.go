// Package graph turns stored observations into the dependency graph:
// client processes pointing at services, the two ends of a dependency
// joined into one edge when both hosts run an agent, and endpoints of hosts
// without an agent kept as external nodes.
package graph

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// Node kinds.
const (
	KindProcess  = "process"  // a client process on a host: (host, process)
	KindService  = "service"  // a listening service: (host, proto, port) or (host, unix socket path), with its process
	KindExternal = "external" // an endpoint on a host that runs no agent
)

// Node is one vertex. JSON field names are part of the documented format
// (docs/graph.md).
type Node struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Host    string `json:"host"`
	Addr    string `json:"addr"`
	Port    uint16 `json:"port"`
	Proto   string `json:"proto"`
	Process string `json:"process"`
	// Identity names the process of a process or service node the way
	// operators do (systemd unit, container, Kubernetes pod and
	// workload), as its agent saw it in the range; every field is absent
	// for a plain host process, an external node, or a store written
	// without identities.
	tracer.Identity
	// Name (format 2) is what a workload node is called: its workload,
	// pod, container, systemd service or process; the host's id for a
	// host node.
	Name string `json:"name,omitempty"`
	// RemoteName is an external server's DNS name: the name its clients
	// asked for and got Addr in an answer (the latest seen in the range),
	// also its Name; empty when no answer named it.
	RemoteName string `json:"remote_name,omitempty"`
	// Processes (format 2) names the processes of a workload node when
	// there are several; Process then joins them with commas.
	Processes []string `json:"processes,omitempty"`
	// members (format 2) are the identities of the nodes a grouped node
	// gathers: a host node has none of its own, and a workload's keeps
	// only what all of them share (two replicas' container names differ),
	// yet a target that names one of them means the node (Resolve).
	members []tracer.Identity
	// Listen queue of a TCP service whose agent reports listener state:
	// the listen backlog, the deepest accept queue seen in the range, and
	// handshake packets dropped because the queue was full. Nil otherwise.
	Listener *ListenerState `json:"listener,omitempty"`
	// Services (format 2) are the services a workload node listens on.
	Services []Service `json:"services,omitempty"`
	// DNS are the client's lookups over the range, per resolver (AddDNS);
	// JudgeDNS sets their health and folds it into the node's.
	DNS []DNSStats `json:"dns,omitempty"`
	// Unhealthy marks a service that dropped connections or that nothing
	// answered (Unanswered); Reasons says why, one phrase each. Health
	// (set by Judge) is ok, degraded or unhealthy.
	Unhealthy bool     `json:"unhealthy"`
	Reasons   []string `json:"reasons,omitempty"`
	Health    string   `json:"health,omitempty"`
	// Unanswered (set by Judge) marks a service node (format 1) that
	// clients asked for and nothing answered.
	Unanswered bool `json:"unanswered,omitempty"`
}

// ListenerState is a service's accept queue over the range.
type ListenerState struct {
	BacklogLimit uint32 `json:"backlog_limit"`
	QueueMax     uint32 `json:"queue_max"`
	Drops        uint64 `json:"drops"`
}

// Edge points from a client (process or external client) to a service
// (service or external server). Its counters are the client's point of
// view: *Sent flows client to server, *Received server to client (bytes,
// datagrams, resets), whichever end reported them.
type Edge struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Proto string `json:"proto"`
	Port  uint16 `json:"port"`
	// Addrs, on a unix edge of a grouped graph (Group), are the socket
	// paths it merges, sorted: one workload may serve several, all port 0.
	// (A format-1 edge's service node has its path as Addr.)
	Addrs []string `json:"addrs,omitempty"`
	tracer.Counters
	// ConnectLatencyAvgUs is connect_latency_sum_us / connect_latency_count
	// (0 when nothing was measured).
	ConnectLatencyAvgUs uint64 `json:"connect_latency_avg_us"`
	// RTTAvgUs is rtt_sum_us / rtt_samples (0 without a sample): the
	// average smoothed RTT of the edge's TCP connections.
	RTTAvgUs  uint64    `json:"rtt_avg_us"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Unhealthy: failed connections, resets or retransmissions at rates
	// over the thresholds (Health); Reasons says which, with the numbers.
	// Health (set by Judge) is ok, degraded or unhealthy.
	Unhealthy bool     `json:"unhealthy"`
	Reasons   []string `json:"reasons,omitempty"`
	Health    string   `json:"health,omitempty"`
}

// health judges the edge by the default thresholds (DefaultHealth).
func (e *Edge) health() { e.judge(DefaultHealth) }

// Graph is a set of nodes and the edges between them.
type Graph struct {
	// Format is 2 for a grouped graph (Group), 0 (not written) for the
	// process/service graph of format 1.
	Format int    `json:"format,omitempty"`
	Nodes  []Node `json:"nodes"`
	Edges  []Edge `json:"edges"`
}

// ProcessID, ServiceID and ExternalID build node ids.
func ProcessID(host, process string) string { return "process:" + host + "/" + process }
func ServiceID(host, proto string, port uint16) string {
	return "service:" + host + "/" + proto + "/" + strconv.Itoa(int(port))
}

// UnixServiceID names a unix-socket service: a socket path (or "@name"
// for an abstract socket) on a host.
func UnixServiceID(host, path string) string { return "service:" + host + "/unix:" + path }

// ExternalID names an endpoint on a host that runs no agent: a server by
// its address and port ("external:203.0.113.7:443"), with its protocol
// after when it is not TCP ("external:203.0.113.53:53/udp": a resolver
// asked over UDP and over TCP is two services); a client by its address
// alone (port 0, no protocol). A server without a port is the agent's
// fold of a process's further peers (--max-edges-per-node), one per
// protocol: "external:_other/tcp", "external:_other/udp".
func ExternalID(addr, proto string, port uint16) string {
	if port == 0 {
		if proto != "" {
			return "external:" + addr + "/" + proto
		}
		return "external:" + addr
	}
	id := "external:" + netip.AddrPortFrom(netip.MustParseAddr(addr), port).String()
	if proto != "" && proto != string(tracer.ProtoTCP) {
		id += "/" + proto
	}
	return id
}

// owners maps an address to the hosts that held it, earliest last
// sighting first. Loopback and unspecified addresses belong to whichever
// host observed them.
type owners map[string][]holding

type holding struct {
	host string
	last time.Time // when the host was last seen holding the address
}

func newOwners(hosts []store.Host) owners {
	o := owners{}
	for _, h := range hosts {
		for i, a := range h.Addrs {
			if ip, err := netip.ParseAddr(a); err == nil && !ip.IsLoopback() && !ip.IsUnspecified() && !ip.IsLinkLocalUnicast() {
				var at time.Time
				if i < len(h.AddrsSeen) {
					at = h.AddrsSeen[i]
				}
				o[a] = append(o[a], holding{h.ID, at})
			}
		}
	}
	for _, hs := range o {
		slices.SortStableFunc(hs, func(x, y holding) int { return x.last.Compare(y.last) })
	}
	return o
}

// of is the host that held addr at t.
//   - The observer itself, if it holds it; else only holders on the
//     observer's machine (hosts whose ids share the part before "/"), if
//     any: a container calling its machine's docker0 address, which every
//     Docker host holds, calls its own machine.
//   - Of those, if several held it one after another (a container's or
//     a pod's address, given to another once it was gone), the first
//     still seen holding it at t, so that each holder's traffic joins its
//     own host's and the old holder's is not made a second edge from the
//     new one; after every sighting (or with no t) the one seen last.
//     Among holders last seen at the same time, the last listed, as
//     before.
func (o owners) of(addr, observer string, t time.Time) (string, bool) {
	if ip, err := netip.ParseAddr(addr); err == nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		return observer, true
	}
	hs := o[addr]
	switch len(hs) {
	case 0:
		return "", false
	case 1:
		return hs[0].host, true
	}
	// The holders on the observer's machine, if any, else all of them.
	machine := machineOf(observer)
	if k := slices.IndexFunc(hs, func(h holding) bool { return machineOf(h.host) == machine }); k >= 0 {
		mine := make([]holding, 0, len(hs)-k)
		for _, h := range hs[k:] {
			if h.host == observer {
				return h.host, true
			}
			if machineOf(h.host) == machine {
				mine = append(mine, h)
			}
		}
		hs = mine
	}
	i := len(hs) - 1
	if !t.IsZero() {
		if j := slices.IndexFunc(hs, func(h holding) bool { return !h.last.Before(t) }); j >= 0 {
			i = j
		}
	}
	for i+1 < len(hs) && hs[i+1].last.Equal(hs[i].last) {
		i++
	}
	return hs[i].host, true
}

// machineOf is the machine a host id is on: the agent's --host-id, before
// any "/" (its namespaces' hosts are "<id>/<name>").
func machineOf(host string) string {
	m, _, _ := strings.Cut(host, "/")
	return m
}

// seenAt is when an observation says its traffic began (its last sighting
// if it has no first), the time its remote address is resolved at.
func seenAt(o *store.Observation) time.Time {
	if !o.FirstSeen.IsZero() {
		return o.FirstSeen
	}
	return o.LastSeen
}

// side is one end's view of a dependency, summed.
type side struct {
	client, server         string // host ids, or "" when external
	clientAddr, serverAddr string
	proto                  string
	port                   uint16
	process                string
	c                      tracer.Counters // the client's point of view
	first, last            time.Time
	// members (built with track) are the indices of the observations
	// summed into this side.
	members []int32
	// remoteName is the server's DNS name (outbound to an external
	// server), from the latest flow that had one; nameSeen its time.
	remoteName string
	nameSeen   time.Time
}

// clientView turns a server's counters to the client's point of view.
func clientView(c tracer.Counters, outbound bool) tracer.Counters {
	if !outbound {
		c.BytesSent, c.BytesReceived = c.BytesReceived, c.BytesSent
		c.DatagramsSent, c.DatagramsReceived = c.DatagramsReceived, c.DatagramsSent
		c.ResetsSent, c.ResetsReceived = c.ResetsReceived, c.ResetsSent
	}
	return c
}

func (s *side) add(o store.Observation, outbound bool) {
	s.c.Add(clientView(o.Counters, outbound))
	if o.RemoteName != "" && (s.remoteName == "" || !o.LastSeen.Before(s.nameSeen)) {
		s.remoteName, s.nameSeen = o.RemoteName, o.LastSeen
	}
	if s.first.IsZero() || (!o.FirstSeen.IsZero() && o.FirstSeen.Before(s.first)) {
		s.first = o.FirstSeen
	}
	if o.LastSeen.After(s.last) {
		s.last = o.LastSeen
	}
}

// Build joins observations into the graph. For every dependency the
// client's view gives the counters when the client runs an agent, the
// server's otherwise; the server's view names the service's process.
// Listener state goes on the service nodes; a listener that dropped
// connections makes its service node even when no edge reached it.
func Build(obs []store.Observation, hosts []store.Host, listeners []store.Listener) Graph {
	return build(obs, hosts, listeners, false).graph()
}

// build joins obs into a builder; with track, the builder also records
// which edge each observation's counters went into (obsEdge).
func build(obs []store.Observation, hosts []store.Host, listeners []store.Listener, track bool) *builder {
	own := newOwners(hosts)
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

	type outKey struct {
		client, process, server, serverAddr, proto string
		port                                       uint16
	}
	type inKey struct {
		server, proto      string
		port               uint16
		client, clientAddr string
	}
	outIdx := make(map[outKey]int32, len(obs))
	outs := make([]side, 0, len(obs))
	ins := make(map[inKey]*side, len(obs)/4)
	var unix []store.Observation
	var unixIdx []int32
	for oi, o := range obs {
		if o.Proto == string(tracer.ProtoUnix) {
			unix = append(unix, o)
			if track {
				unixIdx = append(unixIdx, int32(oi))
			}
			continue
		}
		if o.Direction == "outbound" {
			server, _ := own.of(o.RemoteAddr, o.HostID, seenAt(&o))
			k := outKey{o.HostID, o.Comm, server, "", o.Proto, o.Port}
			if server == "" {
				k.serverAddr = o.RemoteAddr
			}
			i, ok := outIdx[k]
			if !ok {
				i = int32(len(outs))
				outIdx[k] = i
				outs = append(outs, side{client: o.HostID, server: server, serverAddr: o.RemoteAddr, proto: o.Proto, port: o.Port, process: o.Comm})
			}
			outs[i].add(o, true)
			if track {
				outs[i].members = append(outs[i].members, int32(oi))
			}
			continue
		}
		client, _ := own.of(o.RemoteAddr, o.HostID, seenAt(&o))
		k := inKey{o.HostID, o.Proto, o.Port, client, ""}
		if client == "" {
			k.clientAddr = o.RemoteAddr
		}
		s := ins[k]
		if s == nil {
			s = &side{client: client, clientAddr: o.RemoteAddr, server: o.HostID, serverAddr: o.LocalAddr, proto: o.Proto, port: o.Port}
			ins[k] = s
		}
		s.add(o, false)
		if track {
			s.members = append(s.members, int32(oi))
		}
		if o.Comm != "" && (s.process == "" || !o.LastSeen.Before(s.last)) {
			s.process = o.Comm
		}
	}

	// A client of a loopback address whose server end was redirected by a
	// NAT rule (Docker's embedded DNS: queries to 127.0.0.11:53 reach
	// dockerd on a random port of 127.0.0.11 in the same namespace) has no
	// inbound at the port it asked for; the server reports the port it
	// really listens on. Join them when exactly one such inbound is free.
	direct := map[inKey]bool{}
	for i := range outs {
		if out := &outs[i]; out.server != "" {
			direct[inKey{out.server, out.proto, out.port, out.client, ""}] = true
		}
	}
	type natKey struct{ server, proto, serverAddr, client string }
	natIns := map[natKey][]inKey{}
	for k, in := range ins {
		if ip, err := netip.ParseAddr(in.serverAddr); err == nil && ip.IsLoopback() && !direct[k] && in.client != "" {
			nk := natKey{in.server, in.proto, in.serverAddr, in.client}
			natIns[nk] = append(natIns[nk], k)
		}
	}
	redirected := func(out *side) (inKey, bool) {
		if ip, err := netip.ParseAddr(out.serverAddr); err != nil || !ip.IsLoopback() || out.server != out.client {
			return inKey{}, false
		}
		c := natIns[natKey{out.server, out.proto, out.serverAddr, out.client}]
		return firstIfOne(c)
	}

	g := newBuilder(len(obs))
	if track {
		g.obsEdge = make([]int32, len(obs))
		for i := range g.obsEdge {
			g.obsEdge[i] = -1
		}
	}
	matched := map[inKey]bool{}
	for i := range outs {
		out := &outs[i]
		from := g.nodeOf(nodeKey{'p', out.client, out.process, 0}, out.process, func() Node {
			return Node{ID: ProcessID(out.client, out.process), Kind: KindProcess, Host: out.client, Addr: hostAddr[out.client], Process: out.process}
		})
		var to int32
		if out.server == "" {
			to = g.nodeOf(nodeKey{'e', out.serverAddr, out.proto, out.port}, "", func() Node {
				return Node{ID: ExternalID(out.serverAddr, out.proto, out.port), Kind: KindExternal, Addr: out.serverAddr, Port: out.port, Proto: out.proto}
			})
			g.name(to, out)
		} else {
			ik := inKey{out.server, out.proto, out.port, out.client, ""}
			process := ""
			if in, ok := ins[ik]; ok {
				matched[ik] = true
				process = in.process
			} else if nk, ok := redirected(out); ok {
				matched[nk] = true
				process = ins[nk].process
			}
			to = g.nodeOf(nodeKey{'s', out.server, out.proto, out.port}, process, func() Node {
				return Node{ID: ServiceID(out.server, out.proto, out.port), Kind: KindService, Host: out.server,
					Addr: hostAddr[out.server], Port: out.port, Proto: out.proto, Process: process}
			})
		}
		g.edge(from, to, out)
	}
	for k, in := range ins {
		if matched[k] {
			continue
		}
		to := g.nodeOf(nodeKey{'s', in.server, in.proto, in.port}, in.process, func() Node {
			return Node{ID: ServiceID(in.server, in.proto, in.port), Kind: KindService, Host: in.server,
				Addr: hostAddr[in.server], Port: in.port, Proto: in.proto, Process: in.process}
		})
		var from int32
		if in.client == "" {
			from = g.nodeOf(nodeKey{'e', in.clientAddr, "", 0}, "", func() Node {
				return Node{ID: ExternalID(in.clientAddr, "", 0), Kind: KindExternal, Addr: in.clientAddr}
			})
		} else {
			// The client host runs an agent that did not report this
			// dependency (it started later, or lost it): its process is
			// unknown.
			from = g.nodeOf(nodeKey{'p', in.client, "", 0}, "", func() Node {
				return Node{ID: ProcessID(in.client, ""), Kind: KindProcess, Host: in.client, Addr: hostAddr[in.client]}
			})
		}
		g.edge(from, to, in)
	}
	g.unix(unix, unixIdx, hostAddr)
	g.listeners(listeners, hostAddr)
	return g
}

// Joiner puts observations of parts of a range (a history's steps) on
// the edges of the range's graph. The client's and the server's records
// of one dependency are drained apart and can fall into different steps,
// and a step built alone would name the server by its port (its process
// is on the server's record) or the client as an unknown process, so the
// edge would change its ends from step to step. A Joiner joins and names
// the ends once, over the range, as Build does; Step then sums each
// observation onto the edge its flow feeds in the range's graph (the
// client's view wherever the range has it), so the steps sum to the
// range's totals.
type Joiner struct {
	b *builder
	// edgeOf is the index in b.list of the edge a flow's counters go to;
	// -1 for a server's record of a dependency its client reported.
	edgeOf map[flowID]int32
	// beyondOf: a unix sender's flow whose counts come off a receiver's
	// remainder edge (builder.obsBeyond).
	beyondOf map[flowID]int32
	hosts    []store.Host
}

// flowID is what Build reads of an observation to place it. The range's
// observations hold one per flow, each placed once (an address that moved
// to another host by when the flow was first seen), and a step's records
// of a flow go where the range placed it, so the steps sum to the range.
type flowID struct {
	host, dir, proto, local, remote, comm, peer string
	port                                        uint16
}

func flowOf(o *store.Observation) flowID {
	return flowID{o.HostID, o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, o.Comm, o.PeerComm, o.Port}
}

// NewJoiner joins the range's observations (one per flow, as
// store.Observations gives them; listeners name services as in Build).
func NewJoiner(obs []store.Observation, hosts []store.Host, listeners []store.Listener) *Joiner {
	b := build(obs, hosts, listeners, true)
	j := &Joiner{b: b, edgeOf: make(map[flowID]int32, len(obs)), beyondOf: map[flowID]int32{}, hosts: hosts}
	for i := range obs {
		k := flowOf(&obs[i])
		if e, ok := j.edgeOf[k]; !ok || e < 0 {
			j.edgeOf[k] = b.obsEdge[i]
		}
		if e, ok := b.obsBeyond[int32(i)]; ok {
			j.beyondOf[k] = e
		}
	}
	return j
}

// Step is the graph of obs, observations of a part of the range: the
// edges with observations of their own in it, with those observations'
// counters, judged by the default thresholds, and their ends (without
// listener state: a step's graph says nothing of listeners). keep, when
// not nil, selects the edges wanted by the range graph's edge. An
// observation of a flow the range did not have (written after the range
// was read) is placed by a Build of its own, as before the Joiner.
func (j *Joiner) Step(obs []store.Observation, keep func(*Edge) bool) Graph {
	var g Graph
	at := map[[2]string]int{}
	// add sums counters seen from first to last onto the step's copy of
	// the edge e.
	add := func(e Edge, c tracer.Counters, first, last time.Time) {
		k := [2]string{e.From, e.To}
		i, ok := at[k]
		if !ok {
			i = len(g.Edges)
			at[k] = i
			g.Edges = append(g.Edges, Edge{From: e.From, To: e.To, Proto: e.Proto, Port: e.Port})
		}
		x := &g.Edges[i]
		x.Counters.Add(c)
		if x.FirstSeen.IsZero() || (!first.IsZero() && first.Before(x.FirstSeen)) {
			x.FirstSeen = first
		}
		if last.After(x.LastSeen) {
			x.LastSeen = last
		}
	}
	var rest []store.Observation
	taken := map[int32]tracer.Counters{} // remainder edges: what their senders reported
	for i := range obs {
		o := &obs[i]
		id := flowOf(o)
		if ei, ok := j.beyondOf[id]; ok {
			c := taken[ei]
			c.Add(clientView(o.Counters, o.Direction == string(tracer.Outbound)))
			taken[ei] = c
		}
		ei, ok := j.edgeOf[id]
		if !ok {
			rest = append(rest, *o)
			continue
		}
		if ei < 0 || (keep != nil && !keep(&j.b.list[ei])) {
			continue
		}
		add(j.b.list[ei], clientView(o.Counters, o.Direction == string(tracer.Outbound)), o.FirstSeen, o.LastSeen)
	}
	nodes := map[string]Node{}
	if len(rest) > 0 {
		late := Build(rest, j.hosts, nil)
		for _, n := range late.Nodes {
			nodes[n.ID] = n
		}
		for _, x := range late.Edges {
			if keep != nil && !keep(&x) {
				continue
			}
			add(x, x.Counters, x.FirstSeen, x.LastSeen)
		}
	}
	for ei, c := range taken {
		e := j.b.list[ei]
		if i, ok := at[[2]string{e.From, e.To}]; ok {
			g.Edges[i].Counters = beyond(g.Edges[i].Counters, c)
		}
	}
	for i := range g.Edges {
		e := &g.Edges[i]
		e.health()
		e.RTTAvgUs = e.Counters.RTTAvgUs()
		for _, id := range []string{e.From, e.To} {
			if n, ok := j.b.byID[id]; ok {
				nodes[id] = j.b.nodes[n] // the range's name wins over a late Build's
			}
		}
	}
	seen := map[string]bool{}
	for _, e := range g.Edges {
		for _, id := range []string{e.From, e.To} {
			if !seen[id] {
				seen[id] = true
				n := nodes[id]
				n.Listener, n.Unhealthy, n.Reasons = nil, false, nil
				g.Nodes = append(g.Nodes, n)
			}
		}
	}
	slices.SortFunc(g.Nodes, func(x, y Node) int { return cmp.Compare(x.ID, y.ID) })
	slices.SortFunc(g.Edges, func(x, y Edge) int { return cmp.Or(cmp.Compare(x.From, y.From), cmp.Compare(x.To, y.To)) })
	return g
}

// unix joins unix-socket flows. Both ends are on one host: the client
// reports (outbound) the server's socket path and the server process as
// its peer; the server reports (inbound) its socket path and the client
// process as its peer. The client's view gives the counters when there
// is one.
func (b *builder) unix(obs []store.Observation, idx []int32, hostAddr map[string]string) {
	type key struct{ host, path, client string }
	type pair struct {
		out, in *side
		server  string // process
	}
	pairs := map[key]*pair{}
	var order []key
	for oi, o := range obs {
		outbound := o.Direction == string(tracer.Outbound)
		k := key{o.HostID, o.LocalAddr, o.PeerComm}
		server := o.Comm
		if outbound {
			k, server = key{o.HostID, o.RemoteAddr, o.Comm}, o.PeerComm
		}
		p := pairs[k]
		if p == nil {
			p = &pair{}
			pairs[k] = p
			order = append(order, k)
		}
		sd := &p.in
		if outbound {
			sd = &p.out
		}
		if *sd == nil {
			*sd = &side{client: k.host, server: k.host, serverAddr: k.path, proto: string(tracer.ProtoUnix), process: k.client}
		}
		(*sd).add(o, outbound)
		if idx != nil {
			(*sd).members = append((*sd).members, idx[oi])
		}
		// The server process: the latest name either end gave.
		if server != "" && (p.server == "" || !o.LastSeen.Before((*sd).last)) {
			p.server = server
		}
	}
	// A receiver that does not learn who sent (a datagram socket's, or a
	// stream server's whose clients no agent traced: no peer process) has
	// one unnamed view of every such sender. The senders that reported
	// without a receiver's view of their own (a pair with no inbound
	// side) are already in it: only what is left beyond their counts is
	// an unnamed client's. The server's name is the latest any view gave,
	// for senders that do not know it.
	type at struct{ host, path string }
	reported := map[at]tracer.Counters{}
	reportedBy := map[at][]int32{} // their observations (track)
	serverOf := map[at]string{}
	serverSeen := map[at]time.Time{}
	for _, k := range order {
		p, a := pairs[k], at{k.host, k.path}
		if p.out != nil && p.in == nil {
			c := reported[a]
			c.Add(p.out.c)
			reported[a] = c
			reportedBy[a] = append(reportedBy[a], p.out.members...)
		}
		for _, sd := range []*side{p.out, p.in} {
			if sd != nil && p.server != "" && (serverOf[a] == "" || !sd.last.Before(serverSeen[a])) {
				serverOf[a], serverSeen[a] = p.server, sd.last
			}
		}
	}
	for _, k := range order {
		p := pairs[k]
		a := at{k.host, k.path}
		if c, ok := reported[a]; ok && p.out == nil && k.client == "" {
			p.in.c = beyond(p.in.c, c)
			if p.in.c.IsZero() {
				continue
			}
		}
		server := p.server
		if server == "" {
			server = serverOf[a]
		}
		from := b.node(Node{ID: ProcessID(k.host, k.client), Kind: KindProcess, Host: k.host, Addr: hostAddr[k.host], Process: k.client})
		to := b.node(Node{ID: UnixServiceID(k.host, k.path), Kind: KindService, Host: k.host, Addr: k.path, Proto: string(tracer.ProtoUnix), Process: server})
		sd := p.out
		if sd == nil {
			sd = p.in
		}
		b.edge(from, to, sd)
		if _, ok := reported[a]; ok && p.out == nil && k.client == "" && idx != nil {
			if b.obsBeyond == nil {
				b.obsBeyond = map[int32]int32{}
			}
			for _, m := range reportedBy[a] {
				b.obsBeyond[m] = b.edges[[2]int32{from, to}]
			}
		}
	}
}

// beyond is what a receiver's view c (the client's point of view) holds
// past the senders' own reports seen: the volume counters, each at least 0.
func beyond(c, seen tracer.Counters) tracer.Counters {
	sub := func(a, b uint64) uint64 { return a - min(a, b) }
	return tracer.Counters{
		Connections:       sub(c.Connections, seen.Connections),
		BytesSent:         sub(c.BytesSent, seen.BytesSent),
		BytesReceived:     sub(c.BytesReceived, seen.BytesReceived),
		DatagramsSent:     sub(c.DatagramsSent, seen.DatagramsSent),
		DatagramsReceived: sub(c.DatagramsReceived, seen.DatagramsReceived),
	}
}

// listeners puts each service's accept-queue state on its node: summed
// drops and deepest queue over its addresses, the largest backlog.
func (b *builder) listeners(ls []store.Listener, hostAddr map[string]string) {
	for _, l := range ls {
		id := ServiceID(l.HostID, l.Proto, l.Port)
		i, ok := b.byID[id]
		if !ok {
			if l.Drops == 0 {
				continue
			}
			i = b.node(Node{ID: id, Kind: KindService, Host: l.HostID, Addr: hostAddr[l.HostID], Port: l.Port, Proto: l.Proto, Process: l.Comm})
		}
		n := &b.nodes[i]
		if n.Listener == nil {
			n.Listener = &ListenerState{}
		}
		n.Listener.BacklogLimit = max(n.Listener.BacklogLimit, l.BacklogLimit)
		n.Listener.QueueMax = max(n.Listener.QueueMax, l.QueueMax)
		n.Listener.Drops += l.Drops
		if n.Process == "" {
			n.Process = l.Comm
		}
	}
	for i := range b.nodes {
		n := &b.nodes[i]
		if n.Listener != nil && n.Listener.Drops > 0 {
			n.Unhealthy = true
			n.Reasons = []string{fmt.Sprintf("accept queue full: %d handshake packets dropped (SYNs and ACKs, a retry counted again; backlog %d, deepest queue %d)",
				n.Listener.Drops, n.Listener.BacklogLimit, n.Listener.QueueMax)}
		}
	}
}

type builder struct {
	nodes []Node
	byID  map[string]int32
	byKey map[nodeKey]int32
	edges map[[2]int32]int32 // (from, to) node indices to an index in edgeList
	list  []Edge
	// nameSeen: when the remote name of an external node was seen.
	nameSeen map[int32]time.Time
	// obsEdge (built with track) is, per observation, the index in list
	// of the edge its counters went into, or -1.
	obsEdge []int32
	// obsBeyond (built with track): a unix sender's observation whose
	// counts a receiver's unnamed view also holds, to the index of the
	// edge that keeps only the view's remainder (see unix); its counts
	// are taken off that edge's in each step too.
	obsBeyond map[int32]int32
}

func newBuilder(sizeHint int) *builder {
	return &builder{byID: make(map[string]int32, sizeHint/4), byKey: make(map[nodeKey]int32, sizeHint/4), edges: make(map[[2]int32]int32, sizeHint),
		nodes: make([]Node, 0, sizeHint/4), list: make([]Edge, 0, sizeHint)}
}

// nodeKey names a node by the values its id is built from (kind, two
// strings, a port), so that finding a node already added builds no id.
type nodeKey struct {
	kind byte
	a, b string
	port uint16
}

// nodeOf is node(mk()), remembered by k: the same key always builds the
// same id, so the answer is node's (two keys with one id, which node
// merges, still reach one node).
func (b *builder) nodeOf(k nodeKey, process string, mk func() Node) int32 {
	if i, ok := b.byKey[k]; ok {
		if b.nodes[i].Process == "" {
			b.nodes[i].Process = process
		}
		return i
	}
	i := b.node(mk())
	b.byKey[k] = i
	return i
}

// node adds n, or completes an existing node's missing process name, and
// returns its index.
func (b *builder) node(n Node) int32 {
	if i, ok := b.byID[n.ID]; ok {
		if b.nodes[i].Process == "" {
			b.nodes[i].Process = n.Process
		}
		return i
	}
	i := int32(len(b.nodes))
	b.byID[n.ID] = i
	b.nodes = append(b.nodes, n)
	return i
}

// name gives external node i the remote name of s when s saw it later
// than the name the node has (several clients, one address).
func (b *builder) name(i int32, s *side) {
	if s.remoteName == "" {
		return
	}
	if b.nameSeen == nil {
		b.nameSeen = map[int32]time.Time{}
	}
	n := &b.nodes[i]
	if seen, ok := b.nameSeen[i]; !ok || !s.nameSeen.Before(seen) {
		n.RemoteName, n.Name, b.nameSeen[i] = s.remoteName, s.remoteName, s.nameSeen
	}
}

func (b *builder) edge(from, to int32, s *side) {
	k := [2]int32{from, to}
	i, ok := b.edges[k]
	if !ok {
		i = int32(len(b.list))
		b.edges[k] = i
		b.list = append(b.list, Edge{From: b.nodes[from].ID, To: b.nodes[to].ID, Proto: s.proto, Port: s.port, FirstSeen: s.first})
	}
	for _, m := range s.members {
		b.obsEdge[m] = i
	}
	e := &b.list[i]
	e.Counters.Add(s.c)
	if !s.first.IsZero() && s.first.Before(e.FirstSeen) {
		e.FirstSeen = s.first
	}
	if s.last.After(e.LastSeen) {
		e.LastSeen = s.last
	}
}

// graph sorts nodes by id and edges by (from, to). Edges are sorted by
// their ends' ranks among the sorted nodes, which is the same order as
// comparing the id strings but costs two integer compares.
func (b *builder) graph() Graph {
	order := make([]int32, len(b.nodes))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(x, y int32) int { return cmp.Compare(b.nodes[x].ID, b.nodes[y].ID) })
	rank := make([]int32, len(b.nodes))
	g := Graph{Nodes: make([]Node, 0, len(b.nodes)), Edges: make([]Edge, 0, len(b.list))}
	for r, i := range order {
		rank[i] = int32(r)
		g.Nodes = append(g.Nodes, b.nodes[i])
	}
	type ranked struct {
		from, to int32
		i        int32
	}
	es := make([]ranked, 0, len(b.list))
	for k, i := range b.edges {
		es = append(es, ranked{rank[k[0]], rank[k[1]], i})
	}
	slices.SortFunc(es, func(x, y ranked) int { return cmp.Or(cmp.Compare(x.from, y.from), cmp.Compare(x.to, y.to)) })
	for _, r := range es {
		e := b.list[r.i]
		e.health()
		e.RTTAvgUs = e.Counters.RTTAvgUs()
		g.Edges = append(g.Edges, e)
	}
	return g
}

// Name puts on each process and service node the identity of its
// process on its host (store.Identities of the graph's range). When one
// process name on a host was several things in the range (two
// host-network containers running the same command, a container
// replaced), the one seen last names it.
func Name(g *Graph, ids []store.EndIdentity) {
	if len(ids) == 0 {
		return
	}
	type hc struct{ host, comm string }
	latest := make(map[hc]*store.EndIdentity, len(ids))
	for i := range ids {
		k := hc{ids[i].HostID, ids[i].Comm}
		if e := latest[k]; e == nil || !ids[i].LastSeen.Before(e.LastSeen) {
			latest[k] = &ids[i]
		}
	}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Kind == KindExternal || n.Process == "" {
			continue
		}
		if e := latest[hc{n.Host, n.Process}]; e != nil {
			n.Identity = e.Identity
		}
	}
}

// firstIfOne returns the only element of ks, if there is exactly one.
func firstIfOne[T any](ks []T) (T, bool) {
	var zero T
	if len(ks) != 1 {
		return zero, false
	}
	return ks[0], true
}
