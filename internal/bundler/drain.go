package bundler

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/cilium/ebpf"
)

// retainIdle is how many drains of one map in a row a flow may be idle in
// before its entry is deleted.
const retainIdle = 2

type drainState struct {
	// harvestGen numbers harvests for the kernel side's per-port queue
	// figure; it starts at random, so that a process adopting a pinned side
	// does not repeat the previous process's numbers.
	harvestGen uint32
	first      bool                      // the first swap happened (salvaged counts were taken)
	paths      map[uint64]string         // unix socket paths by hash
	idle       [2]map[bundlerFlowKey]int // per inner map: drains in a row a flow was idle
	keyBuf     []bundlerFlowKey
	valBuf     []bundlerFlowValue
	// The reset's keys and zeroed values, reused: BatchUpdate copies
	// them, and fresh ones every interval were a large allocation each.
	zeroKeys []bundlerFlowKey
	zeroVals []bundlerFlowValue
	lastRead int                 // entries the last readAll read
	claims   *bundlerSpillClaims // spill_claims of the half read (256 KiB, kept)

	// Generations: every swap starts interval gen+1 of this kernel side.
	// A pinned side keeps side, gen and whether the swapped-out map is
	// still uncommitted in its drain map (see drainRecord), so that a
	// process that adopts it knows which interval a dead one left.
	loaded  bool     // side and gen are known (read from the pin, or new)
	side    [16]byte // random identity of the kernel side
	gen     uint64   // the last interval collected
	pending *pendingDrain
}

// pendingDrain is a collected interval not committed yet: the inner map
// it was swapped out of is read but not reset.
type pendingDrain struct {
	gen     uint64
	idx     int // the inner map that holds it, and the spill half
	keys    []bundlerFlowKey
	vals    []bundlerFlowValue
	spill   spillRead // the spill half, as read
	entries []Entry   // keys' entries first, in order, then the spill's own keys
	extra   []Entry   // salvaged counts of a replaced side, reported until committed
}

func (d *drainState) init() {
	d.idle = [2]map[bundlerFlowKey]int{{}, {}}
	d.paths = map[uint64]string{}
}

// Interval is one collected interval of a kernel side.
type Interval struct {
	Entries   []Entry
	Listeners []Listener
	// Side identifies the kernel side and Gen numbers its intervals:
	// together they name the interval uniquely (BatchID). Gen is 0 when
	// the interval holds no flows because the drain failed (before the
	// swap, or reading a pinned side: that one is read again next time).
	Side [16]byte
	Gen  uint64
	// Recovered: the interval was collected before (by this process, or
	// by one that died) and not committed; this is the same interval again.
	Recovered bool
}

// BatchID names the interval across processes: the same interval
// collected again after a crash has the same id. "" when Gen is 0.
func (iv Interval) BatchID() string {
	if iv.Gen == 0 {
		return ""
	}
	return hex.EncodeToString(iv.Side[:]) + "-" + strconv.FormatUint(iv.Gen, 10)
}

// Drain ends an interval and commits it at once: Collect then Commit,
// for callers that keep nothing (and unpinned sides, where Collect has
// committed already).
func (b *Bundler) Drain() ([]Entry, []Listener, error) {
	iv, err := b.Collect()
	if err == nil {
		err = b.Commit(iv.Gen)
	}
	return iv.Entries, iv.Listeners, err
}

// Collect ends an interval. It first harvests the counters of every live
// socket deptrace tagged into the active map, then swaps in the idle map
// and reads the one programs wrote to until now. The swap returns only
// after an RCU grace period, so no program can still be writing to the
// map read: no entry and no increment is lost between intervals. The
// spill (new flows whose insert into the map failed) has a half per map:
// Collect makes programs write the next half before the swap, so the
// grace period quiesces the old half too, and reads it with the old map,
// each spilled flow summed into the map's entry of its key. The old half
// is freed where the map is reset.
//
// Without a pin path the map read is reset at once: the interval is
// committed when Collect returns. A pinned side is two-phase: the map read
// is reset only by Commit(iv.Gen), which the caller calls once the
// interval is stored. Until then, and in a process that adopts the side
// after this one died, Collect returns that same interval again
// (Recovered, same Gen and BatchID) without swapping: the kernel keeps
// counting into the active map meanwhile.
//
// A pinned interval that cannot be read whole is not returned (Gen 0, no
// entries): the next Collect reads it again. An unpinned one returns what
// was read, reset.
//
// Crash points of a pinned side, and what the next process does:
//   - before the drain map records generation g as pending: nothing
//     happened; g is collected normally.
//   - after that, before the swap: g is recovered from the idle map, which
//     the last commit reset (an empty interval); the counts are still in
//     the active map and come with g+1.
//   - after the swap, before or after reading, before the caller stored
//     it: g is recovered in full, under the same BatchID.
//   - after the caller stored it, before or during the reset: g is
//     recovered under the same BatchID (in full, or partly reset), which a
//     store that applies each batch id once ignores.
//   - after the reset (of the map, then of the spill and cache slots),
//     before the drain map records the commit: g is recovered empty, or
//     with the slots not yet reset, under the same BatchID.
func (b *Bundler) Collect() (Interval, error) {
	if err := b.loadDrainState(); err != nil {
		return Interval{}, err
	}
	if p := b.drain.pending; p != nil {
		entries, err := b.readPending(p)
		if err != nil {
			return Interval{Side: b.drain.side}, err
		}
		return Interval{Entries: append(append([]Entry(nil), p.extra...), entries...), Side: b.drain.side, Gen: p.gen, Recovered: true}, nil
	}
	listeners, harvestErr := b.harvest()
	gen := b.drain.gen + 1
	if b.pinned {
		if err := b.writeDrainRecord(gen, true); err != nil {
			return Interval{Listeners: listeners}, errors.Join(harvestErr, err)
		}
	}
	next := 1 - b.active
	if err := b.setSpillHalf(next); err != nil {
		if b.pinned {
			_ = b.writeDrainRecord(b.drain.gen, false) // best effort: nothing was swapped
		}
		return Interval{Listeners: listeners}, errors.Join(harvestErr, err)
	}
	if err := b.flows.Put(uint32(0), b.inner[next]); err != nil {
		if b.pinned {
			_ = b.writeDrainRecord(b.drain.gen, false) // best effort: nothing was swapped
		}
		return Interval{Listeners: listeners}, errors.Join(harvestErr, fmt.Errorf("swap bundled-flow map: %w", err))
	}
	old := b.active
	b.active = next
	b.drain.gen = gen
	var extra []Entry
	if !b.drain.first {
		// The first interval also reports the counts salvaged from a
		// replaced kernel side.
		extra = b.adopt.Salvaged
		b.drain.first = true
	}
	iv := Interval{Listeners: listeners, Side: b.drain.side, Gen: gen}
	if !b.pinned {
		entries, err := b.drainMap(b.inner[old], old)
		iv.Entries = append(extra, entries...)
		return iv, errors.Join(harvestErr, err)
	}
	p := &pendingDrain{gen: gen, idx: old, extra: extra}
	b.drain.pending = p
	entries, err := b.readPending(p)
	if err != nil {
		// Not read whole: withheld, and read again by the next Collect.
		// Stored in part under its batch id, the rest would be lost to a
		// store that ignores the id when the whole comes.
		iv.Gen = 0
		return iv, errors.Join(harvestErr, err)
	}
	iv.Entries = append(append([]Entry(nil), extra...), entries...)
	return iv, harvestErr
}

// Commit declares interval gen stored: the map it was read from is reset
// (recurring entries zeroed, idle ones deleted), so is its spill half
// (slots freed), and the pinned drain map records it. Committing an
// interval committed already, or one of an unpinned side, does nothing.
func (b *Bundler) Commit(gen uint64) error {
	p := b.drain.pending
	if p == nil || p.gen != gen || gen == 0 {
		return nil
	}
	if err := b.reset(b.inner[p.idx], p.idx, p.keys, p.vals, p.entries); err != nil {
		return err
	}
	if err := b.freeSpill(p.idx, p.spill); err != nil {
		return err
	}
	if err := b.writeDrainRecord(gen, false); err != nil {
		return err
	}
	b.drain.pending = nil
	return nil
}

// readPending reads the map and spill half holding a pending interval,
// keeping what the reset needs.
func (b *Bundler) readPending(p *pendingDrain) ([]Entry, error) {
	keys, vals, err := b.readAll(b.inner[p.idx])
	p.keys, p.vals = keys, vals
	sp, spillErr := b.readSpill(p.idx)
	p.spill = sp
	p.entries = b.decode(keys, vals, sp)
	if err != nil {
		return p.entries, fmt.Errorf("drain bundled flows: %w", err)
	}
	return p.entries, spillErr
}

// drainMap reads every entry of m and its spill half and resets both at
// once (unpinned sides).
func (b *Bundler) drainMap(m *ebpf.Map, idx int) ([]Entry, error) {
	keys, vals, err := b.readAll(m)
	sp, spillErr := b.readSpill(idx)
	out := b.decode(keys, vals, sp)
	if err != nil {
		err = fmt.Errorf("drain bundled flows: %w", err)
	}
	// What was read is returned, so it is reset even when a read failed
	// part-way: entries and slots not read keep their counts for later.
	return out, errors.Join(err, spillErr, b.reset(m, idx, keys, vals, out), b.freeSpill(idx, sp))
}

// reset keeps the recurring entries of m that were read, zeroed.
// Bundled flows recur every interval: an entry kept lets the next
// interval's events find it instead of inserting (an insert costs
// microseconds when the kernel's allocator refills, a lookup tens of
// nanoseconds). A flow idle for retainIdle drains of this map in a row is
// deleted. Entries not read (a failed read) keep their counts for a later
// interval.
func (b *Bundler) reset(m *ebpf.Map, idx int, keys []bundlerFlowKey, vals []bundlerFlowValue, read []Entry) error {
	idle := b.drain.idle[idx]
	var delKeys []bundlerFlowKey
	zeroKeys, zeroVals := b.drain.zeroKeys[:0], b.drain.zeroVals[:0]
	defer func() {
		if cap(zeroKeys) > 2*len(zeroKeys)+1024 {
			zeroKeys, zeroVals = nil, nil // a burst passed: do not keep its size
		}
		b.drain.zeroKeys, b.drain.zeroVals = zeroKeys[:0], zeroVals[:0]
	}()
	for i, k := range keys {
		if read[i].Counts == (Counts{}) {
			if idle[k]++; idle[k] >= retainIdle {
				delete(idle, k)
				delKeys = append(delKeys, k)
				continue
			}
		} else {
			delete(idle, k)
		}
		zeroKeys = append(zeroKeys, k)
		for _, v := range vals[i*b.ncpu : (i+1)*b.ncpu] {
			// Keep the process: a flow whose next interval has only
			// softirq events stays named.
			zeroVals = append(zeroVals, bundlerFlowValue{Pid: v.Pid, Comm: v.Comm, CgroupId: v.CgroupId})
		}
	}
	if len(zeroKeys) > 0 {
		if _, err := m.BatchUpdate(zeroKeys, zeroVals, nil); err != nil {
			return fmt.Errorf("reset bundled flows: %w", err)
		}
	}
	if len(delKeys) > 0 {
		if _, err := m.BatchDelete(delKeys, nil); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete idle flows: %w", err)
		}
	}
	return nil
}
