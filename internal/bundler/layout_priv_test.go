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
