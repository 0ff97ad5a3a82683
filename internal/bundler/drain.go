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
	first      bool                      // the first interval was collected (salvaged counts were taken)
	paths      map[uint64]string         // unix socket paths by hash
	idle       [2]map[bundlerFlowKey]int // per inner map: drains in a row a flow was idle
	keyBuf     []bundlerFlowKey
	valBuf     []bundlerFlowValue
	lastRead   int // entries the last readAll read
	// What the last committed interval was read into, for the next read
	// (dropped after a burst, so that a hostile interval's size is not kept).
	spareKeys    []bundlerFlowKey
	spareVals    []bundlerFlowValue
	spareEntries []Entry             // the last committed interval's, decoded into again
	claims       *bundlerSpillClaims // spill_claims of the half read (256 KiB, kept)

	// Generations: every drain starts interval gen+1 of this kernel side.
	// A pinned side keeps side, gen and whether the map programs left is
	// still uncommitted in its drain map (see drainRecord), so that a
	// process that adopts it knows which interval a dead one left.
	loaded  bool     // side and gen are known (read from the pin, or new)
	side    [16]byte // random identity of the kernel side
	gen     uint64   // the last interval collected
	pending *pendingDrain
	// salvaged is a replaced side's interval collected and not committed
	// (salvage): Collect returns it, under that side's identity, before
	// any interval of this side, until it is committed.
	salvaged *Interval
}

// pendingDrain is a collected interval not committed yet: programs count
// the next one, its map is read, its spill and cache halves not freed.
type pendingDrain struct {
	gen      uint64
	idx      int  // the flow map that holds it, and the spill and cache half
	quiesced bool // a grace period passed since programs counted it
	// delivered: unpinned, returned by Collect, so never returned again
	delivered bool
	keys      []bundlerFlowKey
	vals      []bundlerFlowValue
	spill     spillRead // the spill half, as read
	entries   []Entry   // keys' entries first, in order, then the spill's own keys
	extra     []Entry   // salvaged counts of a replaced side, reported until committed
}

func (d *drainState) init() {
	d.idle = [2]map[bundlerFlowKey]int{{}, {}}
	d.paths = map[uint64]string{}
}

// Interval is one collected interval of a kernel side.
type Interval struct {
	// Entries last until the next Collect, which may decode into the
	// same memory: copy what is kept.
	Entries   []Entry
	Listeners []Listener
	// Side identifies the kernel side and Gen numbers its intervals:
	// together they name the interval uniquely (BatchID). Gen is 0 when
	// the interval holds no flows because the drain failed (before the
	// switch, or reading: that one is read again next time).
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
		err = b.CommitOf(iv.Side, iv.Gen)
	}
	return iv.Entries, iv.Listeners, err
}

// Collect ends an interval. It first harvests the counters of every live
// socket deptrace tagged into the interval's map, then makes programs
// count the next interval (interval_now: the other flow map, spill half
// and cache half), waits for an RCU grace period, so that no program can
// still be writing to the map read, and reads it with its spill and cache
// halves: no entry and no increment is lost between intervals. Only the
// values the interval counted are read (flow_value.gen); the map is not
// reset, since programs zero a value when they first touch it in a later
// interval. The spill and cache halves are freed, and flows idle for
// retainIdle drains of their map deleted, when the interval is committed.
//
// Without a pin path the interval is committed when Collect returns. A
// pinned side is two-phase: CommitOf(iv.Side, iv.Gen), which the caller
// calls once the interval is stored, frees its halves and records it. Until then, and
// in a process that adopts the side after this one died, Collect returns
// that same interval again (Recovered, same Gen and BatchID) without a
// new one: the kernel keeps counting the next interval meanwhile.
//
// An interval that cannot be read whole is not returned (Gen 0, no
// entries): the next Collect reads it again (Recovered).
//
// A side that replaced an incompatible one (another build) whose process
// died with an interval collected and not committed first returns that
// interval as salvaged, under the replaced side's Side and Gen
// (Recovered), until it is committed: stored before, a store ignores it.
//
// Crash points of a pinned side, and what the next process does (the
// drain record and interval_now together say where it stopped):
//   - before the drain record says interval g is pending: nothing
//     happened; g is collected normally.
//   - after that, before programs count g+1: the adopting process makes
//     them, and collects g whole.
//   - after that, before or after the grace period or the read, before
//     the caller stored it: the adopting process waits for a grace period
//     and collects g whole, under the same BatchID.
//   - after the caller stored it, before the drain record says committed
//     (halves freed or not): g is collected again under the same BatchID,
//     which a store that applies each batch id once ignores.
func (b *Bundler) Collect() (Interval, error) {
	if err := b.loadDrainState(); err != nil {
		return Interval{}, err
	}
	if s := b.drain.salvaged; s != nil {
		// Meanwhile this side counts on: its first interval comes next.
		return *s, nil
	}
	if p := b.drain.pending; p != nil {
		if !p.delivered {
			entries, err := b.readPending(p)
			if err != nil {
				return Interval{Side: b.drain.side}, err
			}
			iv := Interval{Entries: withSalvaged(p.extra, entries), Side: b.drain.side, Gen: p.gen, Recovered: true}
			return iv, b.commitUnpinned(p)
		}
		// Unpinned, returned, its commit failed: only the commit again
		// (nothing would tell a second copy from the first).
		if err := b.Commit(p.gen); err != nil {
			return Interval{Side: b.drain.side}, err
		}
	}
	listeners, harvestErr := b.harvest()
	gen := b.drain.gen + 1
	if b.pinned {
		if err := b.writeDrainRecord(gen, true); err != nil {
			return Interval{Listeners: listeners}, errors.Join(harvestErr, err)
		}
	}
	if err := b.setInterval(gen + 1); err != nil {
		if b.pinned {
			_ = b.writeDrainRecord(b.drain.gen, false) // best effort: nothing was switched
		}
		return Interval{Listeners: listeners}, errors.Join(harvestErr, err)
	}
	b.active = int((gen + 1) & 1)
	b.drain.gen = gen
	var extra []Entry
	if !b.drain.first {
		// The first interval also reports the counts salvaged from a
		// replaced kernel side.
		extra = b.adopt.Salvaged
		b.drain.first = true
	}
	p := &pendingDrain{gen: gen, idx: int(gen & 1), extra: extra}
	b.drain.pending = p
	iv := Interval{Listeners: listeners, Side: b.drain.side, Gen: gen}
	entries, err := b.readPending(p)
	if err != nil {
		// Not read whole: withheld, and read again by the next Collect.
		// Stored in part under its batch id, the rest would be lost to a
		// store that ignores the id when the whole comes; and a value
		// not read now would be zeroed in its map's next interval.
		iv.Gen = 0
		return iv, errors.Join(harvestErr, err)
	}
	iv.Entries = withSalvaged(extra, entries)
	return iv, errors.Join(harvestErr, b.commitUnpinned(p))
}

// commitUnpinned commits an unpinned side's interval once it is returned:
// nothing keeps it for a later Commit.
func (b *Bundler) commitUnpinned(p *pendingDrain) error {
	if b.pinned {
		return nil
	}
	p.delivered = true
	return b.Commit(p.gen)
}

// withSalvaged is an interval's entries after the salvaged ones: entries
// itself when there are none (the pending interval keeps it too, read
// only).
func withSalvaged(extra, entries []Entry) []Entry {
	if len(extra) == 0 {
		return entries
	}
	return append(append([]Entry(nil), extra...), entries...)
}

// Commit declares interval gen of this kernel side stored: flows idle for
// retainIdle drains of its map are deleted, its spill and cache halves
// freed, and the pinned drain record records it. Committing an interval
// committed already does nothing.
func (b *Bundler) Commit(gen uint64) error { return b.CommitOf(b.drain.side, gen) }

// CommitOf commits the interval Collect returned as side and gen: one of
// this side (Commit), or the salvaged interval of the side it replaced,
// whose generations are numbered apart (the two may be equal).
func (b *Bundler) CommitOf(side [16]byte, gen uint64) error {
	if s := b.drain.salvaged; s != nil && side == s.Side {
		if gen == s.Gen {
			b.drain.salvaged = nil // nothing of it is left in the kernel: the replaced side is gone
		}
		return nil
	}
	if side != b.drain.side {
		return nil
	}
	p := b.drain.pending
	if p == nil || p.gen != gen || gen == 0 {
		return nil
	}
	if testHooks.failCommits > 0 {
		testHooks.failCommits--
		return errors.New("commit failed (test hook)")
	}
	if err := b.deleteIdle(b.inner[p.idx], p.idx, p.keys, p.entries); err != nil {
		return err
	}
	if err := b.freeSpill(p.idx, p.spill); err != nil {
		return err
	}
	if b.pinned {
		if err := b.writeDrainRecord(gen, false); err != nil {
			return err
		}
	}
	b.drain.pending = nil
	if cap(p.keys) <= 2*len(p.keys)+1024 {
		b.drain.spareKeys, b.drain.spareVals = p.keys[:0], p.vals[:0]
	}
	if cap(p.entries) <= 2*len(p.entries)+1024 {
		b.drain.spareEntries = p.entries[:0]
	}
	return nil
}

// readPending reads the map and spill half holding a pending interval,
// after a grace period if none has passed since programs left it, keeping
// what the commit needs.
func (b *Bundler) readPending(p *pendingDrain) ([]Entry, error) {
	if !p.quiesced {
		if err := b.quiesce(p.idx); err != nil {
			return nil, err
		}
		p.quiesced = true
	}
	keys, vals, err := b.readAll(b.inner[p.idx])
	b.onlyInterval(vals, p.gen)
	p.keys, p.vals = keys, vals
	sp, spillErr := b.readSpill(p.idx)
	p.spill = sp
	p.entries = b.decode(keys, vals, sp)
	if err != nil {
		return p.entries, fmt.Errorf("drain bundled flows: %w", err)
	}
	return p.entries, spillErr
}

// quiesce returns once no program can still be writing to flow map idx
// (and its spill and cache halves), which they no longer choose: putting
// the map in its own slot again waits for an RCU grace period, as every
// update of a map-in-map slot does.
func (b *Bundler) quiesce(idx int) error {
	if err := b.flows.Put(uint32(idx), b.inner[idx]); err != nil {
		return fmt.Errorf("wait for programs to leave the bundled-flow map: %w", err)
	}
	return nil
}

// onlyInterval leaves of the flow map values read only what interval gen
// counted: a value last counted in an older interval (this map's
// previous one) was read then; what the process it names is still kept.
func (b *Bundler) onlyInterval(vals []bundlerFlowValue, gen uint64) {
	for i := range vals {
		if v := &vals[i]; v.Gen != gen {
			*v = bundlerFlowValue{Pid: v.Pid, Comm: v.Comm, CgroupId: v.CgroupId}
		}
	}
}

// deleteIdle deletes the flows of map idx that were idle for retainIdle
// drains of it in a row. Bundled flows recur every interval: an entry kept
// lets the next interval's events find it instead of inserting (an insert
// costs microseconds when the kernel's allocator refills, a lookup tens of
// nanoseconds), and programs zero its values when they first touch it.
// Entries not read (a failed read) are kept.
func (b *Bundler) deleteIdle(m *ebpf.Map, idx int, keys []bundlerFlowKey, read []Entry) error {
	idle := b.drain.idle[idx]
	var delKeys []bundlerFlowKey
	for i, k := range keys {
		if read[i].Counts != (Counts{}) {
			delete(idle, k)
			continue
		}
		if idle[k]++; idle[k] >= retainIdle {
			delete(idle, k)
			delKeys = append(delKeys, k)
		}
	}
	if len(delKeys) > 0 {
		if _, err := m.BatchDelete(delKeys, nil); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete idle flows: %w", err)
		}
	}
	return nil
}
