package tracer_test

// Privileged tests: they load the real programs, build hosts as network
// namespaces (veth + bridge, documentation addresses that exist only inside
// them) and drive real sockets. They skip without root on a laptop and fail
// under CI=true.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// startTracer loads this test's own tracer (tracertest.Start), after
// unloading the shared one: one deptrace loaded at a time.
func startTracer(t *testing.T, mutate func(*tracer.Config)) *tracer.Tracer {
	t.Helper()
	testnet.RequireRoot(t)
	unloadShared(t)
	return tracertest.Start(t, mutate)
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

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func checkFlow(t *testing.T, f tracer.Flow, proto tracer.Proto, dir tracer.Direction, local, remote netip.Addr, port uint16) {
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
	tr := startSharedTracer(t)

	const n, req, resp = 200, 100, 37
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":8080")
	wait := echoServer(ln, n, req, resp)
	connectN(t, a, "tcp4", b.IPv4.String()+":8080", n, req, resp)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		o, i := l.One(t, a), l.One(t, b)
		return o.BytesReceived >= n*resp && i.BytesReceived >= n*req && o.BytesSent >= n*req && i.BytesSent >= n*resp
	})
	out := l.One(t, a)
	checkFlow(t, out, "tcp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 8080)
	if !l.Counted(out.Connections, n) || out.FailedConnections != 0 || !l.CountedBytes(out.BytesSent, n*req, req) || !l.CountedBytes(out.BytesReceived, n*resp, resp) {
		t.Errorf("client flow: %+v; want %d connections, %d sent, %d received", out.Counters, n, n*req, n*resp)
	}
	if !l.Counted(out.ConnectLatencyCount, n) || out.ConnectLatencyMaxUs == 0 || out.ConnectLatencySumUs < out.ConnectLatencyMaxUs {
		t.Errorf("client connect latency: %+v", out.Counters)
	}
	in := l.One(t, b)
	checkFlow(t, in, "tcp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 8080)
	if !l.Counted(in.Connections, n) || in.FailedConnections != 0 || !l.CountedBytes(in.BytesReceived, n*req, req) || !l.CountedBytes(in.BytesSent, n*resp, resp) {
		t.Errorf("server flow: %+v; want %d connections, %d received, %d sent", in.Counters, n, n*req, n*resp)
	}
	// One RTT sample per connection, at its close (the kernel matrix's
	// tier runs this test: srtt is read on every kernel; the values are
	// checked against TCP_INFO by TestRTTFromTheSocket).
	for _, f := range []tracer.Flow{out, in} {
		if !l.Counted(f.RTTSamples, n) || f.RTTMinUs == 0 || f.RTTMinUs > f.RTTAvgUs() || f.RTTAvgUs() > f.RTTMaxUs {
			t.Errorf("%s flow RTT: %d samples, min %d avg %d max %d us; want %d samples, 0 < min <= avg <= max", f.Direction, f.RTTSamples, f.RTTMinUs, f.RTTAvgUs(), f.RTTMaxUs, n)
		}
	}
	if out.Comm != testComm() || out.PID != uint32(os.Getpid()) || in.PID != uint32(os.Getpid()) {
		t.Errorf("process not named: client %d/%q server %d/%q; want %d/%q", out.PID, out.Comm, in.PID, in.Comm, os.Getpid(), testComm())
	}
	if out.FirstSeen.After(out.LastSeen) || time.Since(out.LastSeen) > time.Minute || out.LastSeen.After(time.Now()) {
		t.Errorf("timestamps not wall clock: first %s last %s", out.FirstSeen, out.LastSeen)
	}
	// The tracer sees the whole machine, where any daemon may read a
	// datagram without asking its sender (udp_peer_unknown): no TCP
	// count depends on that. Recursion losses, where they can happen,
	// are checked above (counted).
	lost := l.Lost
	lost.UDPPeerUnknown = 0
	if bundler.TaskMarks() {
		lost.RecursionMisses = 0
	}
	if lost.Total() != 0 {
		t.Errorf("lost events: %+v", l.Lost)
	}
}

// testComm is this test binary's process name, as the kernel knows it.
func testComm() string {
	b, _ := os.ReadFile("/proc/self/comm")
	return strings.TrimSpace(string(b))
}

// Counts must add up exactly across many drains while traffic runs: the
// switch of interval and the harvest may not lose or double a byte at an interval
// boundary.
func TestNoLossAcrossDrains(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	const n, req, resp = 300, 10, 10
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":8081")
	wait := echoServer(ln, n, req, resp)
	stop := make(chan struct{})
	l := tracertest.NewLedger()
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
				l.Add(iv)
			}
		}
	}()
	connectN(t, a, "tcp4", b.IPv4.String()+":8081", n, req, resp)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-drained
	want := func(l *tracertest.Ledger) bool {
		o, i := l.One(t, a), l.One(t, b)
		return o.BytesSent >= n*req && o.BytesReceived >= n*resp && i.BytesSent >= n*resp && i.BytesReceived >= n*req
	}
	tracertest.Settle(t, tr, l, want)
	for _, h := range []*testnet.Host{a, b} {
		f := l.One(t, h)
		sent, recv, perSent, perRecv := uint64(n*req), uint64(n*resp), uint64(req), uint64(resp)
		if h == b {
			sent, recv, perSent, perRecv = recv, sent, perRecv, perSent
		}
		if !l.Counted(f.Connections, n) || !l.CountedBytes(f.BytesSent, sent, perSent) || !l.CountedBytes(f.BytesReceived, recv, perRecv) {
			t.Errorf("%s: %+v; want %d connections, %d sent, %d received", h.Name, f.Counters, n, sent, recv)
		}
	}
}

// A connection alive across many drains, with bursts, then closed: its
// bytes are counted once, byte for byte; and one open before start counts
// its bytes from start only.
func TestPersistentTCPIncludingOneOpenedBeforeStart(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	testnet.RequireRoot(t)

	old, err := a.Dial("tcp4", echoingServer(t, b, 5432))
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(old, 500, 500); err != nil { // before start: not counted
		t.Fatal(err)
	}

	tr := startSharedTracerAfter(t)
	l := tracertest.NewLedger()
	// Its next bytes are reported within one interval, with the right
	// direction on both ends.
	if err := roundTrip(old, 64, 64); err != nil {
		t.Fatal(err)
	}
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).BytesReceived > 0 && l.One(t, b).BytesReceived > 0 })
	checkFlow(t, l.One(t, a), "tcp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 5432)
	checkFlow(t, l.One(t, b), "tcp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 5432)
	// The server listened before deptrace started: its process is found
	// from the socket at start-up, not left unnamed.
	if f := l.One(t, b); f.PID != uint32(os.Getpid()) || f.Comm != testComm() {
		t.Errorf("server listening since before start named %d/%q; want %d/%q", f.PID, f.Comm, os.Getpid(), testComm())
	}

	// A new connection sends bursts across at least five drains.
	c, err := a.Dial("tcp4", b.IPv4.String()+":5432")
	if err != nil {
		t.Fatal(err)
	}
	const rounds, burst, size = 6, 10, 20
	for round := 0; round < rounds; round++ {
		for i := 0; i < burst; i++ {
			if err := roundTrip(c, size, size); err != nil {
				t.Fatal(err)
			}
		}
		l.Add(tracertest.Collect(t, tr))
	}
	// Its bytes are reported while it lives, not only at its close: a
	// connection that has moved 16 segments is tagged for the drains.
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesSent >= 64+rounds*burst*size && l.One(t, b).BytesSent >= 64+rounds*burst*size
	})
	c.Close()
	old.Close()
	const total = 64 + rounds*burst*size
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		o, i := l.One(t, a), l.One(t, b)
		return o.BytesSent >= total && o.BytesReceived >= total && i.BytesSent >= total && i.BytesReceived >= total
	})
	for _, h := range []*testnet.Host{a, b} {
		f := l.One(t, h)
		if !l.Counted(f.Connections, 1) || !l.CountedBytes(f.BytesSent, total, rounds*burst*size) || !l.CountedBytes(f.BytesReceived, total, rounds*burst*size) {
			t.Errorf("%s: %+v; want 1 open (the one before start is not an open seen), %d bytes each way", h.Name, f.Counters, total)
		}
	}
}

// A connection busy while deptrace starts counts from the start, as one
// idle then does: the programs attach before the seed tags the open
// connections, and a send in between must not tag it as if its open had
// been seen (which counts every byte since its open).
func TestBusyConnectionAtStartCountsFromStart(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	testnet.RequireRoot(t)

	c, err := a.Dial("tcp4", echoingServer(t, b, 5433))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 1000
	for i := 0; i < 50; i++ { // far past the segments a late tag waits for
		if err := roundTrip(c, size, size); err != nil {
			t.Fatal(err)
		}
	}
	// Round trips go on, a millisecond apart, while the tracer loads,
	// attaches and seeds, and a while after.
	var sent atomic.Int64
	sent.Store(50 * size)
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; i < 100000; i++ { // bounded: about 100 s at most
			select {
			case <-stop:
				done <- nil
				return
			case <-time.After(time.Millisecond):
			}
			if err := roundTrip(c, size, size); err != nil {
				done <- err
				return
			}
			sent.Add(size)
		}
		done <- nil
	}()
	before := sent.Load()
	tr := startSharedTracerAfter(t)
	after := sent.Load()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	total := sent.Load()
	c.Close()
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesSent >= uint64(total-after) && l.One(t, b).BytesSent >= uint64(total-after)
	})
	// Nothing sent before the start began may be counted; all sent after
	// it ended must be (each side's sent bytes are the other's received).
	for _, h := range []*testnet.Host{a, b} {
		f := l.One(t, h)
		if f.BytesSent > uint64(total-before) || f.BytesSent < uint64(total-after) || f.BytesReceived > uint64(total-before) || f.BytesReceived < uint64(total-after) {
			t.Errorf("%s: %d bytes sent, %d received; want from %d (sent after the start) to %d (sent once it began), not the %d sent since the open",
				h.Name, f.BytesSent, f.BytesReceived, total-after, total-before, total)
		}
		if f.Connections != 0 {
			t.Errorf("%s: %d opens; want none (it opened before the start)", h.Name, f.Connections)
		}
	}
}

// echoingServer listens on host's IPv4 address and port and echoes every
// connection for as long as the test runs (echoServer: a number of
// round trips); it returns the address.
func echoingServer(t *testing.T, host *testnet.Host, port int) string {
	addr := net.JoinHostPort(host.IPv4.String(), strconv.Itoa(port))
	ln := host.Listen(t, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go loadgen.Echo(c)
		}
	}()
	return addr
}

// rawConn runs fn on the socket's file descriptor, retrying while the
// non-blocking socket would block.
func rawConn(t *testing.T, c net.Conn, read bool, fn func(fd int) (done bool)) {
	t.Helper()
	sc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	op := sc.Write
	if read {
		op = sc.Read
	}
	if err := op(func(fd uintptr) bool { return fn(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}

// Bytes moved by splice(2) and sendfile(2) never pass through a
// send/receive call: the socket counts them, so deptrace does.
func TestSpliceAndSendfileExactBytes(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	const size = 900_000
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":9000")
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		// The server receives with splice: socket -> pipe -> /dev/null.
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil {
			got <- -1
			return
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		null, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		defer null.Close()
		var total int64
		sc, _ := c.(syscall.Conn).SyscallConn()
		_ = sc.Read(func(fd uintptr) bool {
			for {
				n, err := unix.Splice(int(fd), nil, p[1], nil, 65536, unix.SPLICE_F_NONBLOCK)
				if err == unix.EAGAIN {
					return false
				}
				if err != nil || n == 0 {
					return true
				}
				total += n
				_, _ = unix.Splice(p[0], nil, int(null.Fd()), nil, int(n), 0)
			}
		})
		got <- total
	}()
	// The client sends a file with sendfile.
	f, err := os.CreateTemp(t.TempDir(), "payload")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(bytes.Repeat([]byte{'s'}, size))
	c, err := a.Dial("tcp4", b.IPv4.String()+":9000")
	if err != nil {
		t.Fatal(err)
	}
	var off int64
	rawConn(t, c, false, func(fd int) bool {
		for off < size {
			_, err := unix.Sendfile(fd, int(f.Fd()), &off, size-int(off))
			if err == unix.EAGAIN {
				return false
			}
			if err != nil {
				t.Error(err)
				return true
			}
		}
		return true
	})
	c.Close()
	if n := <-got; n != size {
		t.Fatalf("server spliced %d bytes, want %d", n, size)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesSent >= size && l.One(t, b).BytesReceived >= size
	})
	if o := l.One(t, a); !l.CountedBytes(o.BytesSent, size, size) || !l.Counted(o.Connections, 1) {
		t.Errorf("sendfile client: %+v; want %d bytes sent", o.Counters, size)
	}
	if i := l.One(t, b); !l.CountedBytes(i.BytesReceived, size, size) || !l.Counted(i.Connections, 1) {
		t.Errorf("splicing server: %+v; want %d bytes received", i.Counters, size)
	}
}

// A thread that renamed itself (memcached's "mc-worker") still reports its
// process's name.
func TestProcessNameNotThreadName(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	ln := b.Listen(t, "tcp4", b.IPv4.String()+":11211")
	wait := echoServer(ln, 1, 3, 3)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the renamed thread dies with the goroutine
		if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte("mc-worker\x00")[0])), 0, 0, 0); err != nil {
			done <- err
			return
		}
		c, err := a.Dial("tcp4", b.IPv4.String()+":11211")
		if err != nil {
			done <- err
			return
		}
		err = roundTrip(c, 3, 3)
		c.Close()
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).Connections == 1 })
	if o := l.One(t, a); o.Comm != testComm() || o.PID != uint32(os.Getpid()) {
		t.Errorf("client named %d/%q, want the process %d/%q", o.PID, o.Comm, os.Getpid(), testComm())
	}
}

func TestUDPConnectedAndUnconnected(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	srv := b.ListenPacket(t, "udp4", b.IPv4.String()+":5353")
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteTo(buf[:n/2], from) // reply with half the request
		}
	}()
	const rounds = 5

	// Connected client socket (connect + send/recv), closed before the
	// drain: its last counts come from the release hook.
	cc, err := a.Dial("udp4", b.IPv4.String()+":5353")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < rounds; i++ {
		if err := roundTrip(cc, 40, 20); err != nil {
			t.Fatal(err)
		}
	}
	cc.Close()
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).DatagramsReceived >= rounds && l.One(t, b).DatagramsSent >= rounds
	})
	out := l.One(t, a)
	checkFlow(t, out, "udp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 5353)
	if !l.CountedBytes(out.BytesSent, rounds*40, 40) || !l.CountedBytes(out.BytesReceived, rounds*20, 20) || !l.Counted(out.DatagramsSent, rounds) || !l.Counted(out.DatagramsReceived, rounds) {
		t.Errorf("connected client: %+v", out.Counters)
	}
	in := l.One(t, b)
	checkFlow(t, in, "udp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 5353)
	if !l.CountedBytes(in.BytesReceived, rounds*40, 40) || !l.CountedBytes(in.BytesSent, rounds*20, 20) || !l.Counted(in.DatagramsReceived, rounds) {
		t.Errorf("server: %+v", in.Counters)
	}

	// Unconnected client socket (sendto/recvfrom) bound to the wildcard
	// address: the local address is the one the kernel sends from. Over
	// IPv4 and IPv6, whose sendmsg and recvmsg hooks are programs apart.
	srv6 := b.ListenPacket(t, "udp6", net.JoinHostPort(b.IPv6.String(), "5353"))
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv6.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = srv6.WriteTo(buf[:n/2], from)
		}
	}()
	for _, fam := range []struct {
		network string
		client  net.IP
		server  net.IP
	}{{"udp4", a.IPv4, b.IPv4}, {"udp6", a.IPv6, b.IPv6}} {
		uc := a.ListenPacket(t, fam.network, ":0")
		buf := make([]byte, 100)
		for i := 0; i < rounds; i++ {
			if _, err := uc.WriteTo(make([]byte, 30), &net.UDPAddr{IP: fam.server, Port: 5353}); err != nil {
				t.Fatal(err)
			}
			uc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := uc.ReadFrom(buf); err != nil {
				t.Fatal(err)
			}
		}
		uc.Close()
		l = tracertest.NewLedger()
		tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
			return l.One(t, a).DatagramsReceived >= rounds && l.One(t, b).DatagramsSent >= rounds
		})
		// Exact counts on both unconnected ends: a datagram whose peer was
		// missed would be missing here. (udp_peer_unknown itself is counted
		// machine-wide, where other processes add to it.)
		out = l.One(t, a)
		checkFlow(t, out, "udp", tracer.Outbound, addr(fam.client), addr(fam.server), 5353)
		if !l.CountedBytes(out.BytesSent, rounds*30, 30) || !l.CountedBytes(out.BytesReceived, rounds*15, 15) || !l.Counted(out.DatagramsSent, rounds) || !l.Counted(out.DatagramsReceived, rounds) {
			t.Errorf("%s unconnected client: %+v", fam.network, out.Counters)
		}
		in = l.One(t, b)
		checkFlow(t, in, "udp", tracer.Inbound, addr(fam.server), addr(fam.client), 5353)
		if !l.CountedBytes(in.BytesReceived, rounds*30, 30) || !l.CountedBytes(in.BytesSent, rounds*15, 15) || !l.Counted(in.DatagramsReceived, rounds) || !l.Counted(in.DatagramsSent, rounds) {
			t.Errorf("%s unconnected server: %+v", fam.network, in.Counters)
		}
	}
}

// An ICMP error read back from the error queue (IP_RECVERR, as DNS
// resolvers and time daemons do) returns a datagram this socket sent, not
// one it received: it is no traffic.
func TestUDPErrorQueueIsNotTraffic(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	c, err := a.Dial("udp4", b.IPv4.String()+":9") // nothing listens: port unreachable
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rawConn(t, c, false, func(fd int) bool {
		if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_RECVERR, 1); err != nil {
			t.Fatal(err)
		}
		return true
	})
	const rounds, size = 3, 25
	for i := 0; i < rounds; i++ {
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		rawConn(t, c, true, func(fd int) bool {
			n, _, _, _, err := unix.Recvmsg(fd, make([]byte, 100), make([]byte, 512), unix.MSG_ERRQUEUE)
			if err == unix.EAGAIN {
				return false
			}
			if err != nil || n != size {
				t.Fatalf("error queue read: %d bytes, %v; want the %d-byte datagram back", n, err, size)
			}
			return true
		})
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).DatagramsSent >= rounds })
	out := l.One(t, a)
	checkFlow(t, out, "udp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 9)
	if !l.Counted(out.DatagramsSent, rounds) || !l.CountedBytes(out.BytesSent, rounds*size, size) || out.DatagramsReceived != 0 || out.BytesReceived != 0 {
		t.Errorf("client: %+v; want %d datagrams (%d bytes) sent and nothing received", out.Counters, rounds, rounds*size)
	}
}

func TestIPv6AndFailureCauses(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	server := net.JoinHostPort(b.IPv6.String(), "443")
	ln := b.Listen(t, "tcp6", server)
	const n = 7
	wait := echoServer(ln, n, 11, 13)
	connectN(t, a, "tcp6", server, n, 11, 13)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesReceived >= n*13 && l.One(t, b).BytesReceived >= n*11
	})
	out := l.One(t, a)
	checkFlow(t, out, "tcp", tracer.Outbound, addr(a.IPv6), addr(b.IPv6), 443)
	if !l.Counted(out.Connections, n) || !l.CountedBytes(out.BytesSent, n*11, 11) || !l.CountedBytes(out.BytesReceived, n*13, 13) {
		t.Errorf("ipv6 client: %+v", out.Counters)
	}
	if in := l.One(t, b); !l.Counted(in.Connections, n) {
		t.Errorf("ipv6 server: %+v", in.Counters)
	}

	// Nothing listens on port 9: refused, a failed attempt, no connection.
	const refused = 3
	for i := 0; i < refused; i++ {
		if c, err := a.Dial("tcp6", net.JoinHostPort(b.IPv6.String(), "9")); err == nil {
			c.Close()
			t.Fatal("connection to a closed port succeeded")
		}
	}
	l = tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).FailedConnections >= refused })
	f := l.One(t, a)
	checkFlow(t, f, "tcp", tracer.Outbound, addr(a.IPv6), addr(b.IPv6), 9)
	if !l.Counted(f.FailedConnections, refused) || !l.Counted(f.FailedRefused, refused) || f.Connections != 0 || f.BytesSent != 0 {
		t.Errorf("refused: %+v; want %d failed, all refused, 0 connections", f.Counters, refused)
	}
	if got := l.Of(b); len(got) != 0 {
		t.Errorf("refused connections created server flows: %+v", got)
	}
}

// A server that closes with SO_LINGER 0 sends a reset; the client receives it.
func TestResetsBothEnds(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7001")
	const n = 4
	go func() {
		for i := 0; i < n; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.ReadFull(c, make([]byte, 5))
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := a.Dial("tcp4", b.IPv4.String()+":7001")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("hello"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client read after the server's abort: %v; want connection reset", err)
		}
		c.Close()
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).ResetsReceived >= n && l.One(t, b).ResetsSent >= n })
	if o := l.One(t, a); !l.Counted(o.ResetsReceived, n) || !l.Counted(o.Connections, n) {
		t.Errorf("client: %+v; want %d resets received", o.Counters, n)
	}
	if i := l.One(t, b); !l.Counted(i.ResetsSent, n) || !l.CountedBytes(i.BytesReceived, n*5, 5) {
		t.Errorf("server: %+v; want %d resets sent, %d bytes received", i.Counters, n, n*5)
	}
}

// A listener with backlog 1 that never accepts: drops are counted on it,
// and the clients' connects that never complete count as failures.
func TestListenQueueDrops(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	var lfd int
	b.Do(t, func() error {
		var err error
		if lfd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0); err != nil {
			return err
		}
		sa := &unix.SockaddrInet4{Port: 7002}
		copy(sa.Addr[:], b.IPv4.To4())
		if err := unix.Bind(lfd, sa); err != nil {
			return err
		}
		return unix.Listen(lfd, 1)
	})
	defer unix.Close(lfd)

	const clients = 10
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: 1500 * time.Millisecond}
			var c net.Conn
			var err error
			a.Do(t, func() error { c, err = d.Dial("tcp4", b.IPv4.String()+":7002"); return nil })
			if err == nil {
				c.Close()
			}
		}()
	}
	wg.Wait()
	var drops uint64
	var limit, queue uint32
	deadline := time.Now().Add(20 * time.Second)
	for drops == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		for _, li := range tracertest.Collect(t, tr).Listeners {
			if li.NetNS == b.Inode && li.Port == 7002 {
				drops += li.Drops
				limit = li.BacklogLimit
				queue = max(queue, li.QueueMax)
			}
		}
	}
	if drops == 0 || limit != 1 || queue < 1 {
		t.Errorf("listener: %d drops, backlog %d, deepest queue %d; want drops > 0, backlog 1", drops, limit, queue)
	}
}

// The deepest accept queue of an interval is seen although the queue is
// empty again at the drain: 5 connections wait unaccepted, then all are
// accepted before the tracer drains.
func TestListenQueueDeepestBetweenDrains(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7003")
	tracertest.Collect(t, tr) // the listener's earlier interval
	const waiting = 5
	for i := 0; i < waiting; i++ {
		c, err := a.Dial("tcp4", b.IPv4.String()+":7003")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The server's side of a handshake may still be in softirq when Dial
	// returns: wait (bounded) until all 5 are in the accept queue, which a
	// listener's TCP_INFO reports as unacked.
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var queued uint32
		_ = raw.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				queued = info.Unacked
			}
		})
		if queued == waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("accept queue %d, want %d", queued, waiting)
		}
	}
	for i := 0; i < waiting; i++ {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	var deepest uint32
	found := false
	for _, li := range tracertest.Collect(t, tr).Listeners {
		if li.NetNS == b.Inode && li.Port == 7003 {
			found = true
			deepest = max(deepest, li.QueueMax)
		}
	}
	if !found || deepest != waiting {
		t.Errorf("listener found %v, deepest queue %d; want %d (the queue is empty at the drain)", found, deepest, waiting)
	}
	// The next interval saw no connection join: its deepest is 0.
	for _, li := range tracertest.Collect(t, tr).Listeners {
		if li.NetNS == b.Inode && li.Port == 7003 && li.QueueMax != 0 {
			t.Errorf("next interval: deepest queue %d, want 0", li.QueueMax)
		}
	}
}

func TestTinyMapCountsLosses(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	// The map, the spill behind it (256 slots an interval) and the flow
	// cache in front of it (bundler.FlowCacheSlots per CPU).
	const size, spill = 64, 256
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	cached := bundler.FlowCacheSlots * ncpu
	flows := size + spill + cached + 300
	tr := startTracer(t, func(c *tracer.Config) { c.FlowMapSize = size })
	tracertest.Collect(t, tr) // start from an empty map

	// Distinct server ports: more dependencies than the map, the spill
	// and the cache hold together.
	pc := a.ListenPacket(t, "udp4", a.IPv4.String()+":0")
	for p := 20000; p < 20000+flows; p++ {
		if _, err := pc.WriteTo([]byte("x"), &net.UDPAddr{IP: b.IPv4, Port: p}); err != nil {
			t.Fatal(err)
		}
	}
	iv := tracertest.Collect(t, tr)
	if len(iv.Flows) > size+spill+cached {
		t.Errorf("%d flows from a map of %d, a spill of %d and a cache of %d", len(iv.Flows), size, spill, cached)
	}
	// A full map refuses an insert with E2BIG (flow_map_full); some kernels
	// report the same refusal as an allocation failure (flow_alloc_failed).
	// The spill keeps what it can; every flow it cannot keep is counted.
	mine := uint64(len(inNetns(iv.Flows, a.Inode)))
	refused := iv.Lost.FlowMapFull + iv.Lost.FlowAllocFailed
	if mine <= size || mine+refused < uint64(flows) || refused < uint64(flows-size-spill-cached) {
		t.Errorf("%d flows kept and %d counted as refused by the map and the spill (%+v); want more than the map holds kept, and all %d accounted for", mine, refused, iv.Lost, flows)
	}
	st, err := tr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Lost.FlowMapFull != iv.Lost.FlowMapFull {
		t.Errorf("cumulative %d vs interval %d", st.Lost.FlowMapFull, iv.Lost.FlowMapFull)
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
		_ = roundTrip(c, 1, 1)
		c.Close()
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, b).Connections >= 2 })
	for _, f := range l.Flows {
		if f.NetNS != b.Inode {
			t.Errorf("flow from netns %d traced with --netns %d: %+v", f.NetNS, b.Inode, f)
		}
	}
	if f := l.One(t, b); !l.Counted(f.Connections, 2) {
		t.Errorf("server: %+v", f.Counters)
	}
}

// Listening ports of several namespaces are told apart.
func TestPortTableIsPerNamespace(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	ln := b.Listen(t, "tcp4", ":6000") // before start: seeded
	tr := startTracer(t, nil)
	ln2 := a.Listen(t, "tcp6", "[::]:6001") // after start: tracked live
	has := func(ns uint32, port uint16) bool {
		ports, err := tr.ListeningPorts()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if p.NetNS == ns && p.Proto == tracer.ProtoTCP && p.Port == port {
				return true
			}
		}
		return false
	}
	if !has(b.Inode, 6000) || has(a.Inode, 6000) {
		t.Errorf("tcp 6000 should be listed for %s only", b.Name)
	}
	if !has(a.Inode, 6001) || has(b.Inode, 6001) {
		t.Errorf("tcp 6001 should be listed for %s only", a.Name)
	}
	ln.Close()
	ln2.Close()
	if has(b.Inode, 6000) || has(a.Inode, 6001) {
		t.Errorf("closed listeners still listed")
	}
}

// A server that listens with backlog 0 (its connections carry no listen
// backlog, the mark deptrace reads at close) keeps its direction and its
// exact counts: such connections are tagged when they open.
func TestListenerWithZeroBacklog(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)

	var ln net.Listener
	b.Do(t, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		sa := &unix.SockaddrInet4{Port: 7100}
		copy(sa.Addr[:], b.IPv4.To4())
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.Listen(fd, 0); err != nil {
			unix.Close(fd)
			return err
		}
		f := os.NewFile(uintptr(fd), "listener")
		defer f.Close()
		ln, err = net.FileListener(f)
		return err
	})
	defer ln.Close()
	const n, req, resp = 5, 30, 70
	wait := echoServer(ln, n, req, resp)
	connectN(t, a, "tcp4", b.IPv4.String()+":7100", n, req, resp)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, b).BytesSent >= n*resp && l.One(t, a).BytesReceived >= n*resp
	})
	in := l.One(t, b)
	checkFlow(t, in, "tcp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 7100)
	if !l.Counted(in.Connections, n) || !l.CountedBytes(in.BytesReceived, n*req, req) || !l.CountedBytes(in.BytesSent, n*resp, resp) {
		t.Errorf("server with backlog 0: %+v; want %d connections, %d received, %d sent", in.Counters, n, n*req, n*resp)
	}
	out := l.One(t, a)
	checkFlow(t, out, "tcp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), 7100)
	if !l.Counted(out.Connections, n) || !l.CountedBytes(out.BytesSent, n*req, req) || !l.CountedBytes(out.BytesReceived, n*resp, resp) {
		t.Errorf("client: %+v", out.Counters)
	}
}

// Two deptraces at once (an agent and an ad-hoc trace): each tags a live
// connection with its own storage, and each reports its bytes while it is
// open, although the other's storage is on the socket first (each looks
// for its own during one jiffy in 32, so the traffic runs until both see
// it: no guess at how long that takes).
func TestTwoTracersBothSeeALiveConnection(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr1 := startTracer(t, nil)
	tr2 := startTracer(t, nil)

	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7300")
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		loadgen.Echo(c)
	}()
	c, err := a.Dial("tcp4", b.IPv4.String()+":7300")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 10
	stop := make(chan struct{})
	done := make(chan error, 1)
	var rounds atomic.Uint64
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := roundTrip(c, size, size); err != nil {
				done <- err
				return
			}
			rounds.Add(1)
		}
	}()
	ledgers := []*tracertest.Ledger{tracertest.NewLedger(), tracertest.NewLedger()}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && (ledgers[0].One(t, a).BytesSent == 0 || ledgers[1].One(t, a).BytesSent == 0) {
		ledgers[0].Add(tracertest.Collect(t, tr1))
		ledgers[1].Add(tracertest.Collect(t, tr2))
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	total := rounds.Load() * size
	for i, tr := range []*tracer.Tracer{tr1, tr2} {
		l := ledgers[i]
		tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).BytesSent >= total })
		if got := l.One(t, a).BytesSent; got != total {
			t.Errorf("tracer %d: %d bytes sent while the connection is open; want %d", i+1, got, total)
		}
	}
}

// A server that closes without reading what the client sent answers with
// resets, and the client's last segments then reach the listener, which
// answers with resets of its own: those belong to no connection and must
// not appear as a flow (the listener's has no peer).
func TestResetsFromAListenerAreNoFlow(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7400")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("pong"))
			c.Close() // "ping!" unread: a reset
		}
	}()
	const n = 30
	for i := 0; i < n; i++ {
		c, err := a.Dial("tcp4", b.IPv4.String()+":7400")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("ping!"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		_, _ = c.Read(buf)
		c.Close()
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).Connections >= n && l.One(t, b).Connections >= n && l.One(t, b).ResetsSent > 0
	})
	in := l.One(t, b) // fails if the listener's resets made a second flow
	checkFlow(t, in, "tcp", tracer.Inbound, addr(b.IPv4), addr(a.IPv4), 7400)
	if !l.Counted(in.Connections, n) {
		t.Errorf("server: %+v; want %d connections", in.Counters, n)
	}
}

// With RunOptions.ReuseFlows each interval's flows are built in the memory
// of an earlier one, and hold only what that interval counted: the totals
// stay exact. Without it, flows a consumer keeps from one Collect are not
// touched by the next.
func TestReusedFlowsHoldOnlyTheirInterval(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, func(c *tracer.Config) { c.Interval = 100 * time.Millisecond })
	serve := func(port string, n int) {
		t.Helper()
		ln := b.Listen(t, "tcp4", b.IPv4.String()+":"+port)
		wait := echoServer(ln, n, 10, 10)
		connectN(t, a, "tcp4", b.IPv4.String()+":"+port, n, 10, 10)
		if err := wait(); err != nil {
			t.Fatal(err)
		}
	}

	serve("8091", 2)
	kept, err := tr.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if len(inNetns(kept.Flows, a.Inode)) == 0 {
		t.Fatalf("no flow of %s in the first Collect: %+v", a.Name, kept.Flows)
	}
	want := slices.Clone(kept.Flows)
	serve("8092", 2)
	if _, err := tr.Collect(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(kept.Flows, want) {
		t.Fatalf("the flows kept from a Collect changed with the next one:\n got %+v\nwant %+v", kept.Flows, want)
	}

	var (
		mu        sync.Mutex
		l         = tracertest.NewLedger()
		reused    int
		intervals int
		prev      *tracer.Flow
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	stopped := false
	t.Cleanup(func() { // before the tracer closes, on a failure too
		if !stopped {
			cancel()
			<-done //nolint:errcheck // the test has failed already; this only waits for RunWith
		}
	})
	go func() {
		done <- tr.RunWith(ctx, tracer.RunOptions{ReuseFlows: true}, func(iv tracer.Interval) error {
			mu.Lock()
			defer mu.Unlock()
			if p := unsafe.SliceData(iv.Flows[:cap(iv.Flows)]); p != nil {
				if p == prev {
					reused++
				}
				prev = p
			}
			intervals++
			l.Add(iv)
			return nil
		})
	}()
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			mu.Lock()
			seen, late, about := ok(), time.Now().After(deadline), ""
			if !seen && late {
				about = l.About([]uint32{a.Inode, b.Inode})
			}
			mu.Unlock()
			if seen {
				return
			}
			if late {
				t.Fatalf("%s: not seen in 10 s; ledger:\n%s", what, about)
			}
		}
	}
	serve("8093", 3)
	until("3 connections to 8093", func() bool { return l.TCP(a.Inode, tracer.Outbound, 8093).Connections >= 3 })
	serve("8094", 2)
	until("2 connections to 8094", func() bool { return l.TCP(a.Inode, tracer.Outbound, 8094).Connections >= 2 })
	mu.Lock()
	from := intervals
	mu.Unlock()
	until("5 more intervals", func() bool { return intervals >= from+5 })
	cancel()
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("RunWith: %v", err)
	}

	for _, c := range []struct {
		h    *testnet.Host
		dir  tracer.Direction
		port uint16
		n    uint64
	}{{a, tracer.Outbound, 8093, 3}, {a, tracer.Outbound, 8094, 2}, {b, tracer.Inbound, 8093, 3}, {b, tracer.Inbound, 8094, 2}} {
		if f := l.TCP(c.h.Inode, c.dir, c.port); !l.Counted(f.Connections, c.n) || !l.Counted(f.BytesSent, 10*c.n) {
			t.Errorf("%s %s port %d: %+v; want %d connections, %d bytes sent", c.h.Name, c.dir, c.port, f.Counters, c.n, 10*c.n)
		}
	}
	if l.TCP(a.Inode, tracer.Outbound, 8091).Connections != 0 || l.TCP(a.Inode, tracer.Outbound, 8092).Connections != 0 {
		t.Errorf("RunWith counted flows collected before it: %s", l.About([]uint32{a.Inode}))
	}
	if reused == 0 {
		t.Errorf("none of %d intervals' flows was built in an earlier one's memory", intervals)
	}
}
