package bundler

import (
	"fmt"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/tracertest/poll"
)

// The flow cache: a small direct-mapped cache per CPU in front of the
// flow map (bpf/bundler.bpf.c, flow_cache). A test's few flows land
// there, so these tests check that what the cache counted is drained
// exactly once, with both halves in use by turns.

// cacheClaimed counts the slots of flow cache half h claimed on any CPU,
// and of those, the ones holding a flow of port.
func cacheClaimed(t *testing.T, b *Bundler, h int, port uint16) (claimed, holding int) {
	t.Helper()
	var sp spillRead
	if err := b.readCache(h, &sp); err != nil {
		t.Fatal(err)
	}
	for _, k := range sp.keys {
		if k.Port == port {
			holding++
		}
	}
	return len(sp.cacheSlots), holding
}

// Connections counted in the cache come out exact, interval after
// interval; every drained half is left free.
func TestFlowCacheCountsEveryConnection(t *testing.T) {
	flowCacheCountsEveryConnection(t, 7410)
}

// Kernels before 5.13 have no batch operations on per-CPU arrays: the
// drain reads and frees the cache one slot per call, with the same counts.
func TestFlowCacheCountsEveryConnectionSlotBySlot(t *testing.T) {
	testHooks.noArrayBatch = true
	defer func() { testHooks.noArrayBatch = false }()
	flowCacheCountsEveryConnection(t, 7413)
}

func flowCacheCountsEveryConnection(t *testing.T, port int) {
	w := newCommitWorld(t, port)
	bu := w.load(t)

	var got, latencies uint64
	drain := func() {
		t.Helper()
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range entries {
			if e.NetNS == w.client.Inode && e.Direction == DirOutbound && e.Port == uint16(port) {
				n++
				got += e.Connections
				latencies += e.LatencyCount
			}
		}
		if n > 1 {
			t.Fatalf("the client's flow came as %d entries in one interval, want one (cache and map summed)", n)
		}
	}
	const rounds = 4
	for r := 0; r < rounds; r++ {
		if bu.active != r%2 {
			drain() // the next round uses the other half
		}
		w.connectConcurrently(4, 10, nil)
		// A client's connection is counted before its connect returns.
		if _, holding := cacheClaimed(t, bu, r%2, uint16(port)); holding == 0 {
			t.Fatalf("round %d: no CPU's cache half %d holds the client's flow", r, r%2)
		}
		want := uint64((r + 1) * 40)
		poll.Settle(10*time.Second, func() bool { return got >= want }, drain)
		if !countedWithLatency(t, bu, want, got, latencies) {
			t.Fatalf("round %d: connections %d, latencies %d, want %d of each (%s)", r, got, latencies, want, lossReport(bu))
		}
	}
	for h := 0; h < 2; h++ {
		if claimed, _ := cacheClaimed(t, bu, h, uint16(port)); claimed != 0 {
			t.Errorf("cache half %d still has %d claimed slots after its drain", h, claimed)
		}
	}
}

// With the cache off every flow goes to the map, as before the cache:
// exact counts there too (the path flows take when their slot is taken).
func TestFlowCacheOffCountsInTheMap(t *testing.T) {
	const port = 7411
	testHooks.noCache = true
	defer func() { testHooks.noCache = false }()
	w := newCommitWorld(t, port)
	bu := w.load(t)
	w.connectConcurrently(4, 10, nil)
	if claimed, _ := cacheClaimed(t, bu, bu.active, port); claimed != 0 {
		t.Fatalf("cache_off: %d cache slots claimed", claimed)
	}
	if n := flowMapKeys(t, bu); n == 0 {
		t.Fatal("cache_off: the flow maps hold no key")
	}
	w.settle(bu, 40)
}

// A key both in the cache and in the map (its slot was taken on another
// CPU, or it entered the map before the slot was free) comes out as one
// entry, summed.
func TestFlowCacheAndMapSummed(t *testing.T) {
	const port = 7412
	w := newCommitWorld(t, port)
	bu := w.load(t)
	w.connect(5)
	var sp spillRead
	if err := bu.readCache(bu.active, &sp); err != nil {
		t.Fatal(err)
	}
	var key bundlerFlowKey
	found := false
	for _, k := range sp.keys {
		if k.Netns == w.client.Inode && k.Direction == DirOutbound && k.Port == port {
			key, found = k, true
		}
	}
	if !found {
		t.Fatalf("the client's flow is not in the cache (%d keys there)", len(sp.keys))
	}
	now, err := bu.intervalNow()
	if err != nil {
		t.Fatal(err)
	}
	var val bundlerFlowValue
	val.Gen, val.Connections = now, 1000
	if err := bu.inner[bu.active].Put(key, val); err != nil {
		t.Fatal(err)
	}
	entries, _, err := bu.Drain()
	if err != nil {
		t.Fatal(err)
	}
	n, conns := 0, uint64(0)
	for _, e := range entries {
		if e.NetNS == w.client.Inode && e.Direction == DirOutbound && e.Port == port {
			n++
			conns += e.Connections
		}
	}
	if n != 1 || conns != 1005 {
		t.Errorf("cache and map key: %d entries, %d connections; want 1 entry of 5+1000", n, conns)
	}
}

// Freeing a cache half writes back, on every CPU, exactly what cacheReset
// leaves of each slot: a flow that counted keeps its key and process,
// zeroed; an idle one's slot is freed. Read back whole, with the batch
// operations and slot by slot.
func TestFreedCacheSlotsHoldWhatResetLeaves(t *testing.T) {
	for _, slotBySlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("slot by slot %v", slotBySlot), func(t *testing.T) {
			testHooks.noArrayBatch = slotBySlot
			t.Cleanup(func() { testHooks.noArrayBatch = false })
			b := mustLoad(t, testConfig())      // programs count into half 1: half 0 is ours
			t.Cleanup(func() { _ = b.Close() }) // closing a test's bundler: nothing to report
			freedCacheSlotsHoldWhatResetLeaves(t, b)
		})
	}
}

func freedCacheSlotsHoldWhatResetLeaves(t *testing.T, b *Bundler) {
	var sp spillRead
	for j := range b.cacheSlots() {
		cpus := make([]bundlerSpillSlot, b.ncpu)
		for c := range cpus {
			s := &cpus[c]
			s.State = uint32(bundlerSpillStateSPILL_READY)
			s.Key = bundlerFlowKey{Netns: 1 + j, Port: uint16(7000 + j), Proto: 6, Direction: 1}
			s.Value.Gen, s.Value.Pid, s.Value.CgroupId = 5, 100+j, 9000+uint64(c)
			for i, ch := range fmt.Sprintf("p%d-%d", j, c) {
				s.Value.Comm[i] = int8(ch)
			}
			if (int(j)+c)%3 != 0 { // the others idle: freed
				s.Value.Connections, s.Value.BytesSent = 1+uint64(j), 64
			}
		}
		sp.cacheSlots = append(sp.cacheSlots, j)
		sp.cacheCPUs = append(sp.cacheCPUs, cpus)
	}
	if err := b.freeSpill(0, sp); err != nil {
		t.Fatal(err)
	}
	got, err := readHalf[bundlerSpillSlot](b.objs.FlowCache, 0, b.cacheSlots(), b.ncpu)
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	kept := 0
	for j, cpus := range sp.cacheCPUs {
		want := cacheReset(cpus)
		for c := range want {
			if g := got[j*b.ncpu+c]; g != want[c] {
				t.Fatalf("slot %d CPU %d holds %+v, want %+v", j, c, g, want[c])
			}
			if want[c].State != 0 {
				kept++
			}
		}
	}
	if kept == 0 || kept == len(sp.cacheCPUs)*b.ncpu {
		t.Fatalf("%d slots kept: the test needs both kinds", kept)
	}
}
