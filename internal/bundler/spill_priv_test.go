package bundler

import (
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/tracertest/poll"
)

// The flow spill: where a new flow goes when its insert into the flow map
// fails. An insert fails rarely and at random (an empty allocator cache on
// 6.1, a nested update), so these tests load the kernel side with
// spill_only, which sends every new flow there, and trace only the test's
// client namespace, so that nothing else on the machine fills the spill.

// forceSpillFor sets testHooks.spill for the rest of the test.
func forceSpillFor(t *testing.T) {
	testHooks.spill = true
	t.Cleanup(func() { testHooks.spill = false })
}

// spillUsed is the kernel side's count of slots claimed in half h.
func spillUsed(t *testing.T, b *Bundler, h int) uint64 {
	t.Helper()
	var used uint64
	if err := b.objs.SpillUsed.Lookup(uint32(h), &used); err != nil {
		t.Fatal(err)
	}
	return used
}

// flowMapKeys counts the keys both flow maps hold.
func flowMapKeys(t *testing.T, b *Bundler) int {
	t.Helper()
	n := 0
	for _, m := range b.inner {
		keys, _, err := b.readAll(m)
		if err != nil {
			t.Fatal(err)
		}
		n += len(keys)
	}
	return n
}

// Connections counted in the spill come out exact, interval after
// interval, with both halves of the spill in use by turns; the flow maps
// hold nothing.
func TestSpillCountsEveryConnection(t *testing.T) {
	forceSpillFor(t)
	w := newCommitWorld(t, 7400)
	bu := w.load(t)

	var got, latencies uint64
	var pid uint32
	drain := func() {
		t.Helper()
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range entries {
			if e.NetNS == w.client.Inode && e.Direction == DirOutbound && e.Port == 7400 {
				n++
				got += e.Connections
				latencies += e.LatencyCount
				pid = e.PID
			}
		}
		if n > 1 {
			t.Fatalf("the client's flow came as %d entries in one interval, want one", n)
		}
	}
	const rounds, workers, each = 4, 4, 10
	for r := 0; r < rounds; r++ {
		if bu.active != r%2 {
			drain() // the next round spills into the other half
		}
		errs := make(chan error, workers)
		for i := 0; i < workers; i++ {
			go func() {
				for j := 0; j < each; j++ {
					c, err := w.client.Dial("tcp4", w.server)
					if err != nil {
						errs <- err
						return
					}
					c.Close()
				}
				errs <- nil
			}()
		}
		for i := 0; i < workers; i++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		// A client's connection is counted before its connect returns.
		if used := spillUsed(t, bu, r%2); used == 0 {
			t.Fatalf("round %d: no slot of spill half %d claimed", r, r%2)
		}
		want := uint64((r + 1) * workers * each)
		poll.Settle(10*time.Second, func() bool { return got >= want }, drain)
		if !countedWithLatency(t, bu, want, got, latencies) {
			t.Fatalf("round %d: connections %d, latencies %d, want %d of each (%s)", r, got, latencies, want, lossReport(bu))
		}
	}
	if pid != uint32(os.Getpid()) {
		t.Errorf("spilled flow named pid %d, want the test's %d", pid, os.Getpid())
	}
	if n := flowMapKeys(t, bu); n != 0 {
		t.Errorf("the flow maps hold %d keys; spill_only should have left them empty", n)
	}
	for h := 0; h < 2; h++ {
		if used := spillUsed(t, bu, h); used != 0 {
			t.Errorf("spill half %d still counts %d claimed slots after its drain", h, used)
		}
	}
}

// A key the flow map and several spill slots hold (two programs racing to
// claim one key take two slots) comes out as one entry, summed; the
// slots are freed by the drain.
func TestSpillMergesDuplicateKeys(t *testing.T) {
	// The slots listed as the kernel side lists its claims.
	testSpillMerges(t, func(base uint32) []uint32 { return []uint32{base, base + 1, base + 2, base + 3} })
}

// The same with a claims list the drain cannot trust: a slot listed
// twice (claimed again after a read that failed part-way freed it) and
// one outside the half. The drain reads the whole half instead: each
// slot once, none missed.
func TestSpillUntrustedClaimsReadTheHalf(t *testing.T) {
	testSpillMerges(t, func(base uint32) []uint32 { return []uint32{base, base + 1, base + 1, base ^ 0x8000_0000} })
}

func testSpillMerges(t *testing.T, claimed func(base uint32) []uint32) {
	testHooks.noCache = true // the flow in the map, not the cache in front of it
	defer func() { testHooks.noCache = false }()
	w := newCommitWorld(t, 7401)
	bu := w.load(t)
	w.connect(5)

	// The client's flow, from the map.
	keys, _, err := bu.readAll(bu.inner[bu.active])
	if err != nil {
		t.Fatal(err)
	}
	var key bundlerFlowKey
	found := false
	for _, k := range keys {
		if k.Netns == w.client.Inode && k.Direction == DirOutbound && k.Port == 7401 {
			key, found = k, true
		}
	}
	if !found {
		t.Fatalf("the client's flow is not in the active flow map (%d keys)", len(keys))
	}
	other := key
	other.Port++ // a key only the spill holds

	h := bu.active
	base := uint32(h) * bu.spillSlots()
	spill := bu.objs.Spill
	for i, s := range []struct {
		key   bundlerFlowKey
		conns uint64
	}{{key, 1000}, {other, 7}, {key, 2000}, {other, 8}} {
		slot := bundlerSpillSlot{State: uint32(bundlerSpillStateSPILL_READY), Key: s.key}
		slot.Value.Connections = s.conns
		if err := spill.Put(base+uint32(i), slot); err != nil {
			t.Fatal(err)
		}
	}
	// Claimed as the kernel side claims: counted, and listed in order.
	claims := new(bundlerSpillClaims)
	copy(claims.Slot[:], claimed(base))
	if err := bu.objs.SpillClaims.Put(uint32(h), claims); err != nil {
		t.Fatal(err)
	}
	if err := bu.objs.SpillUsed.Put(uint32(h), uint64(4)); err != nil {
		t.Fatal(err)
	}

	count := func(entries []Entry, port uint16) (n int, conns uint64) {
		for _, e := range entries {
			if e.NetNS == w.client.Inode && e.Direction == DirOutbound && e.Port == port {
				n++
				conns += e.Connections
			}
		}
		return n, conns
	}
	entries, _, err := bu.Drain()
	if err != nil {
		t.Fatal(err)
	}
	if n, c := count(entries, 7401); n != 1 || c != 3005 {
		t.Errorf("map and spill key: %d entries, %d connections; want 1 entry of 5+1000+2000", n, c)
	}
	if n, c := count(entries, 7402); n != 1 || c != 15 {
		t.Errorf("spill-only key: %d entries, %d connections; want 1 entry of 7+8", n, c)
	}
	if used := spillUsed(t, bu, h); used != 0 {
		t.Errorf("spill half %d counts %d claimed slots after its drain, want 0", h, used)
	}
	for i := uint32(0); i < 4; i++ {
		var s bundlerSpillSlot
		if err := spill.Lookup(base+i, &s); err != nil {
			t.Fatal(err)
		}
		if s != (bundlerSpillSlot{}) {
			t.Errorf("spill slot %d not freed by the drain: state %d, %d connections", base+i, s.State, s.Value.Connections)
		}
	}
	// Two more intervals (both halves): nothing counted twice.
	for i := 0; i < 2; i++ {
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		_, c1 := count(entries, 7401)
		_, c2 := count(entries, 7402)
		if c1 != 0 || c2 != 0 {
			t.Errorf("drain %d after: %d and %d connections counted again", i+2, c1, c2)
		}
	}
}

// More new flows in one interval than the spill holds: the ones that find
// no slot are counted as lost, and every datagram is either reported or
// counted lost. The drain frees the full half: later intervals lose
// nothing.
func TestSpillFullCountsTheLoss(t *testing.T) {
	forceSpillFor(t)
	w := newCommitWorld(t, 7403)
	bu := w.load(t)
	server, _, _ := net.SplitHostPort(w.server)
	pc := w.client.ListenPacket(t, "udp4", w.client.IPv4.String()+":0")

	const firstPort = 20000
	sent := map[int]bool{}
	send := func(from, n int) {
		t.Helper()
		for p := from; p < from+n; p++ {
			if _, err := pc.WriteTo([]byte("x"), &net.UDPAddr{IP: net.ParseIP(server), Port: p}); err != nil {
				t.Fatal(err)
			}
			sent[p] = true
		}
	}
	var reported uint64
	collect := func() {
		t.Helper()
		entries, _, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.NetNS == w.client.Inode && e.Proto == unix.IPPROTO_UDP && e.Direction == DirOutbound && sent[int(e.Port)] {
				reported += e.DatagramsSent
			}
		}
	}
	lost := func() uint64 {
		t.Helper()
		s, err := bu.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if s.UDPPeerUnknown != 0 || s.FlowMapFull != 0 {
			t.Fatalf("datagrams without a peer %d, flow map full %d: the test's accounting is off", s.UDPPeerUnknown, s.FlowMapFull)
		}
		return s.FlowAllocFailed
	}

	// Far more distinct flows than a half's slots, in one interval.
	batch := int(bu.spillSlots()) * 2
	send(firstPort, batch)
	collect()
	collect()
	lostFirst := lost()
	if lostFirst == 0 || reported == 0 || reported+lostFirst != uint64(batch) {
		t.Fatalf("%d flows in one interval: %d reported, %d counted lost; want some of each, summing to %d", batch, reported, lostFirst, batch)
	}
	if reported > uint64(bu.spillSlots()) {
		t.Errorf("%d flows reported from a %d-slot spill half", reported, bu.spillSlots())
	}

	// Then fewer flows than a half's slots, an interval in each half.
	few := int(bu.spillSlots()) / 4
	for i := 0; i < 2; i++ {
		before := reported
		send(firstPort+batch+i*few, few)
		collect()
		if got := reported - before; got != uint64(few) {
			t.Errorf("interval %d after the full one: %d of %d flows reported (%s)", i+1, got, few, lossReport(bu))
		}
	}
	if l := lost(); l != lostFirst {
		t.Errorf("%d more flows counted lost after the full interval was drained", l-lostFirst)
	}
}

// A pinned side's interval held in the spill is collected again, whole,
// until it is committed, also by a process that adopts the side; the
// commit frees it.
func TestPinnedSpillCollectedUntilCommitted(t *testing.T) {
	forceSpillFor(t)
	w := newCommitWorld(t, 7404)
	cfg := pinnedTestConfig(t)
	cfg.NetNS = w.client.Inode
	first := mustLoad(t, cfg)
	t.Cleanup(first.Release) // its lock, should the test stop before it does
	w.connect(5)
	iv, err := first.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if w.clientConns(iv) != 5 {
		t.Fatalf("first interval: %d connections, want 5 (%s)", w.clientConns(iv), lossReport(first))
	}
	again, err := first.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !again.Recovered || again.BatchID() != iv.BatchID() || w.clientConns(again) != 5 {
		t.Fatalf("collected again before its commit: %s recovered=%v %d connections; want %s again, 5", again.BatchID(), again.Recovered, w.clientConns(again), iv.BatchID())
	}
	first.Release()

	second := mustLoad(t, cfg)
	defer second.Close()
	adopted, err := second.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !adopted.Recovered || adopted.BatchID() != iv.BatchID() || w.clientConns(adopted) != 5 {
		t.Fatalf("collected by the adopting process: %s recovered=%v %d connections; want %s again, 5", adopted.BatchID(), adopted.Recovered, w.clientConns(adopted), iv.BatchID())
	}
	w.apply(adopted)
	if err := second.Commit(adopted.Gen); err != nil {
		t.Fatal(err)
	}
	w.connect(3)
	w.settle(second, 8)
}

// Killed after making programs count the next interval, before the grace
// period: the adopting process collects the pending interval from its map
// and spill half, and what programs count meanwhile comes with the next
// interval. (That it waits for a grace period before the read cannot be
// observed here: no program is running at that point. The race itself is
// what tracer's TestNoLossAcrossDrains exercises, drains under traffic.)
func TestKilledBetweenTheSwitchAndItsGracePeriod(t *testing.T) {
	forceSpillFor(t)
	w := newCommitWorld(t, 7405)
	cfg := pinnedTestConfig(t)
	cfg.NetNS = w.client.Inode
	first := mustLoad(t, cfg)
	t.Cleanup(first.Release) // its lock, should the test stop before it does
	w.connect(2)
	if err := first.loadDrainState(); err != nil {
		t.Fatal(err)
	}
	g := first.drain.gen + 1
	if err := first.writeDrainRecord(g, true); err != nil {
		t.Fatal(err)
	}
	if err := first.setInterval(g + 1); err != nil {
		t.Fatal(err)
	}
	first.Release()
	w.connect(4) // into interval g+1's spill half

	second := mustLoad(t, cfg)
	defer second.Close()
	iv, err := second.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if !iv.Recovered || iv.Gen != g || w.clientConns(iv) != 2 {
		t.Fatalf("first interval: gen %d recovered=%v %d connections; want generation %d again with its 2", iv.Gen, iv.Recovered, w.clientConns(iv), g)
	}
	w.apply(iv)
	w.connect(3) // between the read and the commit
	if err := second.Commit(iv.Gen); err != nil {
		t.Fatal(err)
	}
	w.settle(second, 9)
}
