package tracer_test

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// tcpInfoRTT is the socket's smoothed RTT as TCP_INFO (and ss -ti) gives
// it, in microseconds.
func tcpInfoRTT(t *testing.T, c net.Conn) uint64 {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO)
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return uint64(info.Rtt)
}

// checkRTT checks that a flow's RTT counters hold samples samples that
// are plausible for two namespaces on one machine: above zero, below a
// second, min <= average <= max.
func checkRTT(t *testing.T, what string, c tracer.Counters, samples uint64) {
	t.Helper()
	if c.RTTSamples != samples {
		t.Errorf("%s: %d RTT samples, want %d (one per connection closed): %+v", what, c.RTTSamples, samples, c)
	}
	avg := c.RTTAvgUs()
	if c.RTTMinUs == 0 || c.RTTMinUs > avg || avg > c.RTTMaxUs || c.RTTMaxUs >= 1_000_000 {
		t.Errorf("%s: RTT min %d avg %d max %d us; want 0 < min <= avg <= max < 1 s", what, c.RTTMinUs, avg, c.RTTMaxUs)
	}
}

// The smoothed RTT of TCP connections reaches the flows, read where the
// kernel side already reads the socket: one sample at each close, and one
// at each drain that folds a live connection's counters, equal to what
// TCP_INFO (ss -ti) shows for the socket at that moment. A flow of
// connections that never opened has none.
func TestRTTFromTheSocket(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t, nil)

	// Short-lived connections: one sample each at close, both ends.
	const n = 20
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":8080")
	wait := echoServer(ln, n, 100, 37)
	connectN(t, a, "tcp4", b.IPv4.String()+":8080", n, 100, 37)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.One(t, a).RTTSamples >= n && l.One(t, b).RTTSamples >= n
	})
	checkRTT(t, "client flow", l.One(t, a).Counters, n)
	checkRTT(t, "server flow", l.One(t, b).Counters, n)

	// Refused connects: a flow with no connection has no RTT.
	for i := 0; i < 3; i++ {
		if c, err := a.Dial("tcp4", b.IPv4.String()+":9"); err == nil {
			c.Close()
			t.Fatal("connection to a closed port succeeded")
		}
	}
	l = tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).FailedConnections >= 3 })
	if f := l.One(t, a); f.RTTSamples != 0 || f.RTTSumUs != 0 || f.RTTMinUs != 0 || f.RTTMaxUs != 0 {
		t.Errorf("refused connects' flow has RTT counters: %+v", f.Counters)
	}

	// A live connection, tagged for the drains after 16 segments: the
	// drain that folds its bytes reads the RTT the socket has then. The
	// client's srtt changes only when its own data is acked, so once the
	// response is in, TCP_INFO and the drain see the same value.
	ln2 := b.Listen(t, "tcp4", b.IPv4.String()+":5432")
	go func() {
		for {
			s, err := ln2.Accept()
			if err != nil {
				return
			}
			go loadgen.Echo(s)
		}
	}()
	c, err := a.Dial("tcp4", b.IPv4.String()+":5432")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 10; i++ {
		if err := roundTrip(c, 2, 2); err != nil {
			t.Fatal(err)
		}
	}
	l = tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool { return l.One(t, a).BytesReceived >= 20 })
	if err := roundTrip(c, 2, 2); err != nil {
		t.Fatal(err)
	}
	want := tcpInfoRTT(t, c)
	l = tracertest.NewLedger()
	l.Add(tracertest.Collect(t, tr))
	f := l.One(t, a)
	if f.BytesSent == 0 || f.RTTSamples != 1 || f.RTTMinUs != want || f.RTTMaxUs != want || f.RTTSumUs != want {
		t.Errorf("live connection's drain: %+v; want 1 RTT sample of %d us (TCP_INFO)", f.Counters, want)
	}
}
