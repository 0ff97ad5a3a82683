package graph

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

var at = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

func o(host, dir, local, remote string, port uint16, comm string, conns, sent, recv uint64) store.Observation {
	return store.Observation{HostID: host, Direction: dir, Proto: "tcp", LocalAddr: local, RemoteAddr: remote, Port: port,
		Comm: comm, Counters: tracer.Counters{Connections: conns, BytesSent: sent, BytesReceived: recv}, FirstSeen: at, LastSeen: at.Add(time.Minute)}
}

var hosts = []store.Host{
	{ID: "client", Addrs: []string{"198.51.100.1", "127.0.0.1", "fe80::1"}},
	{ID: "web", Addrs: []string{"198.51.100.2", "127.0.0.1", "fe80::1"}},
	{ID: "app", Addrs: []string{"198.51.100.3"}},
	{ID: "db", Addrs: []string{"198.51.100.4"}},
}

// client -> web:80 (nginx) -> app:8080 (app) -> db:5432 (postgres), all
// four running agents; app also calls an external API.
func chain() []store.Observation {
	return []store.Observation{
		o("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", 5, 500, 5000),
		o("web", "inbound", "198.51.100.2", "198.51.100.1", 80, "nginx", 5, 5000, 500),
		o("web", "outbound", "198.51.100.2", "198.51.100.3", 8080, "nginx", 5, 600, 4000),
		o("app", "inbound", "198.51.100.3", "198.51.100.2", 8080, "app", 5, 4000, 600),
		o("app", "outbound", "198.51.100.3", "198.51.100.4", 5432, "app", 20, 100, 900),
		o("db", "inbound", "198.51.100.4", "198.51.100.3", 5432, "postgres", 20, 900, 100),
		o("app", "outbound", "198.51.100.3", "203.0.113.7", 443, "app", 1, 10, 20),
	}
}

func edge(t *testing.T, g Graph, from, to string) Edge {
	t.Helper()
	for _, e := range g.Edges {
		if e.From == from && e.To == to {
			return e
		}
	}
	t.Fatalf("no edge %s -> %s in %+v", from, to, g.Edges)
	return Edge{}
}

func node(t *testing.T, g Graph, id string) Node {
	t.Helper()
	for _, n := range g.Nodes {
		if n.ID == id {
			return n
		}
	}
	t.Fatalf("no node %s", id)
	return Node{}
}

func TestBothEndsJoinIntoOneEdge(t *testing.T) {
	g := Build(chain(), hosts, nil)
	if len(g.Edges) != 4 {
		t.Fatalf("%d edges, want 4: %+v", len(g.Edges), g.Edges)
	}
	e := edge(t, g, ProcessID("web", "nginx"), ServiceID("app", "tcp", 8080))
	if e.Connections != 5 || e.BytesSent != 600 || e.BytesReceived != 4000 {
		t.Errorf("joined edge should carry the client's counters: %+v", e)
	}
	if n := node(t, g, ServiceID("app", "tcp", 8080)); n.Process != "app" || n.Addr != "198.51.100.3" {
		t.Errorf("service node: %+v", n)
	}
	if n := node(t, g, ServiceID("db", "tcp", 5432)); n.Process != "postgres" {
		t.Errorf("server process not named: %+v", n)
	}
	ext := edge(t, g, ProcessID("app", "app"), ExternalID("203.0.113.7", "tcp", 443))
	if ext.Connections != 1 {
		t.Errorf("external edge: %+v", ext)
	}
	if n := node(t, g, ExternalID("203.0.113.7", "tcp", 443)); n.Kind != KindExternal || n.Port != 443 {
		t.Errorf("external node: %+v", n)
	}
}

func TestOnlyTheServerReports(t *testing.T) {
	// A client with no agent: the server's view makes the edge, from an
	// external client, with bytes turned to the client's point of view.
	g := Build([]store.Observation{o("db", "inbound", "198.51.100.4", "203.0.113.9", 5432, "postgres", 3, 900, 100)}, hosts, nil)
	e := edge(t, g, ExternalID("203.0.113.9", "", 0), ServiceID("db", "tcp", 5432))
	if e.Connections != 3 || e.BytesSent != 100 || e.BytesReceived != 900 {
		t.Errorf("%+v", e)
	}
}

// One resolver asked over UDP and over TCP is two external services: two
// nodes and two edges, each with its own protocol and counters (they were
// one node id, and grouping summed them into one edge).
func TestExternalOverTCPAndUDPAreTwoServices(t *testing.T) {
	tcpDNS := o("client", "outbound", "198.51.100.1", "203.0.113.53", 53, "dig", 2, 40, 400)
	udpDNS := o("client", "outbound", "198.51.100.1", "203.0.113.53", 53, "dig", 0, 30, 300)
	udpDNS.Proto, udpDNS.DatagramsSent, udpDNS.DatagramsReceived = "udp", 3, 3
	g := Build([]store.Observation{tcpDNS, udpDNS}, hosts, nil)
	tcpID, udpID := ExternalID("203.0.113.53", "tcp", 53), ExternalID("203.0.113.53", "udp", 53)
	if tcpID != "external:203.0.113.53:53" || udpID != "external:203.0.113.53:53/udp" {
		t.Fatalf("ids %q %q", tcpID, udpID)
	}
	if e := edge(t, g, ProcessID("client", "dig"), tcpID); e.Proto != "tcp" || e.Connections != 2 || e.DatagramsSent != 0 {
		t.Errorf("tcp edge %+v", e)
	}
	if e := edge(t, g, ProcessID("client", "dig"), udpID); e.Proto != "udp" || e.Connections != 0 || e.DatagramsSent != 3 {
		t.Errorf("udp edge %+v", e)
	}
	w := Group(g, ByWorkload)
	if len(w.Edges) != 2 {
		t.Errorf("grouped: %d edges, want 2: %+v", len(w.Edges), w.Edges)
	}
}

// The agent folds a process's peers past --max-edges-per-node into one
// edge per direction and protocol to "_other", port 0: the TCP and UDP
// folds stay two edges (they were one, labelled with the first's
// protocol, carrying both's counters), and the inbound fold stays apart.
func TestFoldedPeersStayApartByProtocol(t *testing.T) {
	tcpOther := o("client", "outbound", "198.51.100.1", "_other", 0, "scanner", 0, 0, 0)
	tcpOther.FailedConnections, tcpOther.FailedRefused = 9950, 9950
	udpOther := o("client", "outbound", "198.51.100.1", "_other", 0, "scanner", 0, 200000, 0)
	udpOther.Proto, udpOther.DatagramsSent = "udp", 20000
	inOther := o("client", "inbound", "198.51.100.1", "_other", 7000, "srv", 0, 0, 0)
	inOther.Proto, inOther.DatagramsReceived = "udp", 200
	g := Build([]store.Observation{tcpOther, udpOther, inOther}, hosts, nil)
	tcpID, udpID := ExternalID("_other", "tcp", 0), ExternalID("_other", "udp", 0)
	if tcpID != "external:_other/tcp" || udpID != "external:_other/udp" || ExternalID("_other", "", 0) != "external:_other" {
		t.Fatalf("ids %q %q", tcpID, udpID)
	}
	if e := edge(t, g, ProcessID("client", "scanner"), tcpID); e.Proto != "tcp" || e.FailedConnections != 9950 || e.DatagramsSent != 0 {
		t.Errorf("tcp fold %+v", e)
	}
	if e := edge(t, g, ProcessID("client", "scanner"), udpID); e.Proto != "udp" || e.FailedConnections != 0 || e.DatagramsSent != 20000 || e.BytesSent != 200000 {
		t.Errorf("udp fold %+v", e)
	}
	if e := edge(t, g, "external:_other", ServiceID("client", "udp", 7000)); e.DatagramsReceived != 0 || e.DatagramsSent != 200 {
		t.Errorf("inbound fold %+v", e)
	}
	if w := Group(g, ByWorkload); len(w.Edges) != 3 {
		t.Errorf("grouped: %d edges, want 3: %+v", len(w.Edges), w.Edges)
	}
	var b bytes.Buffer
	WriteTrees(&b, Look(g, []string{ProcessID("client", "scanner")}, 1, true, false, 0), true, false)
	for _, want := range []string{"-> tcp _other (external)", "-> udp _other (external)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("look lacks %q:\n%s", want, b.String())
		}
	}
}

// An address that moved to another host (a container's address given to
// a new one): each holder's traffic joins its own host's, in both
// directions. The old holder's dependency was counted twice, once more as
// an edge from the new holder's unknown process. The observations are
// shaped as the store gives a range: one per flow, so the server's record
// of both holders' calls from the address is one, first seen before the
// move.
func TestMovedAddressJoinsEachHoldersTraffic(t *testing.T) {
	moved := "198.51.100.9"
	hs := append(slices.Clone(hosts),
		store.Host{ID: "old", Addrs: []string{moved}, AddrsSeen: []time.Time{at.Add(2 * time.Minute)}},
		store.Host{ID: "new", Addrs: []string{moved}, AddrsSeen: []time.Time{at.Add(time.Hour)}})
	later := o("new", "outbound", moved, "198.51.100.4", 5432, "worker", 2, 20, 10)
	later.FirstSeen, later.LastSeen = at.Add(30*time.Minute), at.Add(31*time.Minute)
	dbIn := o("db", "inbound", "198.51.100.4", moved, 5432, "postgres", 37, 1760, 3520)
	dbIn.LastSeen = later.LastSeen
	obs := []store.Observation{
		// the old holder calls db, and serves web, before the move
		o("old", "outbound", moved, "198.51.100.4", 5432, "front", 35, 3500, 1750),
		o("web", "outbound", "198.51.100.2", moved, 8080, "nginx", 7, 70, 700),
		o("old", "inbound", moved, "198.51.100.2", 8080, "api", 7, 700, 70),
		// the new holder calls db after it; db's record holds both
		later, dbIn,
	}
	g := Build(obs, hs, nil)
	db := ServiceID("db", "tcp", 5432)
	if e := edge(t, g, ProcessID("old", "front"), db); e.Connections != 35 || e.BytesSent != 3500 {
		t.Errorf("old holder's edge %+v", e)
	}
	if e := edge(t, g, ProcessID("new", "worker"), db); e.Connections != 2 || e.BytesSent != 20 {
		t.Errorf("new holder's edge %+v", e)
	}
	if e := edge(t, g, ProcessID("web", "nginx"), ServiceID("old", "tcp", 8080)); e.Connections != 7 {
		t.Errorf("the old holder as a server %+v", e)
	}
	var conns uint64
	for _, e := range g.Edges {
		conns += e.Connections
	}
	if len(g.Edges) != 3 || conns != 44 {
		t.Errorf("%d edges with %d connections, want 3 with 44: %+v", len(g.Edges), conns, g.Edges)
	}
}

// A server's address that moved to another host (a container recreated
// with the same address) within the range: the client's flow to it, one
// over the range and first seen before the move, goes whole to the old
// holder, and the new holder's record of the calls it served is an edge
// of its own from the client host's unknown process (docs/graph.md, the
// limit of "Short-lived ends"): the client's record does not say which
// holder answered, so nothing is split on a guess. The steps of a history
// sum to the range's edges.
func TestMovedServerAddressStaysOnTheFirstHolder(t *testing.T) {
	moved := "198.51.100.9"
	hs := append(slices.Clone(hosts),
		store.Host{ID: "m/old", Addrs: []string{moved}, AddrsSeen: []time.Time{at.Add(2 * time.Minute)}},
		store.Host{ID: "m/new", Addrs: []string{moved}, AddrsSeen: []time.Time{at.Add(time.Hour)}},
		store.Host{ID: "m/client", Addrs: []string{"198.51.100.8"}})
	after := func(x store.Observation) store.Observation {
		x.FirstSeen, x.LastSeen = at.Add(30*time.Minute), at.Add(31*time.Minute)
		return x
	}
	steps := [][]store.Observation{
		{o("m/client", "outbound", "198.51.100.8", moved, 8125, "qa", 60, 600, 6000), o("m/old", "inbound", moved, "198.51.100.8", 8125, "statsd", 60, 6000, 600)},
		{after(o("m/client", "outbound", "198.51.100.8", moved, 8125, "qa", 11, 110, 1100)), after(o("m/new", "inbound", moved, "198.51.100.8", 8125, "statsd", 11, 1100, 110))},
	}
	steps[1][0].FailedConnections, steps[1][0].FailedRefused = 4, 4 // while nothing held the address
	// The range: one observation per flow, the client's summed over both
	// steps and first seen before the move.
	clientFlow := steps[0][0]
	clientFlow.Counters.Add(steps[1][0].Counters)
	clientFlow.LastSeen = steps[1][0].LastSeen
	obs := []store.Observation{clientFlow, steps[0][1], steps[1][1]}
	g := Build(obs, hs, nil)
	from := ProcessID("m/client", "qa")
	if e := edge(t, g, from, ServiceID("m/old", "tcp", 8125)); e.Connections != 71 || e.FailedConnections != 4 {
		t.Errorf("the client's edge %+v; want its whole record, 71 connections and 4 failed", e.Counters)
	}
	if e := edge(t, g, ProcessID("m/client", ""), ServiceID("m/new", "tcp", 8125)); e.Connections != 11 {
		t.Errorf("the new holder's record %+v; want its 11 connections from the client host", e.Counters)
	}
	if len(g.Edges) != 2 {
		t.Errorf("%d edges, want 2: %+v", len(g.Edges), g.Edges)
	}

	j := NewJoiner(obs, hs, nil)
	sum := stepSums(j, steps)
	for _, e := range g.Edges {
		if got := sum[[2]string{e.From, e.To}]; got != e.Counters {
			t.Errorf("%s -> %s: the steps sum to %+v, the range has %+v", e.From, e.To, got, e.Counters)
		}
	}
}

// An address that several hosts hold at once (docker0's on every Docker
// host) is, to a host on one of those machines, its own machine's, at any
// time and whichever machine was seen last.
func TestSharedAddressIsTheObserversMachines(t *testing.T) {
	shared := "172.17.0.1"
	hs := []store.Host{
		{ID: "a", Addrs: []string{shared, "198.51.100.1"}, AddrsSeen: []time.Time{at.Add(10 * time.Minute), at.Add(10 * time.Minute)}},
		{ID: "b", Addrs: []string{shared, "198.51.100.2"}, AddrsSeen: []time.Time{at.Add(20 * time.Minute), at.Add(20 * time.Minute)}},
		{ID: "a/netns:1", Addrs: []string{"172.17.0.2"}},
		{ID: "b/netns:1", Addrs: []string{"172.17.0.2"}},
	}
	g := Build([]store.Observation{
		o("a/netns:1", "outbound", "172.17.0.2", shared, 8080, "curl", 3, 30, 300),
		o("a", "inbound", shared, "172.17.0.2", 8080, "api", 3, 300, 30),
		o("b/netns:1", "outbound", "172.17.0.2", shared, 8080, "wget", 5, 50, 500),
		o("b", "inbound", shared, "172.17.0.2", 8080, "api", 5, 500, 50),
	}, hs, nil)
	if e := edge(t, g, ProcessID("a/netns:1", "curl"), ServiceID("a", "tcp", 8080)); e.Connections != 3 {
		t.Errorf("a's container to a: %+v", e)
	}
	if e := edge(t, g, ProcessID("b/netns:1", "wget"), ServiceID("b", "tcp", 8080)); e.Connections != 5 {
		t.Errorf("b's container to b: %+v", e)
	}
	if len(g.Edges) != 2 {
		t.Errorf("%d edges, want 2: %+v", len(g.Edges), g.Edges)
	}
}

// stepSums adds up, per edge (from, to), the Joiner's graphs of steps.
func stepSums(j *Joiner, steps [][]store.Observation) map[[2]string]tracer.Counters {
	sum := map[[2]string]tracer.Counters{}
	for _, st := range steps {
		for _, e := range j.Step(st, nil).Edges {
			c := sum[[2]string{e.From, e.To}]
			c.Add(e.Counters)
			sum[[2]string{e.From, e.To}] = c
		}
	}
	return sum
}

// The history of a moved address's edges, from the store's step reads:
// each step's records of a flow go where the range placed the flow, so
// the steps sum to the range's edges.
func TestJoinerStepsSumToTheRangeForAMovedAddress(t *testing.T) {
	moved := "198.51.100.9"
	hs := append(slices.Clone(hosts),
		store.Host{ID: "old", Addrs: []string{moved}, AddrsSeen: []time.Time{at.Add(2 * time.Minute)}},
		store.Host{ID: "new", Addrs: []string{moved}, AddrsSeen: []time.Time{at.Add(time.Hour)}})
	at30 := func(x store.Observation) store.Observation {
		x.FirstSeen, x.LastSeen = at.Add(30*time.Minute), at.Add(31*time.Minute)
		return x
	}
	steps := [][]store.Observation{
		{o("old", "outbound", moved, "198.51.100.4", 5432, "front", 35, 3500, 1750), o("db", "inbound", "198.51.100.4", moved, 5432, "postgres", 35, 1750, 3500)},
		{at30(o("new", "outbound", moved, "198.51.100.4", 5432, "worker", 2, 20, 10)), at30(o("db", "inbound", "198.51.100.4", moved, 5432, "postgres", 2, 10, 20))},
	}
	// The range: one observation per flow, db's summed over both steps.
	dbIn := o("db", "inbound", "198.51.100.4", moved, 5432, "postgres", 37, 1760, 3520)
	dbIn.LastSeen = steps[1][1].LastSeen
	obs := []store.Observation{steps[0][0], steps[1][0], dbIn}
	whole := Build(obs, hs, nil)
	j := NewJoiner(obs, hs, nil)
	sum := stepSums(j, steps)
	if len(whole.Edges) != 2 || len(sum) != 2 {
		t.Fatalf("range edges %+v, steps' %v; want 2 each", whole.Edges, sum)
	}
	for _, e := range whole.Edges {
		if got := sum[[2]string{e.From, e.To}]; got != e.Counters {
			t.Errorf("%s -> %s: the steps sum to %+v, the range has %+v", e.From, e.To, got, e.Counters)
		}
	}
}

func TestLoopbackStaysOnTheHost(t *testing.T) {
	g := Build([]store.Observation{
		o("web", "outbound", "127.0.0.1", "127.0.0.1", 6379, "php", 2, 10, 10),
		o("web", "inbound", "127.0.0.1", "127.0.0.1", 6379, "redis-server", 2, 10, 10),
		o("client", "outbound", "127.0.0.1", "127.0.0.1", 6379, "other", 1, 1, 1), // another host's loopback
	}, hosts, nil)
	if len(g.Edges) != 2 {
		t.Fatalf("edges %+v", g.Edges)
	}
	edge(t, g, ProcessID("web", "php"), ServiceID("web", "tcp", 6379))
	if n := node(t, g, ServiceID("web", "tcp", 6379)); n.Process != "redis-server" {
		t.Errorf("%+v", n)
	}
	edge(t, g, ProcessID("client", "other"), ServiceID("client", "tcp", 6379))

	// Every host holds 127.0.0.1: look 127.0.0.1:6379 finds the service
	// on each host that has one (the last host to list the address used
	// to be the only one asked), and 127.0.0.1 what runs on each.
	got, err := Resolve(g, hosts, "127.0.0.1:6379")
	slices.Sort(got)
	if want := []string{ServiceID("client", "tcp", 6379), ServiceID("web", "tcp", 6379)}; err != nil || !slices.Equal(got, want) {
		t.Errorf("127.0.0.1:6379: %v %v; want %v", got, err, want)
	}
	g2 := Build([]store.Observation{o("web", "outbound", "127.0.0.1", "127.0.0.1", 6379, "php", 2, 10, 10),
		o("web", "inbound", "127.0.0.1", "127.0.0.1", 6379, "redis-server", 2, 10, 10)}, hosts, nil)
	if got, err := Resolve(g2, hosts, "127.0.0.1:6379"); err != nil || !slices.Equal(got, []string{ServiceID("web", "tcp", 6379)}) {
		t.Errorf("127.0.0.1:6379 with one host serving it: %v %v", got, err)
	}
	if got, err := Resolve(g2, hosts, "127.0.0.1"); err != nil || len(got) == 0 {
		t.Errorf("127.0.0.1: %v %v; want what runs on web", got, err)
	}
}

func TestResolve(t *testing.T) {
	g := Build(chain(), hosts, nil)
	cases := map[string][]string{
		"postgres":          {ProcessID("db", "postgres")},
		"198.51.100.4":      {ProcessID("db", "postgres")},
		"198.51.100.3:8080": {ServiceID("app", "tcp", 8080)},
		"app":               {ProcessID("app", "app")}, // host id "app" wins over process "app"; same entity here
		"203.0.113.7:443":   {ExternalID("203.0.113.7", "tcp", 443)},
	}
	for target, want := range cases {
		got, err := Resolve(g, hosts, target)
		if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v %v; want %v", target, got, err, want)
		}
	}
	if _, err := Resolve(g, hosts, "nosuch"); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Errorf("unknown target: %v", err)
	}
	// A machine traced only in its namespaces (--host-id vm --netns ...)
	// is found by its id: everything in them.
	nsHosts := []store.Host{{ID: "vm/qa-a", Addrs: []string{"198.51.100.1"}}, {ID: "vm/qa-b", Addrs: []string{"198.51.100.2"}}, {ID: "vmx", Addrs: []string{"198.51.100.3"}}}
	ns := Build([]store.Observation{
		o("vm/qa-a", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", 1, 10, 10),
		o("vm/qa-b", "inbound", "198.51.100.2", "198.51.100.1", 80, "nginx", 1, 10, 10),
		o("vmx", "outbound", "198.51.100.3", "198.51.100.2", 80, "wget", 1, 10, 10),
	}, nsHosts, nil)
	got, err := Resolve(ns, nsHosts, "vm")
	slices.Sort(got)
	if want := []string{ProcessID("vm/qa-a", "curl"), ProcessID("vm/qa-b", "nginx")}; err != nil || !slices.Equal(got, want) {
		t.Errorf("vm: %v %v; want %v", got, err, want)
	}
	// A machine with a host of its own (its root namespace) is that host
	// alone, as before: its containers are hosts of their own.
	withContainer := append(slices.Clone(hosts), store.Host{ID: "web/netns:7", Addrs: []string{"172.17.0.2"}})
	wc := Build(append(chain(), o("web/netns:7", "outbound", "172.17.0.2", "198.51.100.3", 8080, "worker", 1, 1, 1)), withContainer, nil)
	if got, err := Resolve(wc, withContainer, "web"); err != nil || !slices.Equal(got, []string{ProcessID("web", "nginx")}) {
		t.Errorf("web: %v %v; want its root namespace's nginx alone", got, err)
	}
	// A namespace's id as lsns gives it (its inode, no cookie) names the
	// namespaces that had that inode, not those of a longer inode.
	withCookies := append(slices.Clone(hosts), store.Host{ID: "web/netns:7.41", Addrs: []string{"172.17.0.2"}}, store.Host{ID: "web/netns:77.42", Addrs: []string{"172.17.0.3"}})
	wk := Build(append(chain(), o("web/netns:7.41", "outbound", "172.17.0.2", "198.51.100.3", 8080, "worker", 1, 1, 1),
		o("web/netns:77.42", "outbound", "172.17.0.3", "198.51.100.3", 8080, "cron", 1, 1, 1)), withCookies, nil)
	if got, err := Resolve(wk, withCookies, "web/netns:7"); err != nil || !slices.Equal(got, []string{ProcessID("web/netns:7.41", "worker")}) {
		t.Errorf("web/netns:7: %v %v; want the worker of web/netns:7.41 alone", got, err)
	}
}

func TestLookDepthAndReverse(t *testing.T) {
	g := Build(chain(), hosts, nil)
	roots, _ := Resolve(g, hosts, "nginx")
	trees := Look(g, roots, 1, true, true, 0)
	if len(trees) != 1 || len(trees[0].Outbound) != 1 || len(trees[0].Outbound[0].Children) != 0 || len(trees[0].Inbound) != 1 {
		t.Fatalf("depth 1: %+v", trees)
	}
	trees = Look(g, roots, 0, true, false, 0)
	app := trees[0].Outbound[0]
	if app.Peer.ID != ServiceID("app", "tcp", 8080) || len(app.Children) != 2 {
		t.Fatalf("unlimited outbound from nginx: %+v", app)
	}
	// Impact of the database: everything that transitively depends on it.
	roots, _ = Resolve(g, hosts, "198.51.100.4:5432")
	trees = Look(g, roots, 0, false, true, 0)
	var chainSeen []string
	for b := trees[0].Inbound; len(b) > 0; b = b[0].Children {
		chainSeen = append(chainSeen, b[0].Peer.Process)
	}
	if strings.Join(chainSeen, ",") != "app,nginx,curl" {
		t.Errorf("reverse chain %v", chainSeen)
	}
}

func TestCyclesAreShownOnce(t *testing.T) {
	// a calls b, b calls a: the tree must end, marking the repeat.
	obs := []store.Observation{
		o("web", "outbound", "198.51.100.2", "198.51.100.3", 9000, "a", 1, 1, 1),
		o("app", "inbound", "198.51.100.3", "198.51.100.2", 9000, "b", 1, 1, 1),
		o("app", "outbound", "198.51.100.3", "198.51.100.2", 9001, "b", 1, 1, 1),
		o("web", "inbound", "198.51.100.2", "198.51.100.3", 9001, "a", 1, 1, 1),
	}
	g := Build(obs, hosts, nil)
	roots, _ := Resolve(g, hosts, "a")
	trees := Look(g, roots, 0, true, false, 0)
	b := trees[0].Outbound[0]
	if b.Repeat || len(b.Children) != 1 || !b.Children[0].Repeat {
		t.Fatalf("cycle: %+v / %+v", b, b.Children)
	}
	var buf bytes.Buffer
	WriteTrees(&buf, trees, true, false)
	if strings.Count(buf.String(), "(shown above)") != 1 {
		t.Errorf("tree:\n%s", buf.String())
	}
}

func TestReachableAndDiff(t *testing.T) {
	g := Build(chain(), hosts, nil)
	roots, _ := Resolve(g, hosts, "198.51.100.3:8080")
	sub := Reachable(g, roots, 1, 0)
	if len(sub.Edges) != 3 { // nginx->app, app->db, app->external
		t.Errorf("reachable depth 1: %+v", sub.Edges)
	}
	before := Build(chain()[:4], hosts, nil)
	appeared, disappeared := Diff(before, g)
	if len(appeared) != 2 || len(disappeared) != 0 {
		t.Errorf("diff: +%v -%v", appeared, disappeared)
	}
	appeared, disappeared = Diff(g, before)
	if len(appeared) != 0 || len(disappeared) != 2 {
		t.Errorf("reverse diff: +%v -%v", appeared, disappeared)
	}
}

func TestFormats(t *testing.T) {
	g := Build(chain(), hosts, nil)
	var buf bytes.Buffer
	if err := Write(&buf, g, "json"); err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "kind", "host", "addr", "port", "proto", "process"} {
		if _, ok := doc["nodes"][0][k]; !ok {
			t.Errorf("node field %q missing", k)
		}
	}
	for _, k := range []string{"from", "to", "proto", "port", "connections", "failed_connections", "bytes_sent", "bytes_received", "first_seen", "last_seen"} {
		if _, ok := doc["edges"][0][k]; !ok {
			t.Errorf("edge field %q missing", k)
		}
	}
	buf.Reset()
	if err := Write(&buf, g, "dot"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "digraph deptrace {") || strings.Count(buf.String(), "->") != len(g.Edges) {
		t.Errorf("dot:\n%s", buf.String())
	}
	buf.Reset()
	if err := Write(&buf, g, "mermaid"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "flowchart LR") || strings.Count(buf.String(), "-->|") != len(g.Edges) {
		t.Errorf("mermaid:\n%s", buf.String())
	}
	if err := Write(&buf, g, "png"); err == nil || !strings.Contains(err.Error(), "json, json-v1, dot, mermaid") {
		t.Errorf("bad format: %v", err)
	}
}

// UDP has no connections: its edges read in datagrams, turned to the
// client's point of view when only the server reports.
func TestUDPEdgesCountDatagrams(t *testing.T) {
	dns := o("db", "inbound", "198.51.100.4", "198.51.100.1", 53, "unbound", 0, 900, 100)
	dns.Proto, dns.DatagramsSent, dns.DatagramsReceived = "udp", 10, 12
	g := Build([]store.Observation{dns}, hosts, nil)
	e := edge(t, g, ProcessID("client", ""), ServiceID("db", "udp", 53))
	if e.DatagramsSent != 12 || e.DatagramsReceived != 10 || e.BytesSent != 100 {
		t.Errorf("client view of the server's counters: %+v", e)
	}
	var buf bytes.Buffer
	roots, _ := Resolve(g, hosts, "unbound")
	WriteTrees(&buf, Look(g, roots, 1, true, true, 0), true, true)
	if !strings.Contains(buf.String(), "via udp/53  dgrams=12/10 sent=100 recv=900") || strings.Contains(buf.String(), "conns=") {
		t.Errorf("look:\n%s", buf.String())
	}
	buf.Reset()
	if err := Write(&buf, g, "mermaid"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "udp/53 22 datagrams") {
		t.Errorf("mermaid:\n%s", buf.String())
	}
}

// Health: an edge with failures, resets or retransmits is marked with its
// reasons; a service whose accept queue dropped connections is flagged,
// and one that only dropped (no edge reached it) still shows.
func TestHealthOfEdgesAndListeners(t *testing.T) {
	obs := chain()
	obs[4].FailedConnections, obs[4].FailedRefused, obs[4].FailedTimeout = 3, 2, 1
	obs[4].ConnectLatencyCount, obs[4].ConnectLatencySumUs, obs[4].ConnectLatencyMaxUs = 20, 40000, 9000
	obs[4].Retransmits = 7
	listeners := []store.Listener{
		{HostID: "db", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 5432, Comm: "postgres", BacklogLimit: 128, QueueMax: 128, Drops: 12},
		{HostID: "db", Proto: "tcp", LocalAddr: "::", Port: 5432, Comm: "postgres", BacklogLimit: 128, QueueMax: 40, Drops: 3},
		{HostID: "app", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 8080, Comm: "app", BacklogLimit: 4096, QueueMax: 2},
		{HostID: "web", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 9999, Comm: "stuck", BacklogLimit: 1, QueueMax: 1, Drops: 10},
	}
	g := Build(obs, hosts, listeners)
	e := edge(t, g, ProcessID("app", "app"), ServiceID("db", "tcp", 5432))
	if !e.Unhealthy || e.ConnectLatencyAvgUs != 2000 || len(e.Reasons) != 2 ||
		e.Reasons[0] != "3 of 23 connection attempts failed (13.0 %): 2 refused, 1 timed out" || e.Reasons[1] != "7 retransmitted segments in 20 connections (0.35 per connection)" {
		t.Errorf("unhealthy edge: %+v", e)
	}
	if e := edge(t, g, ProcessID("web", "nginx"), ServiceID("app", "tcp", 8080)); e.Unhealthy || e.Reasons != nil {
		t.Errorf("healthy edge marked: %+v", e)
	}
	db := node(t, g, ServiceID("db", "tcp", 5432))
	if db.Listener == nil || *db.Listener != (ListenerState{BacklogLimit: 128, QueueMax: 128, Drops: 15}) || !db.Unhealthy ||
		!strings.Contains(db.Reasons[0], "15 handshake packets dropped") {
		t.Errorf("dropping service: %+v %+v", db, db.Listener)
	}
	if app := node(t, g, ServiceID("app", "tcp", 8080)); app.Unhealthy || app.Listener == nil || app.Listener.BacklogLimit != 4096 {
		t.Errorf("healthy listener: %+v", app)
	}
	if stuck := node(t, g, ServiceID("web", "tcp", 9999)); !stuck.Unhealthy || stuck.Process != "stuck" {
		t.Errorf("a service that only drops: %+v", stuck)
	}

	var buf bytes.Buffer
	roots, _ := Resolve(g, hosts, "app")
	WriteTrees(&buf, Look(g, roots, 1, true, true, 0), true, true)
	for _, want := range []string{
		"-> tcp 198.51.100.4:5432 postgres on db  [listen backlog=128 queue_max=128 drops=15 DROPPING]  UNHEALTHY  conns=20 failed=3 (refused=2 timeout=1) sent=100 recv=900 connect=2ms/9ms retrans=7",
		"<- nginx on web (198.51.100.2)  via tcp/8080  [listen backlog=4096 queue_max=2 drops=0]  conns=5",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("look lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	if err := Write(&buf, g, "json"); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nodes []map[string]any
		Edges []map[string]any
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	var flagged, marked int
	for _, n := range doc.Nodes {
		if n["unhealthy"] == true {
			flagged++
		}
	}
	for _, e := range doc.Edges {
		if e["unhealthy"] == true && e["retransmits"] == float64(7) && e["failed_refused"] == float64(2) && e["connect_latency_max_us"] == float64(9000) {
			marked++
		}
	}
	if flagged != 2 || marked != 1 {
		t.Errorf("json: %d unhealthy nodes (want 2), %d marked edges (want 1):\n%s", flagged, marked, buf.String())
	}
}

func unixObs(host, dir, local, remote, comm, peer string, conns, sent, recv uint64) store.Observation {
	x := o(host, dir, local, remote, 0, comm, conns, sent, recv)
	x.Proto, x.PeerComm = "unix", peer
	return x
}

// Unix sockets: nginx -> gunicorn over /run/app.sock, both ends on web;
// psql -> postgres reported only by the server; another host's socket of
// the same path is another service.
func TestUnixServices(t *testing.T) {
	obs := append(chain(),
		unixObs("web", "outbound", "", "/run/app.sock", "nginx", "gunicorn", 7, 700, 7000),
		unixObs("web", "inbound", "/run/app.sock", "", "gunicorn", "nginx", 7, 7000, 700),
		unixObs("db", "inbound", "/var/run/postgresql/.s.PGSQL.5432", "", "postgres", "psql", 2, 900, 100),
		unixObs("app", "outbound", "", "/run/app.sock", "worker", "other", 1, 1, 1),
	)
	g := Build(obs, hosts, nil)
	e := edge(t, g, ProcessID("web", "nginx"), UnixServiceID("web", "/run/app.sock"))
	if e.Proto != "unix" || e.Port != 0 || e.Connections != 7 || e.BytesSent != 700 || e.BytesReceived != 7000 {
		t.Errorf("nginx -> gunicorn: %+v", e)
	}
	if n := node(t, g, UnixServiceID("web", "/run/app.sock")); n.Process != "gunicorn" || n.Kind != KindService || n.Addr != "/run/app.sock" {
		t.Errorf("unix service node: %+v", n)
	}
	e = edge(t, g, ProcessID("db", "psql"), UnixServiceID("db", "/var/run/postgresql/.s.PGSQL.5432"))
	if e.Connections != 2 || e.BytesSent != 100 {
		t.Errorf("server-only unix edge, client's view: %+v", e)
	}
	edge(t, g, ProcessID("app", "worker"), UnixServiceID("app", "/run/app.sock"))
	if len(g.Edges) != 4+3 {
		t.Errorf("%d edges: %+v", len(g.Edges), g.Edges)
	}

	var buf bytes.Buffer
	roots, _ := Resolve(g, hosts, "nginx")
	WriteTrees(&buf, Look(g, roots, 1, true, true, 0), true, true)
	if !strings.Contains(buf.String(), "-> unix /run/app.sock gunicorn on web  conns=7 failed=0 sent=700 recv=7000") {
		t.Errorf("look nginx:\n%s", buf.String())
	}
	buf.Reset()
	roots, _ = Resolve(g, hosts, "gunicorn")
	WriteTrees(&buf, Look(g, roots, 1, true, true, 0), true, true)
	if !strings.Contains(buf.String(), "<- nginx on web (198.51.100.2)  via unix /run/app.sock  conns=7") {
		t.Errorf("look gunicorn:\n%s", buf.String())
	}
	if got, err := Resolve(g, hosts, "/run/app.sock"); err != nil || len(got) != 2 {
		t.Errorf("a socket path names its services on every host: %v %v", got, err)
	}

	for format, want := range map[string]string{
		"json":    `"id": "service:web/unix:/run/app.sock"`,
		"dot":     `"process:web/nginx" -> "service:web/unix:/run/app.sock" [label="unix 7 conns"]`,
		"mermaid": `"unix /run/app.sock gunicorn on web"`,
	} {
		buf.Reset()
		if err := Write(&buf, g, format); err != nil || !strings.Contains(buf.String(), want) {
			t.Errorf("%s lacks %q:\n%s", format, want, buf.String())
		}
	}
}

// A unix receiver that does not learn who sent (a datagram socket; a
// stream server whose client no agent traced) has one unnamed view of
// those senders: where senders reported the path themselves, only what the
// view holds beyond their counts is an unnamed client's edge; a receiver
// no sender reported keeps its whole view.
func TestUnixDatagramsCountedOnce(t *testing.T) {
	dgram := func(host, dir, local, remote, comm, peer string, n uint64) store.Observation {
		x := unixObs(host, dir, local, remote, comm, peer, 0, n*70, 0)
		if dir == "outbound" {
			x.DatagramsSent = n
		} else {
			x.BytesSent, x.BytesReceived, x.DatagramsReceived = 0, n*70, n
		}
		return x
	}
	obs := []store.Observation{
		// A connected sender knows the receiver's process; one that uses
		// sendto() does not. The receiver got what both sent.
		dgram("vm", "outbound", "", "/run/ud.sock", "logger", "collector", 5),
		dgram("vm", "outbound", "", "/run/ud.sock", "cron", "", 2),
		dgram("vm", "inbound", "/run/ud.sock", "", "collector", "", 7),
		// Only the receiver traced.
		dgram("vm", "inbound", "/run/other.sock", "", "syslogd", "", 4),
		// A receiver that got 3 more than its traced senders sent: an
		// untraced sender's.
		dgram("vm", "outbound", "", "/run/log.sock", "app", "journald", 5),
		dgram("vm", "inbound", "/run/log.sock", "", "journald", "", 8),
		// A stream server: a traced client (both views named) and one no
		// agent traced (the server's view has no peer), whole.
		unixObs("vm", "outbound", "", "/run/app.sock", "nginx", "gunicorn", 4, 40, 400),
		unixObs("vm", "inbound", "/run/app.sock", "", "gunicorn", "nginx", 4, 400, 40),
		unixObs("vm", "inbound", "/run/app.sock", "", "gunicorn", "", 3, 300, 30),
	}
	g := Build(obs, hosts, nil)
	for _, c := range []struct {
		from, path    string
		conns, dgrams uint64
	}{
		{"logger", "/run/ud.sock", 0, 5}, {"cron", "/run/ud.sock", 0, 2},
		{"", "/run/other.sock", 0, 4}, // turned to the client's view
		{"app", "/run/log.sock", 0, 5}, {"", "/run/log.sock", 0, 3},
		{"nginx", "/run/app.sock", 4, 0}, {"", "/run/app.sock", 3, 0},
	} {
		if e := edge(t, g, ProcessID("vm", c.from), UnixServiceID("vm", c.path)); e.Connections != c.conns || e.DatagramsSent != c.dgrams {
			t.Errorf("%q -> %s: %d conns, %d datagrams sent; want %d and %d", c.from, c.path, e.Connections, e.DatagramsSent, c.conns, c.dgrams)
		}
	}
	if n := node(t, g, UnixServiceID("vm", "/run/ud.sock")); n.Process != "collector" {
		t.Errorf("ud.sock served by %q; want collector", n.Process)
	}
	if len(g.Edges) != 7 {
		t.Errorf("%d edges, want 7 (no unnamed sender to ud.sock): %+v", len(g.Edges), g.Edges)
	}
	// The page's history (Joiner steps) holds the remainder too: log.sock's
	// receiver and its sender in one step, the receiver's untraced 3 in
	// the next.
	first, rest := dgram("vm", "inbound", "/run/log.sock", "", "journald", "", 5), dgram("vm", "inbound", "/run/log.sock", "", "journald", "", 3)
	j := NewJoiner(obs, hosts, nil)
	var steps uint64
	for _, step := range [][]store.Observation{{obs[4], first}, {rest}} {
		for _, e := range j.Step(step, nil).Edges {
			if e.From == ProcessID("vm", "") && e.To == UnixServiceID("vm", "/run/log.sock") {
				steps += e.DatagramsSent
			}
		}
	}
	if steps != 3 {
		t.Errorf("the unnamed sender to log.sock over the steps: %d datagrams, want 3 as over the range", steps)
	}
}

// Process names match the way a person types them: exact, then ignoring
// case, then by prefix, then by substring, and only when unambiguous.
func TestProcessNamesMatchAsTyped(t *testing.T) {
	obs := []store.Observation{
		o("web", "outbound", "198.51.100.2", "198.51.100.4", 6379, "php-fpm", 1, 1, 1),
		o("db", "inbound", "198.51.100.4", "198.51.100.2", 6379, "redis-server", 1, 1, 1),
		o("db", "inbound", "198.51.100.4", "198.51.100.2", 26379, "redis-sentinel", 1, 1, 1),
		o("app", "outbound", "198.51.100.3", "198.51.100.4", 5432, "Postgres-Exporter", 1, 1, 1),
		o("app", "outbound", "198.51.100.3", "198.51.100.4", 5433, "postgres", 1, 1, 1),
	}
	g := Build(obs, hosts, nil)
	for typed, want := range map[string]string{
		"php-fpm":           ProcessID("web", "php-fpm"),
		"php":               ProcessID("web", "php-fpm"),
		"fpm":               ProcessID("web", "php-fpm"),
		"redis-se":          "", // ambiguous
		"redis-serv":        ProcessID("db", "redis-server"),
		"sentinel":          ProcessID("db", "redis-sentinel"),
		"postgres":          ProcessID("app", "postgres"), // exact beats the prefix of Postgres-Exporter
		"POSTGRES-exporter": ProcessID("app", "Postgres-Exporter"),
		"exporter":          ProcessID("app", "Postgres-Exporter"),
	} {
		got, err := Resolve(g, hosts, typed)
		if want == "" {
			if err == nil || !strings.Contains(err.Error(), `"redis-se" matches several processes by prefix: redis-sentinel, redis-server`) {
				t.Errorf("%s: %v %v, want an error listing both", typed, got, err)
			}
			continue
		}
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s: %v %v, want %s", typed, got, err, want)
		}
	}
	if _, err := Resolve(g, hosts, "redis"); err == nil || !strings.Contains(err.Error(), "redis-sentinel, redis-server") {
		t.Errorf("redis: %v", err)
	}
	if _, err := Resolve(g, hosts, "mysql"); err == nil || !strings.Contains(err.Error(), `no host, address, service or process matches "mysql"`) {
		t.Errorf("mysql: %v", err)
	}
}

// Docker's embedded DNS: clients ask 127.0.0.11:53, a NAT rule sends the
// queries to dockerd on a random port of 127.0.0.11 in the same namespace.
// Each client's edge joins dockerd's end: one edge per client process to
// the DNS service, none from an unknown client into dockerd's real port.
// Two free inbounds on one address are ambiguous and stay apart.
func TestLoopbackNATJoinsTheRedirectedServer(t *testing.T) {
	udp := func(ob store.Observation) store.Observation {
		ob.Proto = "udp"
		ob.Counters = tracer.Counters{DatagramsSent: ob.Connections, DatagramsReceived: ob.Connections}
		return ob
	}
	g := Build([]store.Observation{
		udp(o("web", "outbound", "127.0.0.1", "127.0.0.11", 53, "nslookup", 3, 0, 0)),
		udp(o("web", "outbound", "127.0.0.1", "127.0.0.11", 53, "wget", 1, 0, 0)),
		udp(o("web", "inbound", "127.0.0.11", "127.0.0.1", 43868, "dockerd", 4, 0, 0)),
	}, hosts, nil)
	if len(g.Edges) != 2 {
		t.Fatalf("want the two clients' edges only, got %+v", g.Edges)
	}
	for _, c := range []string{"nslookup", "wget"} {
		edge(t, g, ProcessID("web", c), ServiceID("web", "udp", 53))
	}
	if n := node(t, g, ServiceID("web", "udp", 53)); n.Process != "dockerd" {
		t.Errorf("the DNS service is served by %q, want dockerd", n.Process)
	}

	g = Build([]store.Observation{
		udp(o("web", "outbound", "127.0.0.1", "127.0.0.11", 53, "nslookup", 3, 0, 0)),
		udp(o("web", "inbound", "127.0.0.11", "127.0.0.1", 43868, "dockerd", 2, 0, 0)),
		udp(o("web", "inbound", "127.0.0.11", "127.0.0.1", 51000, "other", 1, 0, 0)),
	}, hosts, nil)
	if len(g.Edges) != 3 {
		t.Fatalf("two candidate servers: want no join (3 edges), got %+v", g.Edges)
	}
	if n := node(t, g, ServiceID("web", "udp", 53)); n.Process != "" {
		t.Errorf("ambiguous: the DNS service got process %q, want none", n.Process)
	}
}

// A Joiner: however a range's observations fall into steps (a client's
// record in one, its server's in the next), every step's edges have the
// ends the range's graph gives them, the servers keep their processes,
// and the steps sum to the range's totals.
func TestJoinerAcrossSteps(t *testing.T) {
	udp := func(x store.Observation) store.Observation { x.Proto = "udp"; return x }
	unix := func(dir, local, remote, comm, peer string, conns uint64) store.Observation {
		return store.Observation{HostID: "app", Direction: dir, Proto: "unix", LocalAddr: local, RemoteAddr: remote, Comm: comm, PeerComm: peer,
			Counters: tracer.Counters{Connections: conns}, FirstSeen: at, LastSeen: at.Add(time.Minute)}
	}
	obs := append(chain(),
		// A dependency only its server reports (the client runs no agent).
		o("db", "inbound", "198.51.100.4", "203.0.113.9", 5432, "postgres", 2, 10, 10),
		// A unix socket reported by both ends.
		unix("outbound", "", "/run/app.sock", "app", "helper", 3), unix("inbound", "/run/app.sock", "", "helper", "app", 3),
		// Docker's embedded DNS: the server's record has dockerd's port.
		udp(o("web", "outbound", "127.0.0.1", "127.0.0.11", 53, "nslookup", 3, 0, 0)),
		udp(o("web", "inbound", "127.0.0.11", "127.0.0.1", 43868, "dockerd", 3, 0, 0)),
	)
	whole := Build(obs, hosts, nil)
	// Every second record in step 0, the others in step 1: each
	// dependency's two ends in different steps.
	steps := make([][]store.Observation, 2)
	for i, x := range obs {
		steps[i%2] = append(steps[i%2], x)
	}
	j := NewJoiner(obs, hosts, nil)
	sum := map[[2]string]tracer.Counters{}
	process := map[string]string{}
	for i, st := range steps {
		g := j.Step(st, nil)
		for _, n := range g.Nodes {
			process[n.ID] = n.Process
		}
		for _, e := range g.Edges {
			if e.LastSeen.IsZero() {
				t.Errorf("step %d: edge %s -> %s without an observation of its own", i, e.From, e.To)
			}
			c := sum[[2]string{e.From, e.To}]
			c.Add(e.Counters)
			sum[[2]string{e.From, e.To}] = c
		}
	}
	if len(sum) != len(whole.Edges) {
		t.Errorf("the steps have %d edges, the range %d: %v", len(sum), len(whole.Edges), sum)
	}
	for _, e := range whole.Edges {
		if got := sum[[2]string{e.From, e.To}]; got != e.Counters {
			t.Errorf("%s -> %s: the steps sum to %+v, the range has %+v", e.From, e.To, got, e.Counters)
		}
	}
	// Step 0 holds the clients' records alone: the servers are named
	// from records of step 1.
	for id, want := range map[string]string{ServiceID("web", "tcp", 80): "nginx", ServiceID("db", "tcp", 5432): "postgres", ServiceID("web", "udp", 53): "dockerd"} {
		if process[id] != want {
			t.Errorf("%s is run by %q in the steps, want %q", id, process[id], want)
		}
	}
	// keep selects by the range's edge: the DNS edge alone.
	g := j.Step(obs, func(e *Edge) bool { return e.Proto == "udp" && e.Port == 53 })
	if len(g.Edges) != 1 || g.Edges[0].DatagramsSent+g.Edges[0].Connections != 3 || len(g.Nodes) != 2 {
		t.Errorf("the DNS edge alone: %+v, nodes %+v", g.Edges, g.Nodes)
	}
	// A flow the range did not have (written after it was read) still
	// counts, placed by a Build of its own.
	late := o("client", "outbound", "198.51.100.1", "198.51.100.3", 8080, "wget", 4, 0, 0)
	g = j.Step([]store.Observation{late}, nil)
	if len(g.Edges) != 1 || g.Edges[0].From != ProcessID("client", "wget") || g.Edges[0].To != ServiceID("app", "tcp", 8080) || g.Edges[0].Connections != 4 {
		t.Errorf("a late flow: %+v", g.Edges)
	}
	for _, n := range g.Nodes {
		if n.ID == ServiceID("app", "tcp", 8080) && n.Process != "app" {
			t.Errorf("a late flow's server is run by %q, want app (as the range names it)", n.Process)
		}
	}
}

// Each line of diff names its edge's protocol and port as look does, so
// that edges between the same two workloads that differ only by port (or
// by protocol) never print the same line.
func TestWriteDiffNamesTheService(t *testing.T) {
	vm := []store.Host{{ID: "vm", Addrs: []string{"192.0.2.2"}}}
	unix := func(x store.Observation, peer string) store.Observation {
		x.Proto, x.PeerComm = "unix", peer
		return x
	}
	obs := []store.Observation{
		o("vm", "outbound", "192.0.2.2", "192.0.2.2", 8181, "measure.test", 1, 10, 20),
		o("vm", "inbound", "192.0.2.2", "192.0.2.2", 8181, "measure.test", 1, 20, 10),
		o("vm", "outbound", "192.0.2.2", "192.0.2.2", 8182, "measure.test", 1, 10, 20),
		o("vm", "inbound", "192.0.2.2", "192.0.2.2", 8182, "measure.test", 1, 20, 10),
		o("vm", "outbound", "192.0.2.2", "203.0.113.53", 53, "measure.test", 1, 10, 20),
		unix(o("vm", "outbound", "", "/run/app.sock", 0, "curl", 1, 10, 20), "gunicorn"),
		unix(o("vm", "inbound", "/run/app.sock", "", 0, "gunicorn", 1, 20, 10), "curl"),
	}
	g := Group(Build(obs, vm, nil), ByWorkload)
	empty := Group(Build(nil, vm, nil), ByWorkload)

	var buf bytes.Buffer
	appeared, _ := Diff(empty, g)
	WriteDiff(&buf, g, appeared, nil, empty)
	_, disappeared := Diff(g, empty)
	WriteDiff(&buf, empty, nil, disappeared, g)
	out := buf.String()
	for _, want := range []string{
		"+ measure.test on vm (192.0.2.2) -> tcp/8181 measure.test on vm (192.0.2.2)  conns=1 ",
		"+ measure.test on vm (192.0.2.2) -> tcp/8182 measure.test on vm (192.0.2.2)  conns=1 ",
		"+ curl on vm (192.0.2.2) -> unix /run/app.sock gunicorn on vm (192.0.2.2)  conns=1 ",
		"- measure.test on vm (192.0.2.2) -> tcp/8181 measure.test on vm (192.0.2.2)  conns=1 ",
		"- measure.test on vm (192.0.2.2) -> tcp/8182 measure.test on vm (192.0.2.2)  conns=1 ",
		// An external server's label names its protocol and port already.
		"- measure.test on vm (192.0.2.2) -> tcp 203.0.113.53:53 (external)  conns=1 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 8 {
		t.Errorf("want 4 edges appeared and 4 disappeared, got %d lines:\n%s", len(lines), out)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		// Without the counters, which may differ by chance only.
		l, _, _ = strings.Cut(l, "  ")
		if seen[l] {
			t.Errorf("two edges print as %q:\n%s", l, out)
		}
		seen[l] = true
	}
}
