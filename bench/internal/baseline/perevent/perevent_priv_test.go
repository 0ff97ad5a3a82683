package perevent

import (
	"net"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
)

// entriesFor counts map entries (in both maps) of server port port.
func entriesFor(t *testing.T, b *Bundler, port uint16) int {
	t.Helper()
	n := 0
	for _, m := range b.inner {
		var k pereventFlowKey
		vals := make([]pereventFlowValue, b.ncpu)
		it := m.Iterate()
		for it.Next(&k, &vals) {
			if k.Port == port {
				n++
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// A recurring flow keeps its entry across drains (zeroed, not deleted),
// counts each interval exactly once, and goes once idle long enough.
func TestEntriesAreRetainedThenRetired(t *testing.T) {
	testnet.RequireRoot(t)
	b, err := Load(Config{FlowMapSize: 1024, PortMapSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	connect := func(n int) {
		for i := 0; i < n; i++ {
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
	}
	conns := func(es []Entry) (out, in uint64) {
		for _, e := range es {
			if e.Port != port {
				continue
			}
			if e.Direction == DirOutbound {
				out += e.Connections
			} else {
				in += e.Connections
			}
		}
		return
	}
	for round := 1; round <= 4; round++ {
		connect(round)
		es, err := b.Drain()
		if err != nil {
			t.Fatal(err)
		}
		if out, _ := conns(es); out != uint64(round) {
			t.Errorf("round %d: %d outbound connections, want %d", round, out, round)
		}
	}
	if n := entriesFor(t, b, port); n == 0 {
		t.Fatal("entries of a recurring flow were deleted, not retained")
	}
	// Idle from now on: after retainIdle drains of each map, nothing is left.
	for i := 0; i < 2*retainIdle+1; i++ {
		es, err := b.Drain()
		if err != nil {
			t.Fatal(err)
		}
		if out, in := conns(es); out != 0 || in != 0 {
			t.Errorf("idle drain %d reported %d/%d connections", i, out, in)
		}
	}
	if n := entriesFor(t, b, port); n != 0 {
		t.Errorf("%d idle entries left after %d drains", n, 2*retainIdle+1)
	}
}
