package bundler

import (
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Flow map values are not reset after a drain: each carries the interval
// it counted, a program zeroes one it first touches in a later interval,
// and the drain reads only the values of the interval it drains. Planted
// here, tagged with the interval already drained from the map, 1,000
// connections: of the client's flow, which programs touch
// again two intervals later (they must zero it first), and of a flow no
// program touches (the drain must leave it out).
func TestFlowValuesCountOnlyTheirInterval(t *testing.T) {
	const port = 7413
	testHooks.noCache = true // the map's path, not the cache's
	defer func() { testHooks.noCache = false }()
	w := newCommitWorld(t, port)
	bu := w.load(t)

	// Locked and never unlocked: the thread, kept on CPU 0, exits with
	// the test's goroutine instead of serving other goroutines.
	runtime.LockOSThread()
	var one unix.CPUSet
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	drain := func() uint64 {
		t.Helper()
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, e := range entries {
			if e.NetNS == w.client.Inode && e.Direction == DirOutbound && (e.Port == port || e.Port == port+1) {
				n += e.Connections
			}
		}
		return n
	}

	m := bu.active
	first, err := bu.intervalNow()
	if err != nil {
		t.Fatal(err)
	}
	w.connect(3)
	if got := drain(); got != 3 {
		t.Fatalf("interval %d: %d connections, want 3", first, got)
	}
	keys, _, err := bu.readAll(bu.inner[m])
	if err != nil {
		t.Fatal(err)
	}
	var key bundlerFlowKey
	found := false
	for _, k := range keys {
		if k.Netns == w.client.Inode && k.Direction == DirOutbound && k.Port == port {
			key, found = k, true
		}
	}
	if !found {
		t.Fatalf("the client's flow is not in flow map %d after its drain (%d keys): a recurring flow must be kept", m, len(keys))
	}
	var stale bundlerFlowValue
	stale.Gen, stale.Connections, stale.BytesSent = first, 1000, 1000
	if err := bu.inner[m].Put(key, stale); err != nil {
		t.Fatal(err)
	}
	untouched := key
	untouched.Port = port + 1
	if err := bu.inner[m].Put(untouched, stale); err != nil {
		t.Fatal(err)
	}
	if got := drain(); got != 0 {
		t.Fatalf("interval %d (the other map): %d connections, want 0", first+1, got)
	}
	w.connect(2)
	if got := drain(); got != 2 {
		t.Fatalf("interval %d: %d connections, want 2 (1,000 more: a value of interval %d counted again)", first+2, got, first)
	}
	if got := drain(); got != 0 {
		t.Fatalf("interval %d: %d connections, want 0", first+3, got)
	}
}

// What the drain keeps of a value of another interval: its process only.
func TestOnlyIntervalKeepsTheProcess(t *testing.T) {
	b := &Bundler{}
	vals := []bundlerFlowValue{
		{Gen: 7, Connections: 4, Pid: 10, CgroupId: 3},
		{Gen: 5, Connections: 9, BytesSent: 100, LastSeenNs: 50, Pid: 11, CgroupId: 4, Comm: [16]int8{'c', 'u', 'r', 'l'}},
	}
	b.onlyInterval(vals, 7)
	if vals[0].Connections != 4 || vals[0].Gen != 7 {
		t.Errorf("a value of the interval read was changed: %+v", vals[0])
	}
	want := bundlerFlowValue{Pid: 11, CgroupId: 4, Comm: [16]int8{'c', 'u', 'r', 'l'}}
	if vals[1] != want {
		t.Errorf("a value of an older interval became %+v, want only its process %+v", vals[1], want)
	}
}

// An unpinned side whose drain fails after the switch (here: the grace
// period cannot be waited for) returns that interval with the next
// Collect, once and committed: the one after is a new interval. Nothing
// else would tell a repeat of an unpinned interval from a new one.
func TestUnpinnedFailedDrainComesOnce(t *testing.T) {
	w := newCommitWorld(t, 7414)
	bu := w.load(t)
	w.connect(3)
	closed, err := bu.flows.Clone()
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	flows := bu.flows
	bu.flows = closed
	failed, err := bu.Collect()
	bu.flows = flows
	if err == nil || failed.Gen != 0 || len(failed.Entries) != 0 {
		t.Fatalf("a drain whose grace period failed: gen %d, %d entries, error %v; want gen 0, none, an error", failed.Gen, len(failed.Entries), err)
	}
	again, err := bu.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !again.Recovered || w.clientConns(again) != 3 {
		t.Fatalf("the next drain: gen %d recovered=%v %d connections; want the failed interval, its 3", again.Gen, again.Recovered, w.clientConns(again))
	}
	w.connect(2)
	next, err := bu.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if next.Recovered || next.Gen != again.Gen+1 || w.clientConns(next) != 2 {
		t.Fatalf("the drain after: gen %d recovered=%v %d connections; want gen %d, new, its 2", next.Gen, next.Recovered, w.clientConns(next), again.Gen+1)
	}
}

// An unpinned interval whose commit fails inside Collect is returned with
// the error, once: the next Collect only commits it again and returns a
// new interval.
func TestUnpinnedFailedCommitComesOnce(t *testing.T) {
	w := newCommitWorld(t, 7415)
	bu := w.load(t)
	w.connect(3)
	testHooks.failCommits = 1
	defer func() { testHooks.failCommits = 0 }()
	first, err := bu.Collect()
	if err == nil || w.clientConns(first) != 3 {
		t.Fatalf("a drain whose commit failed: %d connections, error %v; want its 3 and the error", w.clientConns(first), err)
	}
	w.connect(2)
	next, err := bu.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if next.Recovered || next.Gen != first.Gen+1 || w.clientConns(next) != 2 {
		t.Fatalf("the drain after: gen %d recovered=%v %d connections; want gen %d, new, its 2", next.Gen, next.Recovered, w.clientConns(next), first.Gen+1)
	}
	if bu.drain.pending != nil {
		t.Fatalf("interval %d still pending after the drain after it", bu.drain.pending.gen)
	}
}

// A committed interval's entries are the memory the next drain decodes
// into (Commit hands them back), and each drain still returns its own
// interval's counts.
func TestCommitHandsTheEntriesBack(t *testing.T) {
	const port = 7415
	w := newCommitWorld(t, port)
	bu := w.load(t)
	drain := func(want uint64) []Entry {
		t.Helper()
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		if n := w.clientConns(Interval{Entries: entries}); n != want {
			t.Fatalf("drained %d connections of the client, want %d: %+v", n, want, entries)
		}
		return entries
	}
	if _, _, err := bu.Drain(); err != nil { // whatever came before the test
		t.Fatal(err)
	}
	w.connect(3)
	first := drain(3)
	mem := unsafe.SliceData(first[:cap(first)])
	w.connect(2)
	second := drain(2)
	if len(second) > cap(first) {
		t.Fatalf("the second drain has %d entries, the first room for %d: nothing to reuse, so the test cannot check it", len(second), cap(first))
	}
	if unsafe.SliceData(second[:cap(second)]) != mem {
		t.Errorf("the second drain's entries are not in the first's memory (%d entries, room for %d)", len(second), cap(first))
	}
}
