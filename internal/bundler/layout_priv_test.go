package bundler

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
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
