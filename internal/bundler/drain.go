package bundler

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/deptrace/deptrace/internal/netns"
	"golang.org/x/sys/unix"
)

// Counts are one flow's counters, CPUs summed (see struct flow_value).
type Counts struct {
	Connections       uint64
	FailedConnections uint64
	FailedRefused     uint64
	FailedTimeout     uint64
	FailedReset       uint64
	FailedUnreachable uint64
	BytesSent         uint64
	BytesReceived     uint64
	DatagramsSent     uint64
	DatagramsReceived uint64
	LatencyCount      uint64
	LatencySumUs      uint64
	LatencyMaxUs      uint64
	ResetsSent        uint64
	ResetsReceived    uint64
	Retransmits       uint64
}

// Entry is one bundled flow drained from the kernel.
type Entry struct {
	NetNS         uint32
	Proto         uint8
	Direction     uint8
	Port          uint16
	Local, Remote netip.Addr // IPv4 unmapped
	Counts
	FirstSeenBootNs uint64 // CLOCK_BOOTTIME
	LastSeenBootNs  uint64
	PID             uint32
	Comm            string
	CgroupID        uint64
	// Unix flows: the server's socket path ("@name" for an abstract one)
	// and the process at the other end, when known.
	Path     string
	PeerPID  uint32
	PeerComm string
}

// ProtoUnix is Entry.Proto of unix-domain flows.
const ProtoUnix = uint8(bundlerFlowProtoPROTO_UNIX)

// Listener is one listening TCP socket as the harvest saw it.
type Listener struct {
	NetNS        uint32
	Port         uint16
	Local        netip.Addr
	BacklogLimit uint32
	Queue        uint32 // accept queue at the harvest
	QueueMax     uint32 // deepest accept queue seen since the previous harvest (per port)
	Drops        uint64 // since the previous harvest
	PID          uint32
	Comm         string
}

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
			b.writeDrainRecord(b.drain.gen, false) // best effort: nothing was swapped
		}
		return Interval{Listeners: listeners}, errors.Join(harvestErr, err)
	}
	if err := b.flows.Put(uint32(0), b.inner[next]); err != nil {
		if b.pinned {
			b.writeDrainRecord(b.drain.gen, false) // best effort: nothing was swapped
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

// harvest runs the socket-storage iterator: it folds live sockets' counter
// growth into the active flow map and reports every listener.
func (b *Bundler) harvest() ([]Listener, error) {
	if b.drain.harvestGen == 0 {
		b.drain.harvestGen = rand.Uint32()
	}
	b.drain.harvestGen++
	if err := b.shared.Variables["harvest_gen"].Set(b.drain.harvestGen); err != nil {
		return nil, fmt.Errorf("set harvest_gen: %w", err)
	}
	var recs []bundlerListenerRecord
	if it, ok := b.iters["harvest"]; ok {
		var err error
		recs, err = readIter[bundlerListenerRecord](it)
		if err != nil {
			return nil, fmt.Errorf("harvest live sockets: %w", err)
		}
	} else if _, ok := b.iters["harvest_tcp"]; ok {
		var err error
		recs, err = b.harvestTables()
		if err != nil {
			return decodeListeners(recs), err
		}
	} else {
		return nil, errors.New("harvest iterator is not attached")
	}
	return decodeListeners(recs), nil
}

func decodeListeners(recs []bundlerListenerRecord) []Listener {
	out := make([]Listener, len(recs))
	for i, r := range recs {
		out[i] = Listener{NetNS: r.Netns, Port: r.Port, Local: netip.AddrFrom16(r.LocalAddr).Unmap(),
			BacklogLimit: r.BacklogLimit, Queue: r.Queue, QueueMax: r.QueueMax, Drops: r.Drops, PID: r.Pid, Comm: commString(r.Comm)}
	}
	return out
}

// harvestTables is the harvest where the socket-storage iterator is unsafe
// (storageIterUnsafe): the TCP and UDP socket iterators, in every watched
// namespace, each a walk of that namespace's socket tables. A namespace
// that no process or bind mount holds any more has no sockets left to
// harvest, and one that vanishes while being entered is skipped.
func (b *Bundler) harvestTables() ([]bundlerListenerRecord, error) {
	namespaces, err := netns.List()
	if err != nil {
		return nil, fmt.Errorf("harvest: list namespaces: %w", err)
	}
	var recs []bundlerListenerRecord
	var errs []error
	for _, ns := range namespaces {
		if b.cfg.NetNS != 0 && ns.Inode != b.cfg.NetNS {
			continue
		}
		err := netns.Do(ns.Path, func() error {
			r, err := readIter[bundlerListenerRecord](b.iters["harvest_tcp"])
			recs = append(recs, r...)
			if it, ok := b.iters["harvest_udp"]; ok && err == nil {
				_, err = readIter[byte](it)
			}
			return err
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("harvest netns %d: %w", ns.Inode, err))
		}
	}
	return recs, errors.Join(errs...)
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

// decode turns raw entries into Entries: the map's, in order, each with
// the spilled values of its key summed in, then the keys only the spill
// holds (one entry per key, however many slots it took).
func (b *Bundler) decode(keys []bundlerFlowKey, vals []bundlerFlowValue, sp spillRead) []Entry {
	spilled := make(map[bundlerFlowKey][]bundlerFlowValue, len(sp.keys))
	var spillOnly []bundlerFlowKey
	for i, k := range sp.keys {
		if _, ok := spilled[k]; !ok {
			spillOnly = append(spillOnly, k)
		}
		spilled[k] = append(spilled[k], sp.vals[i])
	}
	out := make([]Entry, 0, len(keys)+len(spillOnly))
	for i, k := range keys {
		cpus := vals[i*b.ncpu : (i+1)*b.ncpu]
		if s, ok := spilled[k]; ok {
			cpus = append(append([]bundlerFlowValue(nil), cpus...), s...)
			delete(spilled, k)
		}
		out = append(out, b.entry(k, cpus))
	}
	for _, k := range spillOnly {
		if s, ok := spilled[k]; ok {
			out = append(out, b.entry(k, s))
		}
	}
	return out
}

// entry is one flow's Entry from its values (CPUs and spill slots).
func (b *Bundler) entry(k bundlerFlowKey, vals []bundlerFlowValue) Entry {
	e := merge(k, vals)
	if k.Proto == ProtoUnix {
		e.Path = b.unixPath(binary.NativeEndian.Uint64(k.RemoteAddr[:8]))
		e.Local, e.Remote = netip.Addr{}, netip.Addr{}
	}
	return e
}

// setSpillOnly applies testHooks.spill to spec.
func setSpillOnly(spec *ebpf.CollectionSpec) error {
	if !testHooks.spill {
		return nil
	}
	if err := spec.Variables["spill_only"].Set(uint32(1)); err != nil {
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
func (b *Bundler) spillSlots() uint32 { return b.shared.Maps["spill"].MaxEntries() / 2 }

// setSpillHalf makes programs spill into half h from now on.
func (b *Bundler) setSpillHalf(h int) error {
	if err := b.shared.Maps["spill_half"].Put(uint32(0), uint32(h)); err != nil {
		return fmt.Errorf("switch the flow spill to half %d: %w", h, err)
	}
	return nil
}

// readSpill reads spill half h, which no program writes any more (see
// Collect). A half no slot of which was claimed is not read.
func (b *Bundler) readSpill(h int) (spillRead, error) {
	var sp spillRead
	if err := b.readCache(h, &sp); err != nil {
		return sp, err
	}
	if err := b.shared.Maps["spill_used"].Lookup(uint32(h), &sp.used); err != nil {
		return sp, fmt.Errorf("read the flow spill's use: %w", err)
	}
	if sp.used == 0 {
		sp.complete = true
		return sp, nil
	}
	n := b.spillSlots()
	slots, err := readHalf[bundlerSpillSlot](b.shared.Maps["spill"], h, n, 1)
	if err != nil {
		return sp, fmt.Errorf("read the flow spill: %w", err)
	}
	for j, s := range slots {
		i := uint32(h)*n + uint32(j)
		if s.State == uint32(bundlerSpillStateSPILL_FREE) {
			continue
		}
		sp.slots = append(sp.slots, i)
		if s.State == uint32(bundlerSpillStateSPILL_READY) {
			sp.keys = append(sp.keys, s.Key)
			sp.vals = append(sp.vals, bundlerFlowValue(s.Value))
		}
	}
	sp.complete = true
	return sp, nil
}

// errnoENOTSUPP is the kernel's own "not supported" (524), which it returns
// for a batch operation a map type lacks; user-space headers do not name it.
const errnoENOTSUPP = unix.Errno(524)

// batchUnsupported reports an error of a batch operation the kernel does
// not have for this map type.
func batchUnsupported(err error) bool {
	return errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, errnoENOTSUPP) || errors.Is(err, unix.EOPNOTSUPP)
}

// readHalf reads half h of an array map of 2n slots, perSlot values each
// (the CPUs of a per-CPU array): one batch lookup where a lookup per slot
// took n system calls, or a lookup per slot where the kernel has no batch
// for the map's type.
func readHalf[V any](m *ebpf.Map, h int, n uint32, perSlot int) ([]V, error) {
	if !testHooks.noArrayBatch {
		vals, err := readHalfBatch[V](m, h, n, perSlot)
		if !batchUnsupported(err) {
			return vals, err
		}
	}
	vals := make([]V, int(n)*perSlot)
	var cpus []V
	for j := range int(n) {
		i := uint32(h)*n + uint32(j)
		var err error
		if perSlot == 1 {
			err = m.Lookup(i, &vals[j])
		} else if err = m.Lookup(i, &cpus); err == nil {
			copy(vals[j*perSlot:(j+1)*perSlot], cpus)
		}
		if err != nil {
			return nil, fmt.Errorf("slot %d: %w", i, err)
		}
	}
	return vals, nil
}

func readHalfBatch[V any](m *ebpf.Map, h int, n uint32, perSlot int) ([]V, error) {
	keys := make([]uint32, n)
	vals := make([]V, int(n)*perSlot)
	var cursor ebpf.MapBatchCursor
	// A batch cursor starts at slot 0: half 1 takes a second batch.
	for range h + 1 {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, err
		}
		if got != int(n) {
			return nil, fmt.Errorf("batch lookup of half %d returned %d slots, want %d", h, got, n)
		}
	}
	if keys[0] != uint32(h)*n {
		return nil, fmt.Errorf("batch lookup of half %d started at slot %d, want %d", h, keys[0], uint32(h)*n)
	}
	return vals, nil
}

// writeSlots writes vals (perSlot values each) to the slots keys of an
// array map: one batch update, or an update per slot where the kernel has
// no batch for the map's type.
func writeSlots[V any](m *ebpf.Map, keys []uint32, vals []V, perSlot int) error {
	if !testHooks.noArrayBatch {
		_, err := m.BatchUpdate(keys, vals, nil)
		if !batchUnsupported(err) {
			return err
		}
	}
	for j, k := range keys {
		var err error
		if perSlot == 1 {
			err = m.Update(k, vals[j], ebpf.UpdateExist)
		} else {
			err = m.Update(k, vals[j*perSlot:(j+1)*perSlot], ebpf.UpdateExist)
		}
		if err != nil {
			return fmt.Errorf("slot %d: %w", k, err)
		}
	}
	return nil
}

// cacheSlots is the slots of one half of a CPU's flow cache.
func (b *Bundler) cacheSlots() uint32 { return b.shared.Maps["flow_cache"].MaxEntries() / 2 }

// readCache adds to sp the flows in half h of every CPU's flow cache,
// which no program writes any more (see Collect), and the slots to free.
func (b *Bundler) readCache(h int, sp *spillRead) error {
	n := b.cacheSlots()
	all, err := readHalf[bundlerSpillSlot](b.shared.Maps["flow_cache"], h, n, b.ncpu)
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

// freeSpill frees the slots of spill half h that sp read, then, if it
// read them all, the half's use count: a process killed in between leaves
// a count and no slot, which costs the next drain of the half one
// needless read. (An unpinned side frees what a failed read got, as it
// resets what it read of the map; the rest stays counted as used and is
// read with the half's next drain.)
func (b *Bundler) freeSpill(h int, sp spillRead) error {
	if len(sp.cacheSlots) > 0 {
		next := make([]bundlerSpillSlot, 0, len(sp.cacheSlots)*b.ncpu)
		for _, cpus := range sp.cacheCPUs {
			next = append(next, cacheReset(cpus)...)
		}
		if err := writeSlots(b.shared.Maps["flow_cache"], sp.cacheSlots, next, b.ncpu); err != nil {
			return fmt.Errorf("free the flow cache: %w", err)
		}
	}
	if len(sp.slots) > 0 {
		zero := make([]bundlerSpillSlot, len(sp.slots))
		if err := writeSlots(b.shared.Maps["spill"], sp.slots, zero, 1); err != nil {
			return fmt.Errorf("free the flow spill: %w", err)
		}
	}
	if sp.used == 0 || !sp.complete {
		return nil
	}
	if err := b.shared.Maps["spill_used"].Put(uint32(h), uint64(0)); err != nil {
		return fmt.Errorf("reset the flow spill's use: %w", err)
	}
	return nil
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
	var zeroKeys, delKeys []bundlerFlowKey
	var zeroVals []bundlerFlowValue
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

// readAll reads every entry of m with batch lookups.
func (b *Bundler) readAll(m *ebpf.Map) ([]bundlerFlowKey, []bundlerFlowValue, error) {
	batch := 1024
	var keys []bundlerFlowKey
	var vals []bundlerFlowValue
	var cursor ebpf.MapBatchCursor
	for {
		if len(b.drain.keyBuf) < batch {
			b.drain.keyBuf = make([]bundlerFlowKey, batch)
			b.drain.valBuf = make([]bundlerFlowValue, batch*b.ncpu)
		}
		n, err := m.BatchLookup(&cursor, b.drain.keyBuf[:batch], b.drain.valBuf[:batch*b.ncpu], nil)
		keys = append(keys, b.drain.keyBuf[:n]...)
		vals = append(vals, b.drain.valBuf[:n*b.ncpu]...)
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return keys, vals, nil
		case errors.Is(err, unix.ENOSPC) && batch < 1<<20:
			// A hash bucket holds more keys than the batch: grow, retry.
			batch *= 4
		case err != nil:
			return keys, vals, err
		}
	}
}

// merge sums one flow's per-CPU slots. The process is taken from the slot
// that saw it last.
func merge(k bundlerFlowKey, cpus []bundlerFlowValue) Entry {
	e := Entry{
		NetNS:     k.Netns,
		Proto:     k.Proto,
		Direction: k.Direction,
		Port:      k.Port,
		Local:     netip.AddrFrom16(k.LocalAddr).Unmap(),
		Remote:    netip.AddrFrom16(k.RemoteAddr).Unmap(),
	}
	var procSeen uint64
	for _, v := range cpus {
		c := &e.Counts
		c.Connections += v.Connections
		c.FailedConnections += v.FailedConnections
		c.FailedRefused += v.FailedRefused
		c.FailedTimeout += v.FailedTimeout
		c.FailedReset += v.FailedReset
		c.FailedUnreachable += v.FailedUnreachable
		c.BytesSent += v.BytesSent
		c.BytesReceived += v.BytesReceived
		c.DatagramsSent += v.DatagramsSent
		c.DatagramsReceived += v.DatagramsReceived
		c.LatencyCount += v.LatencyCount
		c.LatencySumUs += v.LatencySumUs
		c.LatencyMaxUs = max(c.LatencyMaxUs, v.LatencyMaxUs)
		c.ResetsSent += v.ResetsSent
		c.ResetsReceived += v.ResetsReceived
		c.Retransmits += v.Retransmits
		if v.FirstSeenNs != 0 && (e.FirstSeenBootNs == 0 || v.FirstSeenNs < e.FirstSeenBootNs) {
			e.FirstSeenBootNs = v.FirstSeenNs
		}
		if v.LastSeenNs > e.LastSeenBootNs {
			e.LastSeenBootNs = v.LastSeenNs
		}
		if v.Pid != 0 && v.LastSeenNs >= procSeen {
			procSeen = v.LastSeenNs
			e.PID = v.Pid
			e.Comm = commString(v.Comm)
			e.CgroupID = v.CgroupId
			if v.PeerPid != 0 {
				e.PeerPID, e.PeerComm = v.PeerPid, commString(v.PeerComm)
			}
		}
	}
	return e
}

// unixPath resolves a path hash from the kernel's table, remembering
// every answer: a path never changes its hash.
func (b *Bundler) unixPath(h uint64) string {
	if p, ok := b.drain.paths[h]; ok {
		return p
	}
	var v bundlerUnixPath
	if err := b.shared.Maps["unix_paths"].Lookup(h, &v); err != nil {
		return fmt.Sprintf("unix:%016x", h) // evicted before the drain: still one stable name
	}
	n := min(int(v.Len), len(v.Path))
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(v.Path[i])
	}
	p := string(raw)
	if n > 0 && raw[0] == 0 {
		p = "@" + string(raw[1:]) // abstract name, as ss shows it
	} else if i := bytes.IndexByte(raw, 0); i >= 0 {
		p = string(raw[:i])
	}
	if len(b.drain.paths) > 1<<16 {
		clear(b.drain.paths)
	}
	b.drain.paths[h] = p
	return p
}

func commString(c [16]int8) string {
	b := make([]byte, 0, len(c))
	for _, ch := range c {
		if ch == 0 {
			break
		}
		b = append(b, byte(ch))
	}
	return string(b)
}

// readIter runs an iterator once and decodes its output as records of T.
func readIter[T any](it *link.Iter) ([]T, error) {
	rd, err := it.Open()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	raw, err := io.ReadAll(rd)
	if err != nil {
		return nil, err
	}
	size := binary.Size(new(T))
	if size <= 0 || len(raw)%size != 0 {
		return nil, fmt.Errorf("iterator output of %d bytes is not a whole number of %d-byte records", len(raw), size)
	}
	recs := make([]T, len(raw)/size)
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, recs); err != nil {
		return nil, err
	}
	return recs, nil
}
