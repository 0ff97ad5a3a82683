package bundler

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	return &commitWorld{t: t, client: a, server: sink(t, b, port), applied: map[string]bool{}}
}

// sink listens on host's IPv4 address and port and reads every
// connection to its end (the traced byte counts are the check); it
// returns the address.
func sink(t *testing.T, host *testnet.Host, port int) string {
	addr := fmt.Sprintf("%s:%d", host.IPv4, port)
	ln := host.Listen(t, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return addr
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
		if err := b.CommitOf(iv.Side, iv.Gen); err != nil {
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

// load loads a bundler that watches the world's client namespace (the
// test's configuration), closed when the test ends.
func (w *commitWorld) load(t *testing.T) *Bundler {
	t.Helper()
	cfg := testConfig()
	cfg.NetNS = w.client.Inode
	bu := mustLoad(t, cfg)
	t.Cleanup(func() { bu.Close() })
	return bu
}

// Killed after the drain record says generation g is pending, before
// programs count g+1: the next process makes them, and collects g whole.
// Through the flow map: a cache slot carries no interval, so counts put in
// the wrong interval's cache half would still add up.
func TestKilledBeforeTheSwap(t *testing.T) {
	testHooks.noCache = true
	defer func() { testHooks.noCache = false }()
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
	if now, err := second.intervalNow(); err != nil || now != g+1 {
		t.Fatalf("after adoption programs count interval %d (%v), want %d", now, err, g+1)
	}
	iv, err := second.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !iv.Recovered || iv.Gen != g || w.clientConns(iv) != 5 {
		t.Fatalf("first interval: gen %d recovered=%v connections %d; want generation %d, all 5", iv.Gen, iv.Recovered, w.clientConns(iv), g)
	}
	w.apply(iv)
	if err := second.Commit(iv.Gen); err != nil {
		t.Fatal(err)
	}
	w.connect(3)
	w.settle(second, 8)
}

// Killed after the store took interval g and its idle flows and halves
// were freed, before the drain record says committed: the next process
// collects g again under the same batch id, which the store ignores;
// nothing counts twice, and the map's values of g do not come again with
// a later interval.
func TestKilledAfterTheCommitBeforeTheRecord(t *testing.T) {
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
	// The commit's work, all but the record.
	if err := first.deleteIdle(first.inner[p.idx], p.idx, p.keys, p.entries); err != nil {
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
	if !again.Recovered || again.BatchID() != iv.BatchID() {
		t.Fatalf("first interval: %s recovered=%v; want %s again", again.BatchID(), again.Recovered, iv.BatchID())
	}
	w.apply(again)
	if err := second.Commit(again.Gen); err != nil {
		t.Fatal(err)
	}
	w.connect(2)
	w.settle(second, 7)
}

// A side whose drain record was removed (by hand: deptrace pins it before
// the maps), after an interval was stored and before its commit: adopted
// under a new identity from the interval its programs count. The idle
// map's interval is not collected again, neither from the flow map, whose
// values outlive a commit, nor from its cache or spill half, whose slots
// programs would add to when they next use the half: under a new identity
// the store could not tell it from a new one, and would count it twice.
func TestAdoptedSideWithoutDrainRecord(t *testing.T) {
	for _, path := range []string{"cache", "map", "spill"} {
		t.Run(path, func(t *testing.T) {
			switch path {
			case "map":
				testHooks.noCache = true
				t.Cleanup(func() { testHooks.noCache = false })
			case "spill":
				forceSpillFor(t)
			}
			w := newCommitWorld(t, 7103)
			cfg := pinnedTestConfig(t)
			cfg.NetNS = w.client.Inode
			first := mustLoad(t, cfg)
			t.Cleanup(first.Release) // its lock, should the test stop before it does
			w.connect(4)
			read, err := first.Collect() // switched and read, not committed
			if err != nil {
				t.Fatal(err)
			}
			if got := w.clientConns(read); got != 4 {
				t.Fatalf("the first interval has %d connections, want 4", got)
			}
			w.apply(read)
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
			if iv.Recovered || iv.Side == read.Side || iv.Gen != read.Gen+1 || w.clientConns(iv) != 0 {
				t.Fatalf("first interval: side %x gen %d recovered=%v connections %d; want generation %d, new, under a new side, empty",
					iv.Side, iv.Gen, iv.Recovered, w.clientConns(iv), read.Gen+1)
			}
			w.apply(iv)
			if err := second.Commit(iv.Gen); err != nil {
				t.Fatal(err)
			}
			w.connect(3) // into the first interval's map and halves again
			w.settle(second, 7)
		})
	}
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
			// Wall time is mostly the RCU grace period, spent
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

// An adopted side whose programs count an interval its drain record cannot
// be followed by (not the next one, nor the pending one) is refused at
// load with an error naming both and the way out; its pins stay.
func TestAdoptedSideOutOfStepIsRefused(t *testing.T) {
	testnet.RequireRoot(t)
	cfg := pinnedTestConfig(t)
	first := mustLoad(t, cfg)
	t.Cleanup(first.Release)
	if err := first.setInterval(9); err != nil {
		t.Fatal(err)
	}
	first.Release()

	second, err := Load(cfg)
	if err == nil {
		second.Close()
		t.Fatal("a side out of step was adopted")
	}
	if !strings.Contains(err.Error(), "counts interval 9") || !strings.Contains(err.Error(), "deptrace cleanup") {
		t.Fatalf("Load of a side out of step: %v; want an error naming interval 9 and deptrace cleanup", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.PinPath, "meta")); err != nil {
		t.Fatalf("the refused side's pins are gone: %v", err)
	}
}
