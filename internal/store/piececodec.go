package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// The bytes of a piece (flow_pieces.data): a format byte, the number of
// flows n as a uvarint, then 25 columns of n values each: the flow key
// ids (ascending) as differences from the previous id, then each of
// flowSum's 24 values (first and last seen less the bucket's start, the
// others as they are) zigzag-encoded. A column is a width byte w (0: all
// values zero, nothing follows) and n values of w bytes, little-endian:
// fixed widths decode without a branch per byte, and w is the fewest
// bytes the column's largest value needs, so the size is close to that
// of varints. Format 1 (schemas 8 to 10) had 16 counters, without the
// RTT: migration 11 deleted those pieces for Compact to build again.
const pieceFormat = 2

var errPiece = errors.New("malformed piece")

// pieceBase is what a column's values are stored relative to: the
// bucket's start for first and last seen (small differences), else zero.
// The subtraction wraps, so any value survives.
func pieceBase(f int, bucket int64) int64 {
	if f >= 22 {
		return bucket
	}
	return 0
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// appendColumn appends one column of values.
func appendColumn(out []byte, vals []uint64) []byte {
	var all uint64
	for _, v := range vals {
		all |= v
	}
	w := 0
	for all != 0 {
		w++
		all >>= 8
	}
	out = append(out, byte(w))
	if w == 0 {
		return out
	}
	var b [8]byte
	for _, v := range vals {
		binary.LittleEndian.PutUint64(b[:], v)
		out = append(out, b[:w]...)
	}
	return out
}

// readColumn reads a column of n values into dst (len n) and returns the
// bytes after it and whether it was all zeros (dst then untouched).
func readColumn(data []byte, dst []uint64) ([]byte, bool, error) {
	if len(data) == 0 {
		return nil, false, fmt.Errorf("%w: a column is missing", errPiece)
	}
	w := int(data[0])
	data = data[1:]
	if w == 0 {
		return data, true, nil
	}
	if w > 8 {
		return nil, false, fmt.Errorf("%w: a column of %d-byte values", errPiece, w)
	}
	need := len(dst) * w
	if len(data) < need {
		return nil, false, fmt.Errorf("%w: a column is cut short", errPiece)
	}
	mask := uint64(math.MaxUint64)
	if w < 8 {
		mask = 1<<(8*w) - 1
	}
	i, off := 0, 0
	// Eight bytes at a time while eight remain, then byte by byte.
	for ; i < len(dst) && off+8 <= len(data); i, off = i+1, off+w {
		dst[i] = binary.LittleEndian.Uint64(data[off:]) & mask
	}
	for ; i < len(dst); i, off = i+1, off+w {
		var u uint64
		for b := w - 1; b >= 0; b-- {
			u = u<<8 | uint64(data[off+b])
		}
		dst[i] = u
	}
	return data[need:], false, nil
}

// encodePiece packs a bucket's sums, ids ascending.
func encodePiece(bucket int64, ids []int64, rows []flowSum) []byte {
	out := make([]byte, 0, 32+len(ids)*24)
	out = append(out, pieceFormat)
	out = binary.AppendUvarint(out, uint64(len(ids)))
	vals := make([]uint64, len(ids))
	prev := int64(0)
	for i, id := range ids {
		vals[i] = uint64(id - prev)
		prev = id
	}
	out = appendColumn(out, vals)
	for f := 0; f < flowSumFields; f++ {
		base := pieceBase(f, bucket)
		for i := range rows {
			vals[i] = zigzag(rows[i].fields()[f] - base)
		}
		out = appendColumn(out, vals)
	}
	return out
}

// pieceHeader reads the format and the number of flows.
func pieceHeader(data []byte) (int, []byte, error) {
	if len(data) == 0 || data[0] != pieceFormat {
		return 0, nil, fmt.Errorf("%w: unknown format", errPiece)
	}
	data = data[1:]
	n, k := binary.Uvarint(data)
	if k <= 0 || n > uint64(len(data)) {
		return 0, nil, fmt.Errorf("%w: flow count", errPiece)
	}
	return int(n), data[k:], nil
}

// decodePiece unpacks a piece into the cache's form.
func decodePiece(bucket int64, data []byte) (*piece, error) {
	n, data, err := pieceHeader(data)
	if err != nil {
		return nil, err
	}
	buf := make([]uint64, n)
	data, zero, err := readColumn(data, buf)
	if err != nil {
		return nil, err
	}
	p := &piece{ids: make([]int64, n), bytes: 64 + int64(n)*8}
	prev := int64(0)
	for i := range p.ids {
		if !zero {
			prev += int64(buf[i])
		}
		p.ids[i] = prev
	}
	for f := 0; f < flowSumFields; f++ {
		if data, zero, err = readColumn(data, buf); err != nil {
			return nil, err
		}
		base := pieceBase(f, bucket)
		if zero && base == 0 {
			continue
		}
		if zero {
			clear(buf) // every value is the base
		}
		col := make([]int64, n)
		nonzero := false
		for i, u := range buf {
			col[i] = unzigzag(u) + base
			if col[i] < 0 && fieldKind[f] == 'M' {
				p.negative = true
			}
			nonzero = nonzero || col[i] != 0
		}
		if !nonzero { // zeros relative to the bucket's start
			continue
		}
		p.cols[f] = col
		p.bytes += int64(n) * 8
	}
	if len(data) != 0 {
		return nil, fmt.Errorf("%w: %d bytes left over", errPiece, len(data))
	}
	return p, nil
}

// addEncoded adds an encoded piece to sm as sm.add would its rows one by
// one: the columns are decoded into buffers, then added to each flow's
// sums in one pass over the flows (each flow's sums are touched once, not
// once per column). A flow new to sm starts from each value's identity
// (the smallest int64 for a maximum, the largest for a minimum), so the
// result is exact whatever the values.
func (sm *sums) addEncoded(bucket int64, data []byte) error {
	n, data, err := pieceHeader(data)
	if err != nil {
		return err
	}
	buf := slices.Grow(sm.buf[:0], n)[:n]
	sm.buf = buf
	data, zero, err := readColumn(data, buf)
	if err != nil {
		return err
	}
	if !zero {
		// Room for every flow of the piece, and the dense index up to
		// its largest id, at once.
		last := int64(0)
		for _, d := range buf {
			last += int64(d)
		}
		if len(sm.flows) == 0 {
			sm.reserve(n, last)
		} else {
			sm.reserve(0, last)
		}
	}
	idx := slices.Grow(sm.idx[:0], n)
	fresh := len(sm.flows) // flows from here on are new
	prev := int64(0)
	for i := 0; i < n; i++ {
		if !zero {
			prev += int64(buf[i])
		}
		idx = append(idx, sm.slotFrom(prev, &identitySum))
	}
	sm.idx = idx
	// Columns whose every value is one constant (the base: zero, or the
	// bucket's start for first and last seen), by accumulation.
	type constant struct {
		f int
		v int64
	}
	var plus, maxs, mins, nonzeroMins []int
	var constPlus, constMax, constMin []constant
	for f := 0; f < flowSumFields; f++ {
		kind := fieldKind[f]
		col := slices.Grow(sm.cols[f][:0], n)[:n]
		sm.cols[f] = col
		if data, zero, err = readColumn(data, buf); err != nil {
			return err
		}
		base := pieceBase(f, bucket)
		if zero {
			c := constant{f, base}
			switch {
			case kind == 'M':
				constMax = append(constMax, c)
				sm.negative = sm.negative || base < 0
			case kind == 'm':
				constMin = append(constMin, c)
			case base != 0:
				constPlus = append(constPlus, c)
			}
			continue
		}
		for i, u := range buf {
			col[i] = unzigzag(u) + base
		}
		switch kind {
		case '+':
			plus = append(plus, f)
		case 'M':
			maxs = append(maxs, f)
			for _, v := range col {
				if v < 0 {
					sm.negative = true
				}
			}
		case 'n':
			nonzeroMins = append(nonzeroMins, f)
		default:
			mins = append(mins, f)
		}
	}
	if len(data) != 0 {
		return fmt.Errorf("%w: %d bytes left over", errPiece, len(data))
	}
	flows := sm.flows
	for i, j := range idx {
		v := flows[j].fields()
		for _, f := range plus {
			v[f] += sm.cols[f][i]
		}
		for _, f := range maxs {
			v[f] = max(v[f], sm.cols[f][i])
		}
		for _, f := range mins {
			v[f] = min(v[f], sm.cols[f][i])
		}
		for _, f := range nonzeroMins {
			v[f] = minNonzero(v[f], sm.cols[f][i])
		}
		for _, c := range constPlus {
			v[c.f] += c.v
		}
		for _, c := range constMin {
			v[c.f] = min(v[c.f], c.v)
		}
		// A maximum over zeros changes only a new flow's identity or a
		// negative value (see sums.negative); one over a bucket's start
		// (last seen) anything.
		if int(j) >= fresh || sm.negative {
			for _, c := range constMax {
				v[c.f] = max(v[c.f], c.v)
			}
		} else {
			for _, c := range constMax {
				if c.v != 0 {
					v[c.f] = max(v[c.f], c.v)
				}
			}
		}
	}
	return nil
}

// identitySum is what a flow's sums start from before its first piece:
// each value's identity under its accumulation.
var identitySum = func() flowSum {
	var f flowSum
	for i, k := range fieldKind {
		switch k {
		case 'M':
			f.fields()[i] = math.MinInt64
		case 'm':
			f.fields()[i] = math.MaxInt64
		}
	}
	return f
}()

// slotFrom is slot, a new flow starting from *fresh.
func (sm *sums) slotFrom(key int64, fresh *flowSum) int32 {
	if key >= 0 && key < int64(len(sm.dense)) && sm.dense[key] > 0 {
		return sm.dense[key] - 1
	}
	if i, ok := sm.sparse[key]; ok {
		return i
	}
	n := len(sm.flows)
	if key >= 0 && key < denseKeys {
		if key >= int64(len(sm.dense)) {
			sm.dense = slices.Grow(sm.dense, int(key+1)*2-len(sm.dense))[:min(int(key+1)*2, denseKeys)]
		}
		sm.dense[key] = int32(n + 1)
	} else {
		sm.sparse[key] = int32(n)
	}
	sm.keys = append(sm.keys, key)
	sm.flows = append(sm.flows, *fresh)
	return int32(n)
}
