package bundler

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/testnet"
)

// A replaced side (another build or map size) is salvaged only when its
// flow layout is this build's: one of another layout, or of a build that
// did not record its layout, has its entries counted as unreadable, never
// decoded into wrong counts. Of its flow maps only the values of intervals
// not committed are salvaged: a committed interval's values stay in its
// map until programs touch them again, and were stored already.
func TestReplacedSideSalvagedOnlyInItsLayout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		layout    uint32 // written over the pinned side's; 0: left as pinned
		committed uint64 // connections of an interval collected and committed first
	}{{"same layout", 0, 0}, {"same layout after a committed interval", 0, 4}, {"older layout", flowLayout - 1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.committed != 0 {
				// Through the flow map: a cache half is freed at the
				// commit anyway.
				testHooks.noCache = true
				t.Cleanup(func() { testHooks.noCache = false })
			}
			w := newCommitWorld(t, 7420)
			cfg := pinnedTestConfig(t)
			cfg.NetNS = w.client.Inode
			first := mustLoad(t, cfg)
			t.Cleanup(first.Release)
			if tc.committed != 0 {
				w.connect(int(tc.committed))
				iv, err := first.Collect()
				if err != nil {
					t.Fatal(err)
				}
				if got := w.clientConns(iv); got != tc.committed {
					t.Fatalf("the committed interval has %d connections, want %d", got, tc.committed)
				}
				if err := first.Commit(iv.Gen); err != nil {
					t.Fatal(err)
				}
			}
			w.connect(5)
			first.Release()
			if tc.layout != 0 {
				meta, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinPath, "meta"), nil)
				if err != nil {
					t.Fatal(err)
				}
				var v [32]byte
				v[0] = byte(tc.layout)
				err = meta.Put(uint32(1), v)
				meta.Close()
				if err != nil {
					t.Fatal(err)
				}
			}

			cfg.FlowMapSize *= 2 // another map size: replaced, not adopted
			second := mustLoad(t, cfg)
			defer second.Close()
			ad := second.adopt
			if ad.Adopted || ad.Replaced == "" {
				t.Fatalf("adoption %+v: want the pinned side replaced", ad)
			}
			var conns uint64
			for _, e := range ad.Salvaged {
				if e.NetNS == w.client.Inode && e.Direction == DirOutbound {
					conns += e.Connections
				}
			}
			if tc.layout == 0 && (conns != 5 || ad.Unreadable != 0) {
				t.Errorf("%s: salvaged %d connections, %d unreadable; want 5 and 0", tc.name, conns, ad.Unreadable)
			}
			if tc.layout != 0 && (len(ad.Salvaged) != 0 || ad.Unreadable == 0) {
				t.Errorf("older layout: %d entries salvaged, %d unreadable; want none decoded and its entries counted", len(ad.Salvaged), ad.Unreadable)
			}
		})
	}
}

// The interval a replaced side's process collected and did not commit is
// salvaged apart from what the side counted after it: by the values' tags
// in the flow map, by half in the spill and the flow cache. The new side
// returns it first, under the replaced side's batch id, until that id is
// committed (this side's own Commit of the same generation does not),
// then its own first interval with the rest.
func TestReplacedSidePendingIntervalSalvagedApart(t *testing.T) {
	for _, path := range []string{"flow cache", "flow map", "spill"} {
		t.Run(path, func(t *testing.T) {
			switch path {
			case "flow map":
				testHooks.noCache = true
				t.Cleanup(func() { testHooks.noCache = false })
			case "spill":
				testHooks.spill = true
				t.Cleanup(func() { testHooks.spill = false })
			}
			w := newCommitWorld(t, 7421)
			cfg := pinnedTestConfig(t)
			cfg.NetNS = w.client.Inode
			first := mustLoad(t, cfg)
			t.Cleanup(first.Release)
			w.connect(5)
			collected, err := first.Collect()
			if err != nil {
				t.Fatal(err)
			}
			if got := w.clientConns(collected); got != 5 {
				t.Fatalf("collected %d connections, want 5", got)
			}
			w.connect(3)
			first.Release() // dies before its commit

			cfg.FlowMapSize *= 2 // another map size: replaced, not adopted
			second := mustLoad(t, cfg)
			defer second.Close()
			conns := func(es []Entry) uint64 { return w.clientConns(Interval{Entries: es}) }
			if ad := second.adopt; ad.Adopted || ad.Replaced == "" || conns(ad.SalvagedPending) != 5 || conns(ad.Salvaged) != 3 {
				t.Fatalf("adoption: replaced %q, %d connections salvaged of the collected interval and %d after it; want 5 and 3",
					ad.Replaced, conns(ad.SalvagedPending), conns(ad.Salvaged))
			}
			for try := 0; try < 2; try++ {
				iv, err := second.Collect()
				if err != nil {
					t.Fatal(err)
				}
				if iv.BatchID() != collected.BatchID() || !iv.Recovered || w.clientConns(iv) != 5 {
					t.Fatalf("collect %d after the replacement: batch %s recovered=%v, %d connections; want %s again with its 5",
						try+1, iv.BatchID(), iv.Recovered, w.clientConns(iv), collected.BatchID())
				}
				if try == 0 {
					// This side's generation of the same number: not the salvaged interval's commit.
					if err := second.Commit(iv.Gen); err != nil {
						t.Fatal(err)
					}
				} else if err := second.CommitOf(iv.Side, iv.Gen); err != nil {
					t.Fatal(err)
				}
			}
			next, err := second.Collect()
			if err != nil {
				t.Fatal(err)
			}
			if next.Side == collected.Side || next.Recovered || w.clientConns(next) != 3 {
				t.Fatalf("the new side's first interval: batch %s recovered=%v, %d connections; want its own, with the 3 counted after the collected one",
					next.BatchID(), next.Recovered, w.clientConns(next))
			}
			// The salvaged interval's commit again, of the same number as
			// this side's first: that one stays uncommitted.
			if err := second.CommitOf(collected.Side, next.Gen); err != nil {
				t.Fatal(err)
			}
			again, err := second.Collect()
			if err != nil {
				t.Fatal(err)
			}
			if again.BatchID() != next.BatchID() || !again.Recovered {
				t.Errorf("after a commit of the replaced side's generation %d: batch %s recovered=%v; want this side's %s again, uncommitted",
					next.Gen, again.BatchID(), again.Recovered, next.BatchID())
			}
		})
	}
}

// A side pinned by the build before the flow maps held one value per flow
// (flowLayoutPerCPU: the same value layout, a value per CPU) is salvaged
// by summing each key's CPUs: an upgrade keeps what that side counted.
// Flow maps of the other type than their layout says are never decoded.
func TestPerCPUSideSalvagedOnUpgrade(t *testing.T) {
	testnet.RequireRoot(t)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	newMap := func(typ ebpf.MapType, key, value uint32) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: key, ValueSize: value, MaxEntries: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	const now = 9
	intervalNow := newMap(ebpf.Array, 4, 8)
	if err := intervalNow.Put(uint32(0), uint64(now)); err != nil {
		t.Fatal(err)
	}
	keySize, valueSize := uint32(binarySize[bundlerFlowKey]()), uint32(binarySize[bundlerFlowValue]())
	perCPU := newMap(ebpf.PerCPUHash, keySize, valueSize)
	counted, older := bundlerFlowKey{Netns: 1, Port: 80}, bundlerFlowKey{Netns: 1, Port: 81}
	vals := make([]bundlerFlowValue, ncpu)
	want := uint64(0)
	for i := range vals {
		vals[i].Gen, vals[i].Connections = now, uint64(i+1)
		want += uint64(i + 1)
	}
	if err := perCPU.Put(counted, vals); err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		vals[i].Gen = now - 2 // committed long ago
	}
	if err := perCPU.Put(older, vals); err != nil {
		t.Fatal(err)
	}

	side := &pinnedSide{layout: flowLayoutPerCPU, maps: map[string]*ebpf.Map{"interval_now": intervalNow}, inner: [2]*ebpf.Map{perCPU}}
	s := side.salvage(ncpu)
	if len(s.current) != 1 || s.current[0].Port != 80 || s.current[0].Connections != want || s.unreadable != 0 {
		t.Errorf("per-CPU side salvaged %+v, %d unreadable; want port 80's %d connections, summed over %d CPUs", s.current, s.unreadable, want, ncpu)
	}
	side.layout = flowLayout // a per-CPU map where one value per flow is due
	if s := side.salvage(ncpu); len(s.current) != 0 || s.unreadable != 2 {
		t.Errorf("per-CPU map under flowLayout: %d entries salvaged, %d unreadable; want none decoded, 2 counted", len(s.current), s.unreadable)
	}
}
