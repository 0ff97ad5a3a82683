package bundler

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest/poll"
)

// A connection that opens between the attach and the end of the start-up
// seed counts every byte from its open, busy or quiet then: the seed must
// not take it for one open before the start (counting from the seed), and
// no late tag runs until the seed ends (Config.SeedFollows).
func TestConnectionOpenedBeforeTheSeedEndsCountsFromItsOpen(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	addr := fmt.Sprintf("%s:%d", b.IPv4, 7500)
	ln := b.Listen(t, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	cfg := testConfig()
	cfg.NetNS = a.Inode
	cfg.SeedFollows = true
	bu := mustLoad(t, cfg)
	defer bu.Close()

	write := func(c net.Conn, n, size int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if _, err := c.Write(make([]byte, size)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond) // one segment each, acked apart
		}
	}
	busy, err := a.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := a.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	write(busy, 40, 100) // far past the segments a late tag waits for
	write(quiet, 1, 100)
	if _, err := bu.Seed(); err != nil {
		t.Fatal(err)
	}
	write(busy, 10, 100)
	write(quiet, 10, 100)
	busy.Close()
	quiet.Close()

	const want = 40*100 + 100 + 2*10*100
	var conns, sent uint64
	drain := func() {
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.NetNS == a.Inode && e.Direction == DirOutbound && e.Port == 7500 {
				conns += e.Connections
				sent += e.BytesSent
			}
		}
	}
	poll.Settle(20*time.Second, func() bool { return sent >= want && conns >= 2 }, drain)
	time.Sleep(200 * time.Millisecond) // and nothing more comes
	drain()
	if conns != 2 || sent != want {
		t.Errorf("%d connections, %d bytes sent; want 2 and %d (every byte since each open)", conns, sent, want)
	}
}
