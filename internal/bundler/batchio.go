// Batch I/O on the kernel side's maps, with a call per slot where the
// kernel has no batch operation for a map type.

package bundler

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// errnoENOTSUPP is the kernel's own "not supported" (524), which it returns
// for a batch operation a map type lacks; user-space headers do not name it.
const errnoENOTSUPP = unix.Errno(524)

// batchUnsupported reports an error of a batch operation the kernel does
// not have for this map type.
func batchUnsupported(err error) bool {
	return errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, errnoENOTSUPP) || errors.Is(err, unix.EOPNOTSUPP)
}

// perCPU reports whether m holds a value per CPU: cilium/ebpf then takes
// a slice of values for one key, even on a host with one CPU.
func perCPU(m *ebpf.Map) bool {
	return m.Type() == ebpf.PerCPUArray || m.Type() == ebpf.PerCPUHash
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
		if !perCPU(m) {
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
	var batch any = vals
	var ptrs []*V
	if perCPU(m) {
		// cilium/ebpf encodes a per-CPU value one CPU's element at a
		// time: given by value, through encoding/binary's reflection
		// (about 1.2 µs per 288-byte element, BenchmarkFreeFullCacheHalf);
		// by pointer, as a copy of its memory (bpf2go's types have no
		// hidden padding).
		ptrs = make([]*V, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		batch = ptrs
	}
	if !testHooks.noArrayBatch {
		_, err := m.BatchUpdate(keys, batch, nil)
		if !batchUnsupported(err) {
			return err
		}
	}
	for j, k := range keys {
		var err error
		if ptrs == nil {
			err = m.Update(k, &vals[j], ebpf.UpdateExist)
		} else {
			err = m.Update(k, ptrs[j*perSlot:(j+1)*perSlot], ebpf.UpdateExist)
		}
		if err != nil {
			return fmt.Errorf("slot %d: %w", k, err)
		}
	}
	return nil
}

// readAll reads every entry of m with batch lookups.
func (b *Bundler) readAll(m *ebpf.Map) ([]bundlerFlowKey, []bundlerFlowValue, error) {
	batch := 1024
	// Sized as the last read (bundled flows recur, and growing by append
	// copied each interval's values several times), in the buffers of the
	// last committed interval when they are large enough.
	keys, vals := b.drain.spareKeys[:0], b.drain.spareVals[:0]
	b.drain.spareKeys, b.drain.spareVals = nil, nil
	if cap(keys) < b.drain.lastRead || cap(vals) < b.drain.lastRead {
		keys = make([]bundlerFlowKey, 0, b.drain.lastRead)
		vals = make([]bundlerFlowValue, 0, b.drain.lastRead)
	}
	defer func() { b.drain.lastRead = len(keys) }()
	var cursor ebpf.MapBatchCursor
	for {
		if len(b.drain.keyBuf) < batch {
			b.drain.keyBuf = make([]bundlerFlowKey, batch)
			b.drain.valBuf = make([]bundlerFlowValue, batch)
		}
		n, err := m.BatchLookup(&cursor, b.drain.keyBuf[:batch], b.drain.valBuf[:batch], nil)
		keys = append(keys, b.drain.keyBuf[:n]...)
		vals = append(vals, b.drain.valBuf[:n]...)
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
