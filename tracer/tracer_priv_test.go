package tracer_test

// Privileged tests: they load the real programs, build hosts as network
// namespaces (veth + bridge, documentation addresses that exist only inside
// them) and drive real sockets. They skip without root on a laptop and fail
// under CI=true.

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

func startTracer(t *testing.T, mutate func(*tracer.Config)) *tracer.Tracer {
	t.Helper()
	testnet.RequireRoot(t)
	cfg := tracer.DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	tr, err := tracer.New(cfg)
	if err != nil {
		t.Fatalf("load tracer: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	for _, h := range tr.Hooks() {
		if !h.Active {
			t.Fatalf("hook %s inactive on the CI kernel: %s", h.Hook, h.Reason)
		}
	}
	if _, _, err := tr.Seeded(); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return tr
}

func collect(t *testing.T, tr *tracer.Tracer) tracer.Interval {
	t.Helper()
	iv, err := tr.Collect()
	if err != nil {
		t.Fatalf("collect: %v", err)
	}
	return iv
}

func inNetns(flows []tracer.Flow, ino uint32) []tracer.Flow {
	var out []tracer.Flow
	for _, f := range flows {
		if f.NetNS == ino {
			out = append(out, f)
		}
	}
	return out
}

// only returns the single flow of host h, failing if there is not exactly one.
func only(t *testing.T, flows []tracer.Flow, h *testnet.Host) tracer.Flow {
	t.Helper()
	got := inNetns(flows, h.Inode)
	if len(got) != 1 {
		t.Fatalf("host %s: want exactly 1 flow, got %d: %+v", h.Name, len(got), got)
	}
	return got[0]
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func checkFlow(t *testing.T, f tracer.Flow, proto, dir string, local, remote netip.Addr, port uint16) {
	t.Helper()
	if f.Proto != proto || f.Direction != dir || f.LocalIP() != local || f.RemoteIP() != remote || f.Port != port {
		t.Fatalf("flow %s %s %s -> %s port %d; want %s %s %s -> %s port %d",
			f.Proto, f.Direction, f.LocalAddr, f.RemoteAddr, f.Port, proto, dir, local, remote, port)
	}
}

// echoServer answers every connection: reads reqSize bytes, writes
// respSize bytes, closes. It returns once n connections were served.
func echoServer(ln net.Listener, n, reqSize, respSize int) (wait func() error) {
	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			c, err := ln.Accept()
			if err != nil {
				errs <- err
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadFull(c, make([]byte, reqSize)); err != nil {
					errs <- err
					return
				}
				if _, err := c.Write(bytes.Repeat([]byte{'r'}, respSize)); err != nil {
					errs <- err
				}
			}()
		}
	}()
	return func() error {
		wg.Wait()
		close(errs)
		return <-errs
	}
}

func roundTrip(c net.Conn, reqSize, respSize int) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(bytes.Repeat([]byte{'q'}, reqSize)); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, respSize))
	return err
}

// connectN opens n short-lived connections from h to addr, one round trip
// each.
func connectN(t *testing.T, h *testnet.Host, network, addr string, n, req, resp int) {
	t.Helper()
	for i := 0; i < n; i++ {
		c, err := h.Dial(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		err = roundTrip(c, req, resp)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestShortLivedTCPExactCounts(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)

	const n, req, resp = 200, 100, 37
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":8080")
	wait := echoServer(ln, n, req, resp)
	connectN(t, a, "tcp4", b.IPv4.String()+":8080", n, req, resp)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	iv := collect(t, tr)

	out := only(t, iv.Flows, a)
	checkFlow(t, out, "tcp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 8080)
	if out.Connections != n || out.FailedConnections != 0 || out.BytesSent != n*req || out.BytesReceived != n*resp {
		t.Errorf("client flow: %+v; want %d connections, %d sent, %d received", out, n, n*req, n*resp)
	}
	in := only(t, iv.Flows, b)
	checkFlow(t, in, "tcp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 8080)
	if in.Connections != n || in.FailedConnections != 0 || in.BytesReceived != n*req || in.BytesSent != n*resp {
		t.Errorf("server flow: %+v; want %d connections, %d received, %d sent", in, n, n*req, n*resp)
	}
	if out.Comm == "" || out.PID == 0 || in.PID == 0 {
		t.Errorf("process not named: client %d/%q server %d/%q", out.PID, out.Comm, in.PID, in.Comm)
	}
	if out.FirstSeen.After(out.LastSeen) || time.Since(out.LastSeen) > time.Minute || out.LastSeen.After(time.Now()) {
		t.Errorf("timestamps not wall clock: first %s last %s", out.FirstSeen, out.LastSeen)
	}
	if iv.Lost.Total() != 0 {
		t.Errorf("lost events: %+v", iv.Lost)
	}
}

// Counts must add up exactly across many drains while traffic runs: the
// map swap may not lose or double an increment at an interval boundary.
func TestNoLossAcrossDrains(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)

	const n, req, resp = 300, 10, 10
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":8081")
	wait := echoServer(ln, n, req, resp)
	stop := make(chan struct{})
	var flows []tracer.Flow
	drained := make(chan struct{})
	go func() { // drain every millisecond, far faster than any real interval
		defer close(drained)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				iv, err := tr.Collect()
				if err != nil {
					t.Error(err)
					return
				}
				flows = append(flows, iv.Flows...)
			}
		}
	}()
	connectN(t, a, "tcp4", b.IPv4.String()+":8081", n, req, resp)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-drained
	flows = append(flows, collect(t, tr).Flows...)

	var sum tracer.Flow
	for _, f := range inNetns(flows, a.Inode) {
		sum.Connections += f.Connections
		sum.BytesSent += f.BytesSent
		sum.BytesReceived += f.BytesReceived
	}
	if sum.Connections != n || sum.BytesSent != n*req || sum.BytesReceived != n*resp {
		t.Errorf("summed over %d drained records: %d connections, %d sent, %d received; want %d, %d, %d",
			len(flows), sum.Connections, sum.BytesSent, sum.BytesReceived, n, n*req, n*resp)
	}
}

func TestPersistentTCPIncludingOneOpenedBeforeStart(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	testnet.RequireRoot(t)

	// Listener and one connection exist before deptrace starts.
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":5432")
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
			go loadgen.Echo(c) // read/write, not splice: see docs/flows.md
		}
	}()
	old, err := a.Dial("tcp4", b.IPv4.String()+":5432")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := roundTrip(old, 5, 5); err != nil {
		t.Fatal(err)
	}

	tr := startTracer(t, nil)
	collect(t, tr) // discard whatever the start-up saw

	// Its next bytes are reported within one interval, with the right
	// direction on both ends.
	if err := roundTrip(old, 64, 64); err != nil {
		t.Fatal(err)
	}
	iv := collect(t, tr)
	out := only(t, iv.Flows, a)
	checkFlow(t, out, "tcp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 5432)
	if out.Connections != 0 || out.BytesSent != 64 || out.BytesReceived != 64 {
		t.Errorf("pre-existing client: %+v", out)
	}
	in := only(t, iv.Flows, b)
	checkFlow(t, in, "tcp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 5432)
	if in.BytesSent != 64 || in.BytesReceived != 64 {
		t.Errorf("pre-existing server: %+v", in)
	}

	// A new persistent connection: one open, then bytes over several
	// intervals, each counted once.
	c, err := a.Dial("tcp4", b.IPv4.String()+":5432")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var conns, sent uint64
	for round := 0; round < 3; round++ {
		for i := 0; i < 10; i++ {
			if err := roundTrip(c, 20, 20); err != nil {
				t.Fatal(err)
			}
		}
		f := only(t, collect(t, tr).Flows, a)
		conns += f.Connections
		sent += f.BytesSent
		if f.BytesSent != 200 || f.BytesReceived != 200 {
			t.Errorf("round %d: %+v; want 200 bytes each way", round, f)
		}
	}
	if conns != 1 || sent != 600 {
		t.Errorf("new persistent connection: %d opens, %d bytes sent; want 1, 600", conns, sent)
	}
}

func TestUDPConnectedAndUnconnected(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)

	srv := b.ListenPacket(t, "udp4", b.IPv4.String()+":5353")
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			srv.WriteTo(buf[:n/2], from) // reply with half the request
		}
	}()
	const rounds = 5

	// Connected client socket (connect + send/recv).
	cc, err := a.Dial("udp4", b.IPv4.String()+":5353")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for i := 0; i < rounds; i++ {
		if err := roundTrip(cc, 40, 20); err != nil {
			t.Fatal(err)
		}
	}
	iv := collect(t, tr)
	out := only(t, iv.Flows, a)
	checkFlow(t, out, "udp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 5353)
	if out.BytesSent != rounds*40 || out.BytesReceived != rounds*20 {
		t.Errorf("connected client: %+v", out)
	}
	in := only(t, iv.Flows, b)
	// The server socket is unconnected and bound to the wildcard-free
	// address; its peer comes from recvfrom/sendto.
	checkFlow(t, in, "udp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 5353)
	if in.BytesReceived != rounds*40 || in.BytesSent != rounds*20 {
		t.Errorf("server: %+v", in)
	}

	// Unconnected client socket (sendto/recvfrom), bound to a wildcard
	// address: the local address is the wildcard, the peer is exact.
	uc := a.ListenPacket(t, "udp4", ":0")
	buf := make([]byte, 100)
	for i := 0; i < rounds; i++ {
		if _, err := uc.WriteTo(make([]byte, 30), &net.UDPAddr{IP: b.IPv4, Port: 5353}); err != nil {
			t.Fatal(err)
		}
		uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := uc.ReadFrom(buf); err != nil {
			t.Fatal(err)
		}
	}
	iv = collect(t, tr)
	out = only(t, iv.Flows, a)
	checkFlow(t, out, "udp", tracer.Outbound, netip.IPv4Unspecified(), addr(b.IPv4), 5353)
	if out.BytesSent != rounds*30 || out.BytesReceived != rounds*15 {
		t.Errorf("unconnected client: %+v", out)
	}
	in = only(t, iv.Flows, b)
	checkFlow(t, in, "udp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 5353)
	if iv.Lost.UDPPeerUnknown != 0 {
		t.Errorf("udp peers lost: %+v", iv.Lost)
	}
}

func TestIPv6AndRefusedConnection(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)

	server := net.JoinHostPort(b.IPv6.String(), "443")
	ln := b.Listen(t, "tcp6", server)
	const n = 7
	wait := echoServer(ln, n, 11, 13)
	connectN(t, a, "tcp6", server, n, 11, 13)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	iv := collect(t, tr)
	out := only(t, iv.Flows, a)
	checkFlow(t, out, "tcp", tracer.Outbound, addr(a.IPv6), addr(b.IPv6), 443)
	if out.Connections != n || out.BytesSent != n*11 || out.BytesReceived != n*13 {
		t.Errorf("ipv6 client: %+v", out)
	}
	in := only(t, iv.Flows, b)
	checkFlow(t, in, "tcp", tracer.Inbound, addr(b.IPv6), addr(a.IPv6), 443)
	if in.Connections != n {
		t.Errorf("ipv6 server: %+v", in)
	}

	// Nothing listens on port 9: refused, a failed attempt, no connection.
	const refused = 3
	for i := 0; i < refused; i++ {
		if c, err := a.Dial("tcp6", net.JoinHostPort(b.IPv6.String(), "9")); err == nil {
			c.Close()
			t.Fatal("connection to a closed port succeeded")
		}
	}
	iv = collect(t, tr)
	f := only(t, iv.Flows, a)
	checkFlow(t, f, "tcp", tracer.Outbound, addr(a.IPv6), addr(b.IPv6), 9)
	if f.FailedConnections != refused || f.Connections != 0 || f.BytesSent != 0 {
		t.Errorf("refused: %+v; want %d failed, 0 connections", f, refused)
	}
	if got := inNetns(iv.Flows, b.Inode); len(got) != 0 {
		t.Errorf("refused connections created server flows: %+v", got)
	}
}

func TestTinyMapCountsLosses(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	const size = 64
	tr := startTracer(t, func(c *tracer.Config) { c.FlowMapSize = size })

	// 150 distinct server ports: 150 distinct dependencies, more than fit.
	pc := a.ListenPacket(t, "udp4", a.IPv4.String()+":0")
	for p := 20000; p < 20150; p++ {
		if _, err := pc.WriteTo([]byte("x"), &net.UDPAddr{IP: b.IPv4, Port: p}); err != nil {
			t.Fatal(err)
		}
	}
	iv := collect(t, tr)
	if len(iv.Flows) > size {
		t.Errorf("%d flows from a map of %d", len(iv.Flows), size)
	}
	if iv.Lost.FlowMapFull < 150-size {
		t.Errorf("lost %d events; want at least %d counted as flow_map_full", iv.Lost.FlowMapFull, 150-size)
	}
	st, err := tr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.FlowInsertFailed != iv.Lost.FlowMapFull {
		t.Errorf("cumulative %d vs interval %d", st.FlowInsertFailed, iv.Lost.FlowMapFull)
	}
	// The next interval has room again: nothing more is lost.
	pc.WriteTo([]byte("x"), &net.UDPAddr{IP: b.IPv4, Port: 20000})
	if iv := collect(t, tr); iv.Lost.FlowMapFull != 0 || len(inNetns(iv.Flows, a.Inode)) != 1 {
		t.Errorf("after drain: lost %d, flows %d", iv.Lost.FlowMapFull, len(iv.Flows))
	}
}

func TestNetnsFilter(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, func(c *tracer.Config) { c.NetNS = b.Inode })

	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7000")
	wait := echoServer(ln, 2, 1, 1)
	for i := 0; i < 2; i++ {
		c, err := a.Dial("tcp4", b.IPv4.String()+":7000")
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(c, 1, 1)
		c.Close()
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	iv := collect(t, tr)
	for _, f := range iv.Flows {
		if f.NetNS != b.Inode {
			t.Errorf("flow from netns %d traced with --netns %d: %+v", f.NetNS, b.Inode, f)
		}
	}
	if f := only(t, iv.Flows, b); f.Connections != 2 {
		t.Errorf("server: %+v", f)
	}
}

// Listening ports of several namespaces are told apart.
func TestPortTableIsPerNamespace(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	ln := b.Listen(t, "tcp4", ":6000") // before start: seeded
	tr := startTracer(t, nil)
	udp := a.ListenPacket(t, "udp6", "[::]:6001") // after start: tracked live
	_ = udp
	ports, err := tr.ListeningPorts()
	if err != nil {
		t.Fatal(err)
	}
	has := func(ns uint32, proto uint8, port uint16) bool {
		for _, p := range ports {
			if p.NetNS == ns && p.Proto == proto && p.Port == port {
				return true
			}
		}
		return false
	}
	if !has(b.Inode, 6, 6000) || has(a.Inode, 6, 6000) {
		t.Errorf("tcp 6000 should be listed for %s only: %+v", b.Name, ports)
	}
	if !has(a.Inode, 17, 6001) || has(b.Inode, 17, 6001) {
		t.Errorf("udp 6001 should be listed for %s only: %+v", a.Name, ports)
	}
	ln.Close()
	udp.Close()
	ports, _ = tr.ListeningPorts()
	if has(b.Inode, 6, 6000) || has(a.Inode, 17, 6001) {
		t.Errorf("closed sockets still listed: %+v", ports)
	}
}
