package bundler

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest/poll"
)

// A connection that opens between the attach and the end of the start-up
// seed counts every byte from its open, busy or quiet then: the seed must
// not take it for one open before the start (counting from the seed), and
// no late tag runs until the seed ends (Config.SeedFollows). One open
// before the start that closes then counts nothing of its life before.
func TestConnectionOpenedBeforeTheSeedEndsCountsFromItsOpen(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	addr := sink(t, b, 7500)
	write := func(c net.Conn, n, size int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if _, err := c.Write(make([]byte, size)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond) // one segment each, acked apart
		}
	}
	// Open before the start, closed before the seed ends: its counters
	// hold its life before deptrace, which is not counted (nor what it
	// moved in the moment between: there is no baseline for it).
	old, err := a.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	write(old, 30, 100)

	cfg := testConfig()
	cfg.NetNS = a.Inode
	cfg.SeedFollows = true
	bu := mustLoad(t, cfg)
	defer bu.Close()

	write(old, 1, 100)
	old.Close()
	time.Sleep(50 * time.Millisecond) // its FIN exchange: the close is seen before the seed
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

// A side with a PinPath is pinned only once seeded: a process that dies
// between its load and the seed's end (released here, as SIGKILL does)
// leaves nothing to adopt, since a pinned side that kept seed_pending set
// would give every new connection storage and tag none late for the rest
// of its life. The next process loads afresh; once it is seeded and
// pinned, a process adopting it tags a busy connection late, as usual.
func TestSideIsPinnedOnceSeeded(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	addr := sink(t, b, 7501)
	cfg := pinnedTestConfig(t)
	cfg.NetNS = a.Inode
	cfg.SeedFollows = true

	dead := mustLoad(t, cfg)
	if entries, err := os.ReadDir(cfg.PinPath); err == nil && len(entries) > 0 {
		t.Errorf("pinned before its seed: %d entries in %s", len(entries), cfg.PinPath)
	}
	dead.Release() // died before its seed ended

	first := mustLoad(t, cfg)
	released := false
	t.Cleanup(func() {
		if !released {
			first.Close()
		}
	})
	if first.Adoption().Adopted {
		t.Fatalf("adopted a side its process left unseeded")
	}
	if _, err := first.Seed(); err != nil {
		t.Fatal(err)
	}
	if err := first.PinSeeded(); err != nil {
		t.Fatal(err)
	}
	first.Release()
	released = true

	next := mustLoad(t, cfg)
	defer next.Close()
	if !next.Adoption().Adopted {
		t.Fatalf("the seeded side was not adopted")
	}
	// A busy connection opened now is reported while it lives: it was
	// tagged late (a pinned seed_pending would leave it to its close).
	c, err := a.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 40; i++ {
		if _, err := c.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	var sent uint64
	poll.Settle(20*time.Second, func() bool { return sent >= 40*100 }, func() {
		entries, _, err := next.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.NetNS == a.Inode && e.Direction == DirOutbound && e.Port == 7501 {
				sent += e.BytesSent
			}
		}
	})
	if sent != 40*100 {
		t.Errorf("a live connection on the adopted side: %d bytes reported; want %d", sent, 40*100)
	}
}
