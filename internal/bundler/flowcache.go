// The per-CPU flow cache in front of the flow map: read with the spill
// half of the same index, and reset slot by slot on every CPU at the
// interval's commit.

package bundler

import "fmt"

// cacheSlots is the slots of one half of a CPU's flow cache.
func (b *Bundler) cacheSlots() uint32 { return b.objs.FlowCache.MaxEntries() / 2 }

// readCache adds to sp the flows in half h of every CPU's flow cache,
// which no program writes any more (see Collect), and the slots to free.
func (b *Bundler) readCache(h int, sp *spillRead) error {
	n := b.cacheSlots()
	all, err := readHalf[bundlerSpillSlot](b.objs.FlowCache, h, n, b.ncpu)
	if err != nil {
		return fmt.Errorf("read the flow cache: %w", err)
	}
	for j := range int(n) {
		i := uint32(h)*n + uint32(j)
		cpus := all[j*b.ncpu : (j+1)*b.ncpu]
		claimed := false
		for _, s := range cpus {
			if s.State == uint32(bundlerSpillStateSPILL_FREE) {
				continue
			}
			claimed = true
			if s.State == uint32(bundlerSpillStateSPILL_READY) {
				sp.keys = append(sp.keys, s.Key)
				sp.vals = append(sp.vals, bundlerFlowValue(s.Value))
			}
		}
		if claimed {
			sp.cacheSlots = append(sp.cacheSlots, i)
			sp.cacheCPUs = append(sp.cacheCPUs, cpus)
		}
	}
	return nil
}

// cacheReset is what a flow cache slot holds after its drain, on every
// CPU: a flow that counted keeps its slot, zeroed but for its process (as
// a recurring map entry does: a flow whose next interval has only softirq
// events stays named); a slot idle for the interval is freed for another.
func cacheReset(cpus []bundlerSpillSlot) []bundlerSpillSlot {
	next := make([]bundlerSpillSlot, len(cpus))
	for c, s := range cpus {
		if s.State != uint32(bundlerSpillStateSPILL_READY) {
			continue
		}
		if merge(s.Key, []bundlerFlowValue{bundlerFlowValue(s.Value)}).Counts == (Counts{}) {
			continue
		}
		next[c].State, next[c].Key = s.State, s.Key
		next[c].Value.Pid, next[c].Value.Comm, next[c].Value.CgroupId = s.Value.Pid, s.Value.Comm, s.Value.CgroupId
	}
	return next
}
