package tracer_test

import (
	"net"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// An unconnected udp socket bound to the wildcard (sendto) and a connected
// one, both from one host to one server in one interval, are one
// dependency: the kernel keys the first by the wildcard and the second by
// its source, and the tracer names the first by its routed source, the
// same. One interval holds one outbound flow with the datagrams of both.
func TestUDPWildcardAndConnectedAreOneFlow(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startSharedTracer(t)

	const port, rounds = 5355, 6
	server := &net.UDPAddr{IP: b.IPv4, Port: port}
	b.ListenPacket(t, "udp4", server.String()) // receives; no answer needed
	unconnected := a.ListenPacket(t, "udp4", ":0")
	connected, err := a.Dial("udp4", server.String())
	if err != nil {
		t.Fatal(err)
	}
	defer connected.Close()
	for i := 0; i < rounds; i++ {
		if _, err := unconnected.WriteTo(make([]byte, 20), server); err != nil {
			t.Fatal(err)
		}
		if _, err := connected.Write(make([]byte, 20)); err != nil {
			t.Fatal(err)
		}
	}

	// One interval, not a ledger: a ledger sums flows of one identity.
	iv := tracertest.Collect(t, tr)
	var out []tracer.Flow
	for _, f := range inNetns(iv.Flows, a.Inode) {
		if f.Proto == tracer.ProtoUDP && f.Direction == tracer.Outbound && f.Port == port {
			out = append(out, f)
		}
	}
	if len(out) != 1 {
		for _, f := range out {
			t.Logf("%s %s -> %s:%d %d/%s: %d datagrams sent", f.Direction, f.LocalAddr, f.RemoteAddr, f.Port, f.PID, f.Comm, f.DatagramsSent)
		}
		t.Fatalf("%d outbound udp flows to port %d, want one", len(out), port)
	}
	checkFlow(t, out[0], "udp", tracer.Outbound, addr(a.IPv4), addr(b.IPv4), port)
	l := tracertest.NewLedger()
	l.Add(iv)
	if !l.Counted(out[0].DatagramsSent, 2*rounds) || !l.CountedBytes(out[0].BytesSent, 2*rounds*20, 20) {
		t.Errorf("merged flow: %+v; want %d datagrams (%d bytes) sent", out[0].Counters, 2*rounds, 2*rounds*20)
	}
}
