package bundler

import (
	"fmt"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
)

// What reading a spill half costs the drain at the default flow map size
// (8,192 slots a half), by how many slots were claimed: the claimed slots
// alone while few were, the whole half in batches past a quarter:
//
//	go test -run '^$' -bench SpillRead ./internal/bundler
func BenchmarkSpillRead(b *testing.B) {
	testnet.RequireRoot(b)
	bu, err := Load(Config{FlowMapSize: 65536, PortMapSize: 16384})
	if err != nil {
		b.Fatal(err)
	}
	defer bu.Close()
	n := bu.spillSlots()
	claims := new(bundlerSpillClaims)
	for _, h := range []int{0, 1} {
		for i := range claims.Slot {
			claims.Slot[i] = uint32(h)*n + uint32(i)%n
		}
		if err := bu.objs.SpillClaims.Put(uint32(h), claims); err != nil {
			b.Fatal(err)
		}
		for _, used := range []uint32{1, 300, n / claimedShare, n} {
			b.Run(fmt.Sprintf("half=%d/claimed=%d", h, used), func(b *testing.B) {
				if err := bu.objs.SpillUsed.Put(uint32(h), uint64(used)); err != nil {
					b.Fatal(err)
				}
				for i := 0; i < b.N; i++ {
					if _, err := bu.readSpill(h); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// Freeing a flow cache half whose every slot held a flow that counted (a
// host with more flows than slots: 1,000 client hosts), as each commit
// does; the slots keep their flows, zeroed:
//
//	go test -run '^$' -bench FreeFullCacheHalf -benchmem ./internal/bundler
func BenchmarkFreeFullCacheHalf(b *testing.B) {
	testnet.RequireRoot(b)
	bu, err := Load(testConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer bu.Close()
	var sp spillRead
	for j := range bu.cacheSlots() {
		cpus := make([]bundlerSpillSlot, bu.ncpu)
		for c := range cpus {
			cpus[c].State = uint32(bundlerSpillStateSPILL_READY)
			cpus[c].Key = bundlerFlowKey{Proto: 6, Direction: 1, Port: uint16(7000 + j)}
			cpus[c].Value.Connections = 1
		}
		sp.cacheSlots = append(sp.cacheSlots, j)
		sp.cacheCPUs = append(sp.cacheCPUs, cpus)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := bu.freeSpill(0, sp); err != nil {
			b.Fatal(err)
		}
	}
}
