package tracer_test

// Local DNS forwarders behind a NAT rule, as Docker's embedded DNS runs
// one in every container: the container resolves through 127.0.0.11:53, a
// NAT rule in its namespace sends the query to a port the kernel chose, on
// which dockerd (a host process whose socket lives in the container's
// namespace, bound from a thread that entered it with setns) answers.
// Kubernetes' node-local DNS caches and other DNS proxies behind a
// redirect look the same to the kernel. Each client is one dependency on
// the DNS address it queries, the forwarder one inbound flow on its port:
// never one flow per query's ephemeral port.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

const (
	dnsQuery  = 30 // bytes of every query
	dnsAnswer = 45 // bytes of every answer
	dnsRounds = 6  // queries per client
)

// dockerDNS is the address containers query on Docker's user-defined
// networks.
var dockerDNS = netip.MustParseAddr("127.0.0.11")

// startForwarder binds a UDP socket to bindAddr with port 0 inside h, as
// dockerd does: from a goroutine locked to its OS thread that entered the
// namespace with setns (netns.Do), so the kernel picks the port. It
// answers every query with dnsAnswer bytes until the test ends.
func startForwarder(t *testing.T, h *testnet.Host, bindAddr string) (*net.UDPConn, int) {
	t.Helper()
	return startForwarderHeld(t, h, bindAddr, nil)
}

// startForwarderHeld is startForwarder whose first answer waits until
// hold is closed (nil: no wait).
// awaitHeld waits until a held server has received its first datagram
// (it sends on hold, then waits for hold to be closed).
func awaitHeld(t *testing.T, hold chan struct{}) {
	t.Helper()
	select {
	case <-hold:
	case <-time.After(10 * time.Second):
		t.Fatal("the held server never received the first datagram")
	}
}

func startForwarderHeld(t *testing.T, h *testnet.Host, bindAddr string, hold chan struct{}) (*net.UDPConn, int) {
	t.Helper()
	var pc *net.UDPConn
	h.Do(t, func() (err error) {
		pc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(bindAddr)})
		return
	})
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if n != dnsQuery {
				continue
			}
			if hold != nil {
				hold <- struct{}{} // received (awaitHeld)
				<-hold             // until the test closes it
				hold = nil
			}
			_, _ = pc.WriteToUDP(make([]byte, dnsAnswer), from)
		}
	}()
	return pc, pc.LocalAddr().(*net.UDPAddr).Port
}

// nft loads a ruleset into h's namespace (the table goes with it).
func nft(t *testing.T, h *testnet.Host, ruleset string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft is needed (scripts/deps.sh installs nftables): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s\n%s", h.Name, err, out, ruleset)
	}
}

// natDockerDNS sends queries to 127.0.0.11:53 to the forwarder's port, as
// Docker's DOCKER_OUTPUT chain does (the reply's source is translated
// back by conntrack).
func natDockerDNS(t *testing.T, h *testnet.Host, port int) {
	nft(t, h, fmt.Sprintf(`table ip deptrace_dns {
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr %s udp dport 53 dnat to %s:%d
	}
}
`, dockerDNS, dockerDNS, port))
}

// queryConnected sends dnsRounds queries to server, each from a new
// connected socket (a new ephemeral port, as glibc's and Go's resolvers
// do), inside h, and reads every answer. It returns the client's address.
func queryConnected(t *testing.T, h *testnet.Host, server string) netip.Addr {
	t.Helper()
	var local netip.Addr
	for i := 0; i < dnsRounds; i++ {
		c, err := h.Dial("udp4", server)
		if err != nil {
			t.Fatal(err)
		}
		local = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		if err := roundTrip(c, dnsQuery, dnsAnswer); err != nil {
			t.Fatalf("query %d to %s: %v", i, server, err)
		}
		c.Close()
	}
	return local
}

// queryUnconnected sends dnsRounds queries to server with sendto from one
// unconnected socket inside h, and reads every answer.
func queryUnconnected(t *testing.T, h *testnet.Host, server *net.UDPAddr) {
	t.Helper()
	uc := h.ListenPacket(t, "udp4", ":0")
	buf := make([]byte, 512)
	for i := 0; i < dnsRounds; i++ {
		if _, err := uc.WriteTo(make([]byte, dnsQuery), server); err != nil {
			t.Fatal(err)
		}
		uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := uc.ReadFrom(buf)
		if err != nil || n != dnsAnswer {
			t.Fatalf("unconnected query %d: %d bytes from %v, %v", i, n, from, err)
		}
	}
	uc.Close()
}

// checkForwarded settles the ledger until host h's client and forwarder flows
// hold the traffic (queries datagrams each way), then checks that h has
// exactly those two flows (nothing per ephemeral port) and their counts.
func checkForwarded(t *testing.T, tr *tracer.Tracer, h *testnet.Host, client, forwarder expectFlow, queries uint64) {
	t.Helper()
	l := tracertest.NewLedger()
	find := func(l *tracertest.Ledger, e expectFlow) (tracer.Flow, bool) {
		for _, f := range l.Of(e.host) {
			if f.Proto == "udp" && f.Direction == e.dir && f.LocalIP() == e.local && f.RemoteIP() == e.remote && f.Port == e.port {
				return f, true
			}
		}
		return tracer.Flow{}, false
	}
	// Done when the client received every answer and the forwarder's
	// namespace counted every answer sent, in whatever flows: the checks
	// below say which.
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		c, ok := find(l, client)
		if !ok || c.DatagramsReceived < queries {
			return false
		}
		var answers uint64
		for _, f := range l.Of(forwarder.host) {
			if tracertest.FlowID(f) != tracertest.FlowID(c) {
				answers += f.DatagramsSent
			}
		}
		return answers >= queries
	})
	for _, e := range []expectFlow{client, forwarder} {
		f, ok := find(l, e)
		if !ok {
			t.Errorf("%s: no flow udp %s %s -> %s port %d; %s has %d flows", e.what, e.dir, e.local, e.remote, e.port, e.host.Name, len(l.Of(e.host)))
			continue
		}
		sent, recv := f.DatagramsSent, f.DatagramsReceived
		bsent, brecv := f.BytesSent, f.BytesReceived
		wantSent, wantRecv := uint64(dnsQuery), uint64(dnsAnswer)
		if e.dir == tracer.Inbound {
			wantSent, wantRecv = wantRecv, wantSent
		}
		if !l.Counted(sent, queries) || !l.Counted(recv, queries) ||
			!l.CountedBytes(bsent, queries*wantSent, wantSent) || !l.CountedBytes(brecv, queries*wantRecv, wantRecv) {
			t.Errorf("%s: %+v; want %d datagrams each way, %d bytes sent, %d received",
				e.what, f.Counters, queries, queries*wantSent, queries*wantRecv)
		}
	}
	// Nothing else: above all no outbound flow of the forwarder to each
	// query's ephemeral port.
	want := map[string]bool{}
	for _, e := range []expectFlow{client, forwarder} {
		if f, ok := find(l, e); ok {
			want[tracertest.FlowID(f)] = true
		}
	}
	hosts := []*testnet.Host{client.host}
	if forwarder.host != client.host {
		hosts = append(hosts, forwarder.host)
	}
	for _, host := range hosts {
		for _, f := range l.Of(host) {
			if !want[tracertest.FlowID(f)] {
				t.Errorf("%s: unexpected flow udp %s %s -> %s port %d (pid %d %s): %+v",
					host.Name, f.Direction, f.LocalAddr, f.RemoteAddr, f.Port, f.PID, f.Comm, f.Counters)
			}
		}
	}
}

type expectFlow struct {
	what          string
	host          *testnet.Host
	dir           tracer.Direction
	local, remote netip.Addr
	port          uint16
}

// dockerCase checks one container's resolver: the client's one outbound
// flow to 127.0.0.11:53 (the address it queries, before the NAT rule) and
// the forwarder's one inbound flow on the port the kernel chose.
func dockerCase(t *testing.T, tr *tracer.Tracer, h *testnet.Host, port int) {
	t.Helper()
	client := queryConnected(t, h, dockerDNS.String()+":53")
	checkForwarded(t, tr, h,
		expectFlow{what: "client", host: h, dir: tracer.Outbound, local: client, remote: dockerDNS, port: 53},
		expectFlow{what: "forwarder", host: h, dir: tracer.Inbound, local: dockerDNS, remote: client, port: uint16(port)},
		dnsRounds)
}

// Docker's embedded DNS, its forwarder bound after deptrace started.
func TestDNSForwarderBoundAfterStart(t *testing.T) {
	nw := testnet.New(t, 1)
	h := nw.Hosts[0]
	tr := startTracer(t, nil)
	_, port := startForwarder(t, h, dockerDNS.String())
	natDockerDNS(t, h, port)
	dockerCase(t, tr, h, port)
}

// Docker's embedded DNS, its forwarder bound (and its rule loaded) before
// deptrace started: deptrace learns nothing about it at start.
func TestDNSForwarderBoundBeforeStart(t *testing.T) {
	nw := testnet.New(t, 1)
	h := nw.Hosts[0]
	_, port := startForwarder(t, h, dockerDNS.String())
	natDockerDNS(t, h, port)
	tr := startTracer(t, nil)
	dockerCase(t, tr, h, port)
}

// Docker's embedded DNS in a namespace created after deptrace started (a
// container started later).
func TestDNSForwarderInNetnsCreatedAfterStart(t *testing.T) {
	tr := startTracer(t, nil)
	nw := testnet.New(t, 1)
	h := nw.Hosts[0]
	_, port := startForwarder(t, h, dockerDNS.String())
	natDockerDNS(t, h, port)
	dockerCase(t, tr, h, port)
}

// A forwarder bound to the wildcard address with port 0 behind a redirect
// of the namespace's own address :53 (a node-local DNS cache), queried
// from another namespace by connected and unconnected clients.
func TestDNSForwarderBehindRedirect(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)
	_, port := startForwarder(t, b, "0.0.0.0")
	nft(t, b, fmt.Sprintf(`table ip deptrace_dns {
	chain prerouting {
		type nat hook prerouting priority -100; policy accept;
		ip daddr %s udp dport 53 redirect to :%d
	}
}
`, b.IPv4, port))
	queryConnected(t, a, b.IPv4.String()+":53")
	queryUnconnected(t, a, &net.UDPAddr{IP: b.IPv4, Port: 53})
	checkForwarded(t, tr, a,
		expectFlow{what: "client", host: a, dir: tracer.Outbound, local: addr(a.IPv4), remote: addr(b.IPv4), port: 53},
		expectFlow{what: "forwarder", host: b, dir: tracer.Inbound, local: addr(b.IPv4), remote: addr(a.IPv4), port: uint16(port)},
		2*dnsRounds)
}

// A forwarder older than deptrace that received a query before the start
// and answers it after: the first datagram deptrace sees on its socket is
// an answer it sends. It is still the server, with no flow to the
// ephemeral port of the query in flight.
func TestDNSForwarderAnswerInFlightAtStart(t *testing.T) {
	nw := testnet.New(t, 1)
	h := nw.Hosts[0]
	hold := make(chan struct{})
	_, port := startForwarderHeld(t, h, dockerDNS.String(), hold)
	natDockerDNS(t, h, port)
	// The answer is held while the tracer loads, which takes over 30 s in
	// an emulated 7.x guest (the kernel matrix): longer than conntrack
	// keeps an unreplied UDP entry by default, after which the answer's
	// source is no longer translated back to 127.0.0.11:53 and the client
	// drops it. This namespace keeps it ten minutes.
	h.Do(t, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_udp_timeout", []byte("600"), 0)
	})
	first, err := h.Dial("udp4", dockerDNS.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := first.Write(make([]byte, dnsQuery)); err != nil {
		t.Fatal(err)
	}
	awaitHeld(t, hold) // received, its answer held
	tr := startTracer(t, nil)
	close(hold)
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := first.Read(make([]byte, 512)); err != nil || n != dnsAnswer {
		t.Fatalf("answer in flight: %d bytes, %v", n, err)
	}
	client := queryConnected(t, h, dockerDNS.String()+":53")
	// The query in flight was sent before the start: one datagram fewer
	// each way is counted on the side that sent or received it then.
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		var in, out uint64
		for _, f := range l.Of(h) {
			if f.Direction == tracer.Inbound {
				in += f.DatagramsSent
			} else {
				out += f.DatagramsReceived
			}
		}
		return in >= dnsRounds+1 && out >= dnsRounds+1
	})
	flows := l.Of(h)
	if len(flows) != 2 {
		t.Fatalf("want the client's and the forwarder's flows, have %d: %+v", len(flows), flows)
	}
	for _, f := range flows {
		switch f.Direction {
		case tracer.Outbound:
			checkFlow(t, f, "udp", tracer.Outbound, client, dockerDNS, 53)
			if !l.Counted(f.DatagramsSent, dnsRounds) || !l.Counted(f.DatagramsReceived, dnsRounds+1) {
				t.Errorf("client: %+v; want %d datagrams sent, %d received", f.Counters, dnsRounds, dnsRounds+1)
			}
		default:
			checkFlow(t, f, "udp", tracer.Inbound, dockerDNS, client, uint16(port))
			if !l.Counted(f.DatagramsReceived, dnsRounds) || !l.Counted(f.DatagramsSent, dnsRounds+1) {
				t.Errorf("forwarder: %+v; want %d datagrams received, %d sent", f.Counters, dnsRounds, dnsRounds+1)
			}
		}
	}
}

// The other side of that rule: an unconnected client socket older than
// deptrace whose first datagram deptrace sees is a reply (a QUIC client's,
// say) talks to one peer and stays the client.
func TestUDPUnconnectedClientOlderThanTracer(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	hold := make(chan struct{})
	srv := b.ListenPacket(t, "udp4", b.IPv4.String()+":5354")
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			if hold != nil {
				hold <- struct{}{} // received (awaitHeld)
				<-hold             // until the test closes it
				hold = nil
			}
			_, _ = srv.WriteTo(make([]byte, n+5), from)
		}
	}()
	uc := a.ListenPacket(t, "udp4", ":0")
	to := &net.UDPAddr{IP: b.IPv4, Port: 5354}
	if _, err := uc.WriteTo(make([]byte, 20), to); err != nil {
		t.Fatal(err)
	}
	awaitHeld(t, hold)
	tr := startTracer(t, nil)
	close(hold)
	buf := make([]byte, 512)
	uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := uc.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}
	const rounds = 4
	for i := 0; i < rounds; i++ {
		if _, err := uc.WriteTo(make([]byte, 20), to); err != nil {
			t.Fatal(err)
		}
		uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := uc.ReadFrom(buf); err != nil {
			t.Fatal(err)
		}
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		var got uint64
		for _, f := range l.Of(a) {
			got += f.DatagramsReceived
		}
		return got >= rounds+1
	})
	out := l.One(t, a)
	checkFlow(t, out, "udp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 5354)
	if !l.Counted(out.DatagramsSent, rounds) || !l.Counted(out.DatagramsReceived, rounds+1) ||
		!l.CountedBytes(out.BytesReceived, (rounds+1)*25, 25) {
		t.Errorf("client: %+v; want %d datagrams sent, %d (%d bytes) received", out.Counters, rounds, rounds+1, (rounds+1)*25)
	}
}

// A drain between the forwarder's first peer and its second, as when a
// container resolves once at start and again later: the forwarder, bound
// after deptrace started, is the server from its first query on, never a
// client of that query's ephemeral port.
func TestDNSForwarderDrainBeforeSecondPeer(t *testing.T) {
	nw := testnet.New(t, 1)
	h := nw.Hosts[0]
	tr := startTracer(t, nil)
	_, port := startForwarder(t, h, dockerDNS.String())
	natDockerDNS(t, h, port)
	c, err := h.Dial("udp4", dockerDNS.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	client := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	if err := roundTrip(c, dnsQuery, dnsAnswer); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// Drains until the answer is counted at both ends, in whatever
	// flows (the checks below say which): one peer so far.
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		var sent, recv uint64
		for _, f := range l.Of(h) {
			sent += f.DatagramsSent
			recv += f.DatagramsReceived
		}
		return sent >= 2 && recv >= 2
	})
	flows := l.Of(h)
	if len(flows) != 2 {
		t.Fatalf("want the client's and the forwarder's flows, have %d: %+v", len(flows), flows)
	}
	for _, f := range flows {
		if f.Direction == tracer.Outbound {
			checkFlow(t, f, "udp", tracer.Outbound, client, dockerDNS, 53)
		} else {
			checkFlow(t, f, "udp", tracer.Inbound, dockerDNS, client, uint16(port))
		}
		if !l.Counted(f.DatagramsSent, 1) || !l.Counted(f.DatagramsReceived, 1) {
			t.Errorf("%s flow: %+v; want one datagram each way", f.Direction, f.Counters)
		}
	}
	// The next queries, from other sockets, go on the same two flows.
	dockerCase(t, tr, h, port)
}

// A forwarder that answers on other threads while its reader takes the
// next query, as dockerd's does (one goroutine reads, one per query
// answers): a send and a receive on one unconnected socket at the same
// moment, each needing the peer its own cgroup hook saw. Clients send two
// queries at once and then read both answers, as busybox's and glibc's
// resolvers do for A and AAAA. Every datagram must be counted at both
// ends: a peer taken by the other direction's call would lose one.
func TestUDPForwarderAnswersWhileReading(t *testing.T) {
	nw := testnet.New(t, 1)
	h := nw.Hosts[0]
	tr := startTracer(t, nil)
	fwd, port := startConcurrentForwarder(t, h, dockerDNS.String())
	defer fwd.Close()
	natDockerDNS(t, h, port)

	const clients, rounds = 4, 150
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		go func() {
			errs <- func() error {
				uc, err := h.Dial("udp4", dockerDNS.String()+":53")
				if err != nil {
					return err
				}
				defer uc.Close()
				buf := make([]byte, 512)
				for i := 0; i < rounds; i++ {
					for q := 0; q < 2; q++ {
						if _, err := uc.Write(make([]byte, dnsQuery)); err != nil {
							return err
						}
					}
					for q := 0; q < 2; q++ {
						uc.SetReadDeadline(time.Now().Add(5 * time.Second))
						if n, err := uc.Read(buf); err != nil || n != dnsAnswer {
							return fmt.Errorf("round %d answer %d: %d bytes, %v", i, q, n, err)
						}
					}
				}
				return nil
			}()
		}()
	}
	for c := 0; c < clients; c++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	const queries = clients * rounds * 2
	l := tracertest.NewLedger()
	var in tracer.Flow
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		in = tracer.Flow{}
		for _, f := range l.Of(h) {
			if f.Proto == "udp" && f.Direction == tracer.Inbound && f.Port == uint16(port) {
				in.Counters.Add(f.Counters)
			}
		}
		return in.DatagramsReceived >= queries && in.DatagramsSent >= queries
	})
	if !l.Counted(in.DatagramsReceived, queries) || !l.Counted(in.DatagramsSent, queries) ||
		!l.CountedBytes(in.BytesReceived, queries*dnsQuery, dnsQuery) || !l.CountedBytes(in.BytesSent, queries*dnsAnswer, dnsAnswer) {
		t.Errorf("forwarder on port %d: %+v; want %d datagrams each way", port, in.Counters, queries)
	}
}

// startConcurrentForwarder is startForwarder whose answers are written by
// a goroutine per query while the reader goes on.
func startConcurrentForwarder(t *testing.T, h *testnet.Host, bindAddr string) (*net.UDPConn, int) {
	t.Helper()
	uc := h.ListenPacket(t, "udp4", bindAddr+":0").(*net.UDPConn)
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := uc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			go func() { _, _ = uc.WriteToUDP(make([]byte, dnsAnswer), from) }() // a lost answer fails the client's read
		}
	}()
	return uc, uc.LocalAddr().(*net.UDPAddr).Port
}
