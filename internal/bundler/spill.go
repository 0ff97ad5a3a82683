// The spill: flows whose insert into the flow map failed, in one half per
// flow map, read with that map and freed at the interval's commit.

package bundler

import "fmt"

// setSpillOnly applies testHooks.spill to the object before load.
func setSpillOnly(specs *bundlerSpecs) error {
	if !testHooks.spill {
		return nil
	}
	if err := specs.SpillOnly.Set(uint32(1)); err != nil {
		return fmt.Errorf("set spill_only: %w", err)
	}
	return nil
}

// spillRead is what a spill half and the same half of every CPU's flow
// cache held: the claimed slots, and the key and value of every one that
// was ready.
type spillRead struct {
	used       uint64 // spill slots claimed, as the kernel side counted them
	complete   bool   // every slot of the spill half was read
	slots      []uint32
	cacheSlots []uint32             // flow cache slots claimed on at least one CPU
	cacheCPUs  [][]bundlerSpillSlot // each one's slot on every CPU, as read
	keys       []bundlerFlowKey
	vals       []bundlerFlowValue
}

// spillSlots is the slots of one spill half.
func (b *Bundler) spillSlots() uint32 { return b.objs.Spill.MaxEntries() / 2 }

// setInterval makes programs count interval n from now on: into flow map,
// spill half and cache half n & 1, with values tagged n.
func (b *Bundler) setInterval(n uint64) error {
	if err := b.objs.IntervalNow.Put(uint32(0), n); err != nil {
		return fmt.Errorf("make programs count interval %d: %w", n, err)
	}
	return nil
}

// intervalNow is the interval programs count.
func (b *Bundler) intervalNow() (uint64, error) {
	var n uint64
	if err := b.objs.IntervalNow.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read the interval programs count: %w", err)
	}
	return n, nil
}

// readSpill reads spill half h, which no program writes any more (see
// Collect). A half no slot of which was claimed is not read.
func (b *Bundler) readSpill(h int) (spillRead, error) {
	var sp spillRead
	if err := b.readCache(h, &sp); err != nil {
		return sp, err
	}
	if err := b.objs.SpillUsed.Lookup(uint32(h), &sp.used); err != nil {
		return sp, fmt.Errorf("read the flow spill's use: %w", err)
	}
	if sp.used == 0 {
		sp.complete = true
		return sp, nil
	}
	n := b.spillSlots()
	if sp.used <= uint64(n)/claimedShare {
		if ok, err := b.readClaimed(h, n, &sp); ok || err != nil {
			return sp, err
		}
		// The list cannot be trusted (nothing was taken from it): the
		// whole half.
	}
	slots, err := readHalf[bundlerSpillSlot](b.objs.Spill, h, n, 1)
	if err != nil {
		return sp, fmt.Errorf("read the flow spill: %w", err)
	}
	for j, s := range slots {
		sp.add(uint32(h)*n+uint32(j), &s)
	}
	sp.complete = true
	return sp, nil
}

// claimedShare: up to 1/claimedShare of a half claimed, the drain looks up
// the claimed slots alone (a system call each, about 1.3 us) rather than
// reading the whole half in batches (about 0.35 us a slot, the half before
// it too for half 1: 2.8 and 4.7 ms for 8,192 slots; go test -run '^$'
// -bench SpillRead ./internal/bundler).
const claimedShare = 4

// readClaimed reads the slots of half h that spill_claims lists; false
// (and nothing read) when the list cannot be trusted, for the caller to
// read the whole half: a claim outside the half, or one listed twice (a
// read that failed part-way freed some slots but left the count, and
// programs claimed some of them again after it).
func (b *Bundler) readClaimed(h int, n uint32, sp *spillRead) (bool, error) {
	if b.drain.claims == nil {
		b.drain.claims = new(bundlerSpillClaims)
	}
	if err := b.objs.SpillClaims.Lookup(uint32(h), b.drain.claims); err != nil {
		return false, fmt.Errorf("read the flow spill's claims: %w", err)
	}
	claims := b.drain.claims.Slot[:sp.used]
	seen := make(map[uint32]bool, len(claims))
	for _, i := range claims {
		if i/n != uint32(h) || seen[i] {
			return false, nil
		}
		seen[i] = true
	}
	var s bundlerSpillSlot
	for _, i := range claims {
		if err := b.objs.Spill.Lookup(i, &s); err != nil {
			return true, fmt.Errorf("read the flow spill: slot %d: %w", i, err)
		}
		sp.add(i, &s)
	}
	sp.complete = true
	return true, nil
}

// add takes spill slot i as read: claimed, and if ready its flow.
func (sp *spillRead) add(i uint32, s *bundlerSpillSlot) {
	if s.State == uint32(bundlerSpillStateSPILL_FREE) {
		return // a claim a killed process read and freed (see freeSpill)
	}
	sp.slots = append(sp.slots, i)
	if s.State == uint32(bundlerSpillStateSPILL_READY) {
		sp.keys = append(sp.keys, s.Key)
		sp.vals = append(sp.vals, bundlerFlowValue(s.Value))
	}
}

// freeSpill frees the slots of spill half h that sp read, then, if it
// read them all, the half's use count: a process killed in between leaves
// a count and no slot, which costs the next drain of the half one
// needless read.
func (b *Bundler) freeSpill(h int, sp spillRead) error {
	if len(sp.cacheSlots) > 0 {
		next := make([]bundlerSpillSlot, 0, len(sp.cacheSlots)*b.ncpu)
		for _, cpus := range sp.cacheCPUs {
			next = append(next, cacheReset(cpus)...)
		}
		if err := writeSlots(b.objs.FlowCache, sp.cacheSlots, next, b.ncpu); err != nil {
			return fmt.Errorf("free the flow cache: %w", err)
		}
	}
	if len(sp.slots) > 0 {
		zero := make([]bundlerSpillSlot, len(sp.slots))
		if err := writeSlots(b.objs.Spill, sp.slots, zero, 1); err != nil {
			return fmt.Errorf("free the flow spill: %w", err)
		}
	}
	if sp.used == 0 || !sp.complete {
		return nil
	}
	if err := b.objs.SpillUsed.Put(uint32(h), uint64(0)); err != nil {
		return fmt.Errorf("reset the flow spill's use: %w", err)
	}
	return nil
}
