package tracer_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

func pinPath(t *testing.T) string {
	p := filepath.Join(filepath.Dir(tracer.DefaultPinPath), fmt.Sprintf("deptrace-test-%d", os.Getpid()))
	t.Cleanup(func() { tracer.Cleanup(p) })
	return p
}

func newPinned(t *testing.T, path string) *tracer.Tracer {
	t.Helper()
	unloadShared(t) // one deptrace loaded at a time
	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	tr, err := tracer.New(cfg)
	if err != nil {
		t.Fatalf("load pinned tracer: %v", err)
	}
	return tr
}

// batchStore keeps intervals as deptrace's store does: each BatchID is
// applied once, however often it is written.
type batchStore struct {
	*tracertest.Ledger
	applied map[string]bool
}

func newBatchStore() *batchStore {
	return &batchStore{Ledger: tracertest.NewLedger(), applied: map[string]bool{}}
}

// apply adds iv's counts unless its BatchID was applied before; it
// reports whether it did.
func (s *batchStore) apply(t *testing.T, iv tracer.Interval) bool {
	t.Helper()
	if iv.BatchID == "" {
		t.Fatalf("interval without a batch id: %+v", iv)
	}
	if s.applied[iv.BatchID] {
		return false
	}
	s.applied[iv.BatchID] = true
	s.Add(iv)
	return true
}

// store collects one interval, applies it and commits it.
func (s *batchStore) store(t *testing.T, tr *tracer.Tracer) tracer.Interval {
	t.Helper()
	iv := tracertest.Collect(t, tr)
	s.apply(t, iv)
	if err := iv.Commit(); err != nil {
		t.Fatalf("commit %s: %v", iv.BatchID, err)
	}
	return iv
}

// settle stores intervals until done holds, then twice more to catch
// anything counted twice (tracertest.SettleWith).
func (s *batchStore) settle(t *testing.T, tr *tracer.Tracer, done func(*tracertest.Ledger) bool) {
	t.Helper()
	tracertest.SettleWith(t, tr, s.Ledger, done, func() { s.store(t, tr) })
}

// A process that dies leaves the kernel side counting; the next one adopts
// it and reports everything: what the first never drained, and what
// happened while no process ran. The first dies after its store took an
// interval and before it committed it (the reset): the second collects
// that interval again under the same BatchID, which the store ignores.
// Nothing is lost or counted twice.
func TestPinnedKernelSideSurvivesItsProcess(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6060")
	wait := echoServer(ln, 60, 4, 4)
	server := b.IPv4.String() + ":6060"

	first := newPinned(t, path)
	if first.Adoption().Adopted {
		t.Fatal("a fresh pin path reported an adoption")
	}
	if _, err := newPinnedErr(path); err == nil || !strings.Contains(err.Error(), "owns the kernel side") {
		t.Fatalf("second tracer on one pin path: %v; want a refusal", err)
	}
	st := newBatchStore()
	connectN(t, a, "tcp4", server, 20, 4, 4)
	st.store(t, first) // stored and committed
	connectN(t, a, "tcp4", server, 10, 4, 4)
	stored := tracertest.Collect(t, first)
	if !st.apply(t, stored) || stored.Recovered {
		t.Fatalf("a new interval was not new: %s recovered=%v", stored.BatchID, stored.Recovered)
	}
	connectN(t, a, "tcp4", server, 10, 4, 4)
	first.Release()                          // the process "dies" before the commit
	connectN(t, a, "tcp4", server, 10, 4, 4) // no process runs

	second := newPinned(t, path)
	defer second.Close()
	if ad := second.Adoption(); !ad.Adopted || ad.Replaced != "" {
		t.Fatalf("adoption: %+v", ad)
	}
	again := tracertest.Collect(t, second)
	if !again.Recovered || again.BatchID != stored.BatchID || len(again.Listeners) != 0 {
		t.Fatalf("the adopting process's first interval: batch %s recovered=%v listeners=%d; want the uncommitted %s again, without listeners",
			again.BatchID, again.Recovered, len(again.Listeners), stored.BatchID)
	}
	if sum(again, a).Connections != sum(stored, a).Connections || sum(again, a).BytesSent != sum(stored, a).BytesSent {
		t.Errorf("collected again: %+v; first time: %+v", sum(again, a), sum(stored, a))
	}
	if st.apply(t, again) {
		t.Fatal("the store applied one batch id twice")
	}
	if err := again.Commit(); err != nil {
		t.Fatal(err)
	}
	connectN(t, a, "tcp4", server, 10, 4, 4)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	st.settle(t, second, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesReceived >= 60*4 && l.One(t, b).BytesReceived >= 60*4
	})
	for _, h := range []*testnet.Host{a, b} {
		if f := st.One(t, h); !st.Counted(f.Connections, 60) || !st.CountedBytes(f.BytesSent, 60*4, 4) || !st.CountedBytes(f.BytesReceived, 60*4, 4) {
			t.Errorf("%s: %+v; want 60 connections and 240 bytes each way", h.Name, f.Counters)
		}
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("pins left after Close: %v", err)
	}
}

// sum adds up the counters of host h's flows in iv.
func sum(iv tracer.Interval, h *testnet.Host) tracer.Counters {
	var c tracer.Counters
	for _, f := range inNetns(iv.Flows, h.Inode) {
		c.Add(f.Counters)
	}
	return c
}

func newPinnedErr(path string) (*tracer.Tracer, error) {
	closeShared() // one deptrace loaded at a time
	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	return tracer.New(cfg)
}

// A kernel side pinned with other map sizes is not adopted: it is
// replaced, and what it counted is still reported.
func TestIncompatiblePinnedSideIsReplaced(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6061")
	wait := echoServer(ln, 5, 3, 3)

	closeShared() // one deptrace loaded at a time
	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	cfg.FlowMapSize = 4096
	old, err := tracer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	connectN(t, a, "tcp4", b.IPv4.String()+":6061", 5, 3, 3)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	old.Release()

	tr := newPinned(t, path) // default map size: another layout
	defer tr.Close()
	ad := tr.Adoption()
	if ad.Adopted || !strings.Contains(ad.Replaced, "flow-map-size") || ad.Salvaged == 0 {
		t.Fatalf("adoption: %+v; want the old side replaced and its flows salvaged", ad)
	}
	st := newBatchStore()
	st.settle(t, tr, func(l *tracertest.Ledger) bool { return l.One(t, a).Connections >= 5 })
	if f := st.One(t, a); !st.Counted(f.Connections, 5) {
		t.Errorf("salvaged client flow: %+v", f.Counters)
	}
}

// A process that stored an interval and died before committing it, whose
// kernel side the next deptrace build replaces (here: another map size),
// has that interval salvaged under its own BatchID and reported first: a
// store that applied it does not count it twice. What the replaced side
// counted after it comes with the new side's first interval.
func TestReplacedSideStoredIntervalCountedOnce(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6065")
	wait := echoServer(ln, 8, 3, 3)
	server := b.IPv4.String() + ":6065"

	closeShared() // one deptrace loaded at a time
	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	cfg.FlowMapSize = 4096
	old, err := tracer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	connectN(t, a, "tcp4", server, 5, 3, 3)
	st := newBatchStore()
	stored := tracertest.Collect(t, old)
	if !st.apply(t, stored) || sum(stored, a).Connections != 5 {
		t.Fatalf("the stored interval %s has %+v from the client; want its 5 connections", stored.BatchID, sum(stored, a))
	}
	old.Release() // dies before its commit
	connectN(t, a, "tcp4", server, 3, 3, 3)

	tr := newPinned(t, path) // default map size: replaced
	defer tr.Close()
	if ad := tr.Adoption(); ad.Adopted || ad.Replaced == "" || ad.Salvaged == 0 {
		t.Fatalf("adoption: %+v; want the old side replaced and its flows salvaged", ad)
	}
	first := st.store(t, tr)
	if !first.Recovered || first.BatchID != stored.BatchID || sum(first, a).Connections != 5 {
		t.Errorf("first interval after the replacement: batch %s recovered=%v, %d connections; want the stored %s again with its 5",
			first.BatchID, first.Recovered, sum(first, a).Connections, stored.BatchID)
	}
	st.settle(t, tr, func(l *tracertest.Ledger) bool { return l.One(t, a).Connections >= 8 })
	if f := st.One(t, a); !st.Counted(f.Connections, 8) {
		t.Errorf("client flow over the replacement: %+v; want 8 connections, each once", f.Counters)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// A process that dies after reading an interval and before storing it
// loses nothing: the next one collects that interval again, whole, under
// the same BatchID.
func TestPinnedIntervalReadButNotStoredIsCollectedAgain(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6062")
	wait := echoServer(ln, 25, 5, 5)
	server := b.IPv4.String() + ":6062"

	first := newPinned(t, path)
	connectN(t, a, "tcp4", server, 15, 5, 5)
	read := tracertest.Collect(t, first) // read, never stored: the process dies
	first.Release()
	connectN(t, a, "tcp4", server, 10, 5, 5)

	second := newPinned(t, path)
	defer second.Close()
	st := newBatchStore()
	again := st.store(t, second)
	if !again.Recovered || again.BatchID != read.BatchID {
		t.Fatalf("first interval of the adopting process: batch %s recovered=%v; want %s again", again.BatchID, again.Recovered, read.BatchID)
	}
	if got, want := sum(again, a), sum(read, a); got.Connections != want.Connections || got.BytesSent != want.BytesSent || got.Connections == 0 {
		t.Errorf("collected again: %+v; first read: %+v", got, want)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	st.settle(t, second, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesReceived >= 25*5 && l.One(t, b).BytesReceived >= 25*5
	})
	for _, h := range []*testnet.Host{a, b} {
		if f := st.One(t, h); !st.Counted(f.Connections, 25) || !st.CountedBytes(f.BytesSent, 25*5, 5) || !st.CountedBytes(f.BytesReceived, 25*5, 5) {
			t.Errorf("%s: %+v; want 25 connections and 125 bytes each way", h.Name, f.Counters)
		}
	}
}

// In one process, a pinned interval not committed is collected again
// (the kernel keeps counting into the other map meanwhile); a stale or
// repeated Commit does nothing; the next interval is a new one.
func TestPinnedCollectRepeatsUntilCommit(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6063")
	wait := echoServer(ln, 12, 2, 2)
	server := b.IPv4.String() + ":6063"
	tr := newPinned(t, path)
	defer tr.Close()

	connectN(t, a, "tcp4", server, 8, 2, 2)
	iv1 := tracertest.Collect(t, tr)
	connectN(t, a, "tcp4", server, 4, 2, 2) // counted in the active map
	iv2 := tracertest.Collect(t, tr)
	if !iv2.Recovered || iv2.BatchID != iv1.BatchID || iv1.Recovered {
		t.Fatalf("uncommitted interval collected again: %s recovered=%v, first %s recovered=%v", iv2.BatchID, iv2.Recovered, iv1.BatchID, iv1.Recovered)
	}
	if sum(iv2, a) != sum(iv1, a) {
		t.Errorf("the same interval changed: %+v then %+v", sum(iv1, a), sum(iv2, a))
	}
	st := newBatchStore()
	st.apply(t, iv1)
	st.apply(t, iv2) // ignored: same batch
	for _, c := range []tracer.Interval{iv2, iv1, iv2} {
		if err := c.Commit(); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	iv3 := st.store(t, tr)
	if iv3.Recovered || iv3.BatchID == iv1.BatchID {
		t.Fatalf("after the commit, %s recovered=%v; want a new interval", iv3.BatchID, iv3.Recovered)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	st.settle(t, tr, func(l *tracertest.Ledger) bool {
		return l.One(t, a).BytesReceived >= 12*2 && l.One(t, b).BytesReceived >= 12*2
	})
	for _, h := range []*testnet.Host{a, b} {
		if f := st.One(t, h); !st.Counted(f.Connections, 12) || !st.CountedBytes(f.BytesSent, 12*2, 2) || !st.CountedBytes(f.BytesReceived, 12*2, 2) {
			t.Errorf("%s: %+v; want 12 connections and 24 bytes each way", h.Name, f.Counters)
		}
	}
}

// Without a pin path, Collect commits: every interval is new, with a new
// BatchID, and Commit does nothing.
func TestUnpinnedCollectCommitsAtOnce(t *testing.T) {
	tr := startTracer(t, nil)
	ids := map[string]bool{}
	for i := 0; i < 3; i++ {
		iv := tracertest.Collect(t, tr) // never committed
		if iv.Recovered || iv.BatchID == "" || ids[iv.BatchID] {
			t.Fatalf("interval %d: batch %q recovered=%v; want a new batch id each time (seen %v)", i, iv.BatchID, iv.Recovered, ids)
		}
		ids[iv.BatchID] = true
		if err := iv.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
