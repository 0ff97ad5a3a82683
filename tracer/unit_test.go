package tracer

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/netns"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Interval = 10 * time.Millisecond
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "allowed 100ms to 1h0m0s") {
		t.Errorf("short interval: %v", err)
	}
	c = DefaultConfig()
	c.FlowMapSize = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "flow map size") {
		t.Errorf("zero map: %v", err)
	}
}

// An address's text is made once and shared by the intervals that name
// it (IPv4-mapped addresses arrive unmapped from the bundler), and the
// cache stays bounded.
func TestAddrNamesShareOneStringPerAddress(t *testing.T) {
	c := addrNames{}
	for _, text := range []string{"192.0.2.1", "2001:db8::1", "fe80::1%eth0", "::"} {
		a := netip.MustParseAddr(text)
		first, again := c.name(a), c.name(netip.MustParseAddr(text))
		if first != text || again != text {
			t.Fatalf("%s named %q then %q", text, first, again)
		}
		if unsafe.StringData(first) != unsafe.StringData(again) {
			t.Errorf("%s: two strings for one address", text)
		}
	}
	for i := range addrNamesMax + 10 {
		c.name(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	if len(c) > addrNamesMax {
		t.Errorf("%d addresses cached, at most %d", len(c), addrNamesMax)
	}
	if got := c.name(netip.MustParseAddr("198.51.100.7")); got != "198.51.100.7" {
		t.Errorf("after a clear: %q", got)
	}
}

// tcpKey is the kernel map's key of f, a tcp flow between IP addresses.
func tcpKey(f Flow) procKey {
	dir := bundler.DirOutbound
	if f.Direction == Inbound {
		dir = bundler.DirInbound
	}
	return procKey{netns: f.NetNS, proto: unix.IPPROTO_TCP, dir: dir, port: f.Port,
		local: netip.MustParseAddr(f.LocalAddr), remote: netip.MustParseAddr(f.RemoteAddr)}
}

func TestProcCacheNamesSoftirqOnlyFlows(t *testing.T) {
	c := procCache{}
	f := Flow{NetNS: 1, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.1",
		RemoteAddr: "192.0.2.2", Port: 80, PID: 42, Comm: "curl", CgroupID: 9}
	first := f
	c.fill(&first, tcpKey(f))
	later := f
	later.PID, later.Comm, later.CgroupID = 0, "", 0
	c.fill(&later, tcpKey(later))
	if later.PID != 42 || later.Comm != "curl" || later.CgroupID != 9 {
		t.Errorf("not filled: %+v", later)
	}
	for _, other := range []Flow{
		{NetNS: 1, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.2", Port: 443},
		{NetNS: 1, Proto: ProtoTCP, Direction: Inbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.2", Port: 80},
		{NetNS: 2, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.2", Port: 80},
		{NetNS: 1, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.3", RemoteAddr: "192.0.2.2", Port: 80},
		{NetNS: 1, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.4", Port: 80},
	} {
		c.fill(&other, tcpKey(other))
		if other.PID != 0 {
			t.Errorf("filled from another flow: %+v", other)
		}
	}
	udp := tcpKey(f)
	udp.proto = unix.IPPROTO_UDP
	u := Flow{}
	c.fill(&u, udp)
	if u.PID != 0 {
		t.Errorf("a udp flow filled from a tcp one: %+v", u)
	}
	path := procKey{netns: 1, proto: bundler.ProtoUnix, dir: bundler.DirOutbound, path: "/run/a.sock"}
	f = Flow{PID: 7, Comm: "app"}
	c.fill(&f, path)
	g := Flow{}
	c.fill(&g, path)
	if g.PID != 7 {
		t.Errorf("a unix flow not filled from its path: %+v", g)
	}
	path.path = "/run/b.sock"
	h := Flow{}
	c.fill(&h, path)
	if h.PID != 0 {
		t.Errorf("a unix flow filled from another path: %+v", h)
	}
}

// A listener from before the start can name its inbound flows by cgroup
// alone (no process in /proc to read): a later interval keeps that cgroup,
// and a flow of another process never takes it.
func TestProcCacheKeepsACgroupWithoutAProcess(t *testing.T) {
	c := procCache{}
	f := Flow{NetNS: 1, Proto: ProtoTCP, Direction: Inbound, LocalAddr: "192.0.2.1",
		RemoteAddr: "192.0.2.2", Port: 80, CgroupID: 7}
	k := tcpKey(f)
	c.fill(&f, k)
	later := f
	later.CgroupID = 0
	c.fill(&later, k)
	if later.CgroupID != 7 || later.PID != 0 {
		t.Errorf("cgroup not kept: %+v", later)
	}
	another := f
	another.PID, another.Comm, another.CgroupID = 99, "other", 0
	c.fill(&another, k)
	if another.CgroupID != 0 {
		t.Errorf("a flow of process 99 took the cached cgroup of no process: %+v", another)
	}
}

// A drain's entries become named flows: idle retained entries are
// dropped, unix flows name their path at the server's end, a wildcard-bound
// udp socket takes its routed source, and a flow whose interval saw no
// process takes the one an earlier interval saw of the same flow, never
// of a flow that differs in any part of its key.
func TestFlowsOfNamesEntries(t *testing.T) {
	tr := &Tracer{procs: procCache{}, routes: newSourceCache(), addrs: addrNames{}}
	now := time.Unix(1_800_000_000, 0)
	client := bundler.Entry{NetNS: 5, Proto: unix.IPPROTO_TCP, Direction: bundler.DirOutbound, Port: 443,
		Local: netip.MustParseAddr("192.0.2.1"), Remote: netip.MustParseAddr("2001:db8::2"),
		Counts: bundler.Counts{Connections: 2, BytesSent: 10}, PID: 42, Comm: "curl", CgroupID: 9,
		FirstSeenBootNs: 1000, LastSeenBootNs: 2000}
	idle := client
	idle.Port, idle.Counts = 80, bundler.Counts{}
	// A pid above pid_max's limit (4194304): no /proc/PID/ns/net, so the
	// server's flow keeps the kernel's namespace (unixServerNetNS).
	server := bundler.Entry{NetNS: 5, Proto: bundler.ProtoUnix, Direction: bundler.DirInbound, Path: "/run/app.sock",
		Counts: bundler.Counts{Connections: 1}, PID: 4194305, Comm: "app", PeerPID: 8, PeerComm: "cli"}
	// A wildcard-bound udp socket; its route is cached, so no netlink.
	resolver, routed := netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("192.0.2.7")
	tr.routes.entries[sourceKey{5, resolver}] = sourceEntry{routed, true, time.Now().Add(time.Hour)}
	udp := bundler.Entry{NetNS: 5, Proto: unix.IPPROTO_UDP, Direction: bundler.DirOutbound, Port: 53,
		Local: netip.IPv4Unspecified(), Remote: resolver, Counts: bundler.Counts{DatagramsSent: 1}, PID: 50, Comm: "dig"}

	flows := tr.flowsOf([]bundler.Entry{client, idle, server, udp}, now, 5000, nil)
	want := []Flow{
		{Kind: KindFlow, Time: now, NetNS: 5, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.1",
			RemoteAddr: "2001:db8::2", Port: 443, PID: 42, Comm: "curl", CgroupID: 9,
			Counters: Counters{Connections: 2, BytesSent: 10}, FirstSeen: time.Unix(0, 6000), LastSeen: time.Unix(0, 7000)},
		{Kind: KindFlow, Time: now, NetNS: 5, Proto: ProtoUnix, Direction: Inbound, LocalAddr: "/run/app.sock",
			PID: 4194305, Comm: "app", PeerPID: 8, PeerComm: "cli", Counters: Counters{Connections: 1},
			FirstSeen: time.Unix(0, 5000), LastSeen: time.Unix(0, 5000)},
		{Kind: KindFlow, Time: now, NetNS: 5, Proto: ProtoUDP, Direction: Outbound, LocalAddr: "192.0.2.7",
			RemoteAddr: "192.0.2.53", Port: 53, PID: 50, Comm: "dig", Counters: Counters{DatagramsSent: 1},
			FirstSeen: time.Unix(0, 5000), LastSeen: time.Unix(0, 5000)},
	}
	if !reflect.DeepEqual(flows, want) {
		t.Fatalf("flows\n%+v\nwant\n%+v", flows, want)
	}

	// Each entry again with no process: named from the first interval,
	// as is the same udp flow from a socket bound to the routed source
	// (one flow to the reader: the same local address).
	bound := udp
	bound.Local = routed
	for _, e := range []bundler.Entry{client, server, udp, bound} {
		named := e
		if e == bound {
			named = udp
		}
		e.PID, e.Comm, e.CgroupID = 0, "", 0
		got := tr.flowsOf([]bundler.Entry{e}, now, 0, nil)
		if len(got) != 1 || got[0].PID != named.PID || got[0].Comm != named.Comm || got[0].CgroupID != named.CgroupID {
			t.Errorf("%s flow with no process not named %d/%s (cgroup %d) from the earlier interval: %+v",
				protoName(e.Proto), named.PID, named.Comm, named.CgroupID, got)
		}
	}
	// A flow that differs in one part of the key is another flow.
	for name, change := range map[string]func(e *bundler.Entry){
		"namespace": func(e *bundler.Entry) { e.NetNS = 6 },
		"protocol":  func(e *bundler.Entry) { e.Proto = unix.IPPROTO_UDP },
		"direction": func(e *bundler.Entry) { e.Direction = bundler.DirInbound },
		"port":      func(e *bundler.Entry) { e.Port = 8443 },
		"local":     func(e *bundler.Entry) { e.Local = netip.MustParseAddr("192.0.2.3") },
		"remote":    func(e *bundler.Entry) { e.Remote = netip.MustParseAddr("2001:db8::3") },
		"unix path": func(e *bundler.Entry) { *e = server; e.Path = "/run/other.sock" },
	} {
		e := client
		change(&e)
		e.PID, e.Comm, e.CgroupID = 0, "", 0
		got := tr.flowsOf([]bundler.Entry{e}, now, 0, nil)
		if len(got) != 1 || got[0].PID != 0 {
			t.Errorf("another %s: named from the cache: %+v", name, got)
		}
	}
}

// Naming one drain of 1,000 client hosts seen from both ends, as trace
// and the agent do every interval:
//
//	go test -run '^$' -bench FlowsOf -benchmem ./tracer
func BenchmarkFlowsOf2000Entries(b *testing.B) {
	tr := &Tracer{procs: procCache{}, routes: newSourceCache(), addrs: addrNames{}}
	server := netip.MustParseAddr("127.0.0.1")
	var entries []bundler.Entry
	for i := 0; i < 1000; i++ {
		client := netip.MustParseAddr(fmt.Sprintf("127.1.%d.%d", i/250, i%250+1))
		counts := bundler.Counts{Connections: 5, BytesSent: 320, BytesReceived: 320, LatencyCount: 5, LatencySumUs: 400}
		entries = append(entries,
			bundler.Entry{NetNS: 4026531840, Proto: unix.IPPROTO_TCP, Direction: bundler.DirOutbound, Port: 7000,
				Local: client, Remote: server, Counts: counts, PID: 1234, Comm: "loadgen", CgroupID: 77},
			bundler.Entry{NetNS: 4026531840, Proto: unix.IPPROTO_TCP, Direction: bundler.DirInbound, Port: 7000,
				Local: server, Remote: client, Counts: counts, PID: 1234, Comm: "loadgen", CgroupID: 77})
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		tr.flowsOf(entries, now, 0, make([]Flow, 0, len(entries)))
	}
}

func TestLossesArithmetic(t *testing.T) {
	a := Losses{FlowMapFull: 5, PortMapFull: 1, UDPPeerUnknown: 2, SockStorageFailed: 3, RecursionMisses: 4}
	b := Losses{FlowMapFull: 2, RecursionMisses: 1}
	d := a.minus(b)
	if d.FlowMapFull != 3 || d.RecursionMisses != 3 || d.Total() != 3+1+2+3+3 {
		t.Errorf("%+v total %d", d, d.Total())
	}
}

func TestFlowEnds(t *testing.T) {
	f := Flow{Direction: Inbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.9", Port: 80}
	if f.ServerAddr().String() != "192.0.2.1:80" || f.ClientAddr() != "192.0.2.9" {
		t.Errorf("inbound ends: %s %s", f.ServerAddr(), f.ClientAddr())
	}
	f.Direction = Outbound
	if f.ServerAddr().String() != "192.0.2.9:80" || f.ClientAddr() != "192.0.2.1" {
		t.Errorf("outbound ends: %s %s", f.ServerAddr(), f.ClientAddr())
	}
}

// Two flows of one dependency merge into one: every count adds up, the
// maxima and the RTT minimum hold over both, the times span both, and the
// process is the one of the flow seen last, in either order.
func TestMergeFlowSumsCountersAndTakesTheLatestProcess(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	early := Flow{Kind: KindFlow, NetNS: 5, Proto: ProtoUDP, Direction: Outbound, LocalAddr: "192.0.2.7",
		RemoteAddr: "192.0.2.53", Port: 53, PID: 50, Comm: "dig", CgroupID: 9,
		Counters: Counters{Connections: 1, FailedConnections: 2, FailedRefused: 1, FailedTimeout: 1,
			BytesSent: 100, BytesReceived: 200, DatagramsSent: 3, DatagramsReceived: 4,
			ConnectLatencyCount: 1, ConnectLatencySumUs: 70, ConnectLatencyMaxUs: 70,
			ResetsSent: 1, Retransmits: 2, RTTSamples: 2, RTTSumUs: 300, RTTMinUs: 100, RTTMaxUs: 200},
		FirstSeen: base.Add(time.Millisecond), LastSeen: base.Add(800 * time.Millisecond)}
	late := early
	late.PID, late.Comm, late.CgroupID = 60, "unbound", 11
	late.Counters = Counters{FailedReset: 1, FailedUnreachable: 2, BytesSent: 10, BytesReceived: 20,
		DatagramsSent: 5, DatagramsReceived: 6, ConnectLatencyCount: 2, ConnectLatencySumUs: 90, ConnectLatencyMaxUs: 50,
		ResetsReceived: 3, RTTSamples: 1, RTTSumUs: 80, RTTMinUs: 80, RTTMaxUs: 80}
	late.FirstSeen, late.LastSeen = base.Add(5*time.Millisecond), base.Add(900*time.Millisecond)
	want := late
	want.Counters = Counters{Connections: 1, FailedConnections: 2, FailedRefused: 1, FailedTimeout: 1,
		FailedReset: 1, FailedUnreachable: 2, BytesSent: 110, BytesReceived: 220, DatagramsSent: 8, DatagramsReceived: 10,
		ConnectLatencyCount: 3, ConnectLatencySumUs: 160, ConnectLatencyMaxUs: 70,
		ResetsSent: 1, ResetsReceived: 3, Retransmits: 2, RTTSamples: 3, RTTSumUs: 380, RTTMinUs: 80, RTTMaxUs: 200}
	want.FirstSeen = early.FirstSeen
	for _, order := range [][2]Flow{{early, late}, {late, early}} {
		got := order[0]
		mergeFlow(&got, order[1])
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s/%d then %s/%d merged:\n%+v\nwant\n%+v", order[0].Comm, order[0].PID, order[1].Comm, order[1].PID, got, want)
		}
	}

	// A flow without RTT samples leaves the minimum alone; one without a
	// process never takes the name of one that has it, however late.
	noRTT := late
	noRTT.Counters = Counters{DatagramsSent: 1}
	noRTT.PID, noRTT.Comm, noRTT.CgroupID = 0, "", 0
	got := early
	mergeFlow(&got, noRTT)
	if got.RTTMinUs != 100 || got.RTTMaxUs != 200 || got.RTTSamples != 2 || got.PID != 50 || got.LastSeen != late.LastSeen {
		t.Errorf("merged with a flow without RTT and process: %+v", got)
	}
	// Seen at the same time: the larger pid, in either order.
	tie := early
	tie.PID, tie.Comm = 70, "other"
	for _, order := range [][2]Flow{{early, tie}, {tie, early}} {
		got := order[0]
		mergeFlow(&got, order[1])
		if got.PID != 70 || got.Comm != "other" {
			t.Errorf("a tie named %d/%s, want 70/other", got.PID, got.Comm)
		}
	}
}

// A wildcard-bound udp socket's flow, named by its routed source, and a
// connected socket's flow to the same peer from that source are one flow;
// other flows, and udp flows of other dependencies, are left as they were,
// in their order.
func TestFlowsOfMergesARoutedWildcardFlow(t *testing.T) {
	tr := &Tracer{procs: procCache{}, routes: newSourceCache(), addrs: addrNames{}}
	now := time.Unix(1_800_000_000, 0)
	server, routed := netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("192.0.2.7")
	tr.routes.entries[sourceKey{5, server}] = sourceEntry{routed, true, time.Now().Add(time.Hour)}
	wildcard := bundler.Entry{NetNS: 5, Proto: unix.IPPROTO_UDP, Direction: bundler.DirOutbound, Port: 5355,
		Local: netip.IPv4Unspecified(), Remote: server, Counts: bundler.Counts{DatagramsSent: 3, BytesSent: 30},
		PID: 50, Comm: "sendto", FirstSeenBootNs: 1000, LastSeenBootNs: 4000}
	connected := wildcard
	connected.Local, connected.PID, connected.Comm = routed, 60, "connected"
	connected.Counts = bundler.Counts{DatagramsSent: 4, BytesSent: 40}
	connected.FirstSeenBootNs, connected.LastSeenBootNs = 2000, 3000
	tcp := connected
	tcp.Proto = unix.IPPROTO_TCP
	otherPort := connected
	otherPort.Port = 53

	flows := tr.flowsOf([]bundler.Entry{tcp, wildcard, otherPort, connected}, now, 0, nil)
	if len(flows) != 3 {
		t.Fatalf("%d flows, want 3 (the two to port 5355 merged): %+v", len(flows), flows)
	}
	if flows[0].Proto != ProtoTCP || flows[2].Port != 53 {
		t.Errorf("the other flows moved: %+v", flows)
	}
	m := flows[1]
	if m.LocalAddr != "192.0.2.7" || m.Port != 5355 || m.DatagramsSent != 7 || m.BytesSent != 70 ||
		m.FirstSeen != time.Unix(0, 1000) || m.LastSeen != time.Unix(0, 4000) || m.PID != 50 || m.Comm != "sendto" {
		t.Errorf("merged flow: %+v", m)
	}
	// An IPv4 and a dual-stack IPv6 wildcard socket to one IPv4 peer are
	// two entries of the kernel too.
	dual := wildcard
	dual.Local = netip.IPv6Unspecified()
	if flows := tr.flowsOf([]bundler.Entry{wildcard, dual}, now, 0, nil); len(flows) != 1 || flows[0].DatagramsSent != 6 {
		t.Errorf("two wildcard entries routed from one source: %+v", flows)
	}
}

// A unix server's flows from clients of one name in two namespaces move
// to the namespace of the server's process and become one flow; a client
// of another name and another server of the path stay flows of their
// own, and a client's flow stays where the kernel put it.
func TestFlowsOfMovesAUnixServerToItsNamespace(t *testing.T) {
	self, err := netns.Self()
	if err != nil {
		t.Fatal(err)
	}
	tr := &Tracer{procs: procCache{}, routes: newSourceCache(), addrs: addrNames{}}
	pid := uint32(os.Getpid())
	fromA := bundler.Entry{NetNS: 5, Proto: bundler.ProtoUnix, Direction: bundler.DirInbound, Path: "/run/php.sock",
		Counts: bundler.Counts{Connections: 2, BytesSent: 20}, PID: pid, Comm: "php-fpm", PeerPID: 8, PeerComm: "nginx"}
	fromB := fromA
	fromB.NetNS, fromB.Counts = 6, bundler.Counts{Connections: 3, BytesSent: 30}
	otherClient := fromB
	otherClient.NetNS, otherClient.PeerComm = 7, "curl"
	client := bundler.Entry{NetNS: 5, Proto: bundler.ProtoUnix, Direction: bundler.DirOutbound, Path: "/run/php.sock",
		Counts: bundler.Counts{Connections: 2}, PID: pid, Comm: "nginx", PeerPID: pid, PeerComm: "php-fpm"}
	// Another server of the same path in the server's namespace (a
	// host-network container with its own mount namespace).
	otherServer := fromB
	otherServer.NetNS, otherServer.Comm, otherServer.CgroupID = 9, "other-fpm", 99
	flows := tr.flowsOf([]bundler.Entry{fromA, client, fromB, otherClient, otherServer}, time.Unix(1_800_000_000, 0), 0, nil)
	if len(flows) != 4 {
		t.Fatalf("%d flows, want 4 (the server's two from nginx merged; curl's and the other server's apart): %+v", len(flows), flows)
	}
	if o := flows[3]; o.Comm != "other-fpm" || o.NetNS != self || o.Connections != 3 {
		t.Errorf("the other server's flow: %+v", o)
	}
	if c := flows[2]; c.PeerComm != "curl" || c.NetNS != self || c.Connections != 3 {
		t.Errorf("the server's flow from curl: %+v", c)
	}
	if s := flows[0]; s.Direction != Inbound || s.NetNS != self || s.Connections != 5 || s.BytesSent != 50 {
		t.Errorf("server flow: netns %d, %+v; want netns %d (its process's), 5 connections", s.NetNS, s.Counters, self)
	}
	if c := flows[1]; c.Direction != Outbound || c.NetNS != 5 {
		t.Errorf("client flow moved: netns %d, want 5", c.NetNS)
	}
}
