package bundler

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest/poll"
)

// The crash points of a pinned side's two-phase drain that a process can
// only reach by dying inside Collect or Commit, reproduced by doing the
// dead process's half of the work and then releasing its handles (what
// SIGKILL does to them). A store is modelled as it behaves: each batch id
// applied once.

func pinnedTestConfig(t *testing.T) Config {
	c := testConfig()
	c.PinPath = filepath.Join("/sys/fs/bpf", fmt.Sprintf("deptrace-bundler-test-%d", os.Getpid()))
	t.Cleanup(func() { _, _ = Cleanup(c.PinPath) })
	return c
}

// commitWorld is a client host, a server, and a store of batch ids.
type commitWorld struct {
	t       *testing.T
	client  *testnet.Host
	server  string
	applied map[string]bool
	conns   uint64 // outbound connections of client, as stored
}

func newCommitWorld(t *testing.T, port int) *commitWorld {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	addr := fmt.Sprintf("%s:%d", b.IPv4, port)
	ln := b.Listen(t, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, c) // a sink: the traced byte counts are the check
			c.Close()
		}
	}()
	return &commitWorld{t: t, client: a, server: addr, applied: map[string]bool{}}
}

func (w *commitWorld) connect(n int) {
	w.t.Helper()
	for i := 0; i < n; i++ {
		c, err := w.client.Dial("tcp4", w.server)
		if err != nil {
			w.t.Fatal(err)
		}
		_, _ = c.Write([]byte("x")) // a short write shows in the counts checked
		c.Close()
	}
}

// clientConns sums the client's outbound connections in iv.
func (w *commitWorld) clientConns(iv Interval) uint64 {
	var n uint64
	for _, e := range iv.Entries {
		if e.NetNS == w.client.Inode && e.Direction == DirOutbound {
			n += e.Connections
		}
	}
	return n
}

// apply stores iv once per batch id.
func (w *commitWorld) apply(iv Interval) {
	w.t.Helper()
	id := iv.BatchID()
	if id == "" {
		w.t.Fatalf("interval without a batch id")
	}
	if !w.applied[id] {
		w.applied[id] = true
		w.conns += w.clientConns(iv)
	}
}

// settle collects, stores and commits until want connections are stored
// (or 20 s have passed), then twice more; more than want fails, and so
// does fewer, unless b reports the shortfall lost for recursion
// (countedOnce).
func (w *commitWorld) settle(b *Bundler, want uint64) {
	w.t.Helper()
	poll.Settle(20*time.Second, func() bool { return w.conns >= want }, func() {
		iv, err := b.Collect()
		if err != nil {
			w.t.Fatal(err)
		}
		w.apply(iv)
		if err := b.Commit(iv.Gen); err != nil {
			w.t.Fatal(err)
		}
	})
	if !countedOnce(w.t, b, want, w.conns) {
		w.t.Errorf("stored %d connections, want %d (%s)", w.conns, want, lossReport(b))
	}
}

func mustLoad(t *testing.T, cfg Config) *Bundler {
	t.Helper()
	b, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Killed after the drain record says generation g is pending, before the
// swap: the next process collects g from the idle map, which the last
// commit reset (empty), and the counts come in g+1.
func TestKilledBeforeTheSwap(t *testing.T) {
	w := newCommitWorld(t, 7101)
	cfg := pinnedTestConfig(t)
	first := mustLoad(t, cfg)
	w.connect(5)
	if err := first.loadDrainState(); err != nil {
		t.Fatal(err)
	}
	g := first.drain.gen + 1
	if err := first.writeDrainRecord(g, true); err != nil {
		t.Fatal(err)
	}
	first.Release()

	second := mustLoad(t, cfg)
	defer second.Close()
	iv, err := second.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !iv.Recovered || iv.Gen != g || w.clientConns(iv) != 0 {
		t.Fatalf("first interval: gen %d recovered=%v connections %d; want generation %d again, empty", iv.Gen, iv.Recovered, w.clientConns(iv), g)
	}
	w.apply(iv)
	if err := second.Commit(iv.Gen); err != nil {
		t.Fatal(err)
	}
	w.connect(3)
	w.settle(second, 8)
}

// Killed after the store took interval g and the reset ran, before the
// drain record says committed: the next process collects g again (empty),
// under the same batch id; nothing counts twice.
func TestKilledAfterTheResetBeforeTheRecord(t *testing.T) {
	w := newCommitWorld(t, 7102)
	cfg := pinnedTestConfig(t)
	first := mustLoad(t, cfg)
	w.connect(5)
	iv, err := first.Collect()
	if err != nil {
		t.Fatal(err)
	}
	w.apply(iv)
	p := first.drain.pending
	if p == nil || p.gen != iv.Gen {
		t.Fatalf("a pinned interval is not pending before its commit: %+v", p)
	}
	// The reset: of the map, and of the spill and cache slots beside it.
	if err := first.reset(first.inner[p.idx], p.idx, p.keys, p.vals, p.entries); err != nil {
		t.Fatal(err)
	}
	if err := first.freeSpill(p.idx, p.spill); err != nil {
		t.Fatal(err)
	}
	first.Release()

	second := mustLoad(t, cfg)
	defer second.Close()
	again, err := second.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !again.Recovered || again.BatchID() != iv.BatchID() || w.clientConns(again) != 0 {
		t.Fatalf("first interval: %s recovered=%v connections %d; want %s again, empty", again.BatchID(), again.Recovered, w.clientConns(again), iv.BatchID())
	}
	w.apply(again)
	if err := second.Commit(again.Gen); err != nil {
		t.Fatal(err)
	}
	w.connect(2)
	w.settle(second, 7)
}

// A side pinned by a deptrace without drain records, whose process died
// between a swap and its read: the idle map's interval is collected once,
// under a new side identity.
func TestAdoptedSideWithoutDrainRecord(t *testing.T) {
	w := newCommitWorld(t, 7103)
	cfg := pinnedTestConfig(t)
	first := mustLoad(t, cfg)
	w.connect(4)
	read, err := first.Collect() // swapped and read, not reset
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	if err := os.Remove(filepath.Join(cfg.PinPath, drainPin)); err != nil {
		t.Fatal(err)
	}

	second := mustLoad(t, cfg)
	defer second.Close()
	iv, err := second.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !iv.Recovered || iv.Side == read.Side || iv.Gen != 1 || w.clientConns(iv) != w.clientConns(read) {
		t.Fatalf("first interval: side %x gen %d recovered=%v connections %d; want the idle map (%d connections) under a new side",
			iv.Side, iv.Gen, iv.Recovered, w.clientConns(iv), w.clientConns(read))
	}
	w.apply(iv)
	if err := second.Commit(iv.Gen); err != nil {
		t.Fatal(err)
	}
	w.settle(second, 4)
}

// What the two-phase drain adds to an interval: Collect and Commit of a
// pinned side (two drain-record writes) against an unpinned side's
// Collect, which resets at once. Idle maps, so the fixed cost shows:
//
//	go test -run '^$' -bench DrainCommit -benchtime 2000x ./internal/bundler
func BenchmarkDrainCommit(b *testing.B) {
	testnet.RequireRoot(b)
	for _, pinned := range []bool{false, true} {
		name := "unpinned"
		cfg := testConfig()
		if pinned {
			name = "pinned"
			cfg.PinPath = filepath.Join("/sys/fs/bpf", fmt.Sprintf("deptrace-bundler-bench-%d", os.Getpid()))
		}
		bu, err := Load(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			// Wall time is mostly the swap's RCU grace period, spent
			// asleep; the process's CPU time is what a drain costs.
			cpu0 := processCPU(b)
			for i := 0; i < b.N; i++ {
				iv, err := bu.Collect()
				if err != nil {
					b.Fatal(err)
				}
				if err := bu.Commit(iv.Gen); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
		if pinned {
			// The part a pinned side adds, twice per interval.
			b.Run("drain-record-write", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if err := bu.writeDrainRecord(bu.drain.gen, false); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		bu.Close()
	}
}

// processCPU is this process's user and system CPU time so far, in ns.
func processCPU(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
