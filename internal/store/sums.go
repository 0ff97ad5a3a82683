package store

import (
	"fmt"
	"slices"
	"strings"
)

// flowSum is one flow's counters summed over the rows of a range, in the
// order of the bucket tables' columns: pid and peer_pid by maximum, the
// counters of counterColumns, first_seen by minimum, last_seen by maximum.
type flowSum struct {
	pid, peer   int64
	c           [20]int64
	first, last int64
}

// columnIndex is the index of counter column name in counterColumns.
func columnIndex(name string) int {
	for i, c := range counterColumns {
		if c == name {
			return i
		}
	}
	panic("no counter column " + name)
}

// The counters that do not accumulate by sum: two maxima
// (connect_latency_max_us, rtt_max_us) and one minimum of non-zero
// values (rtt_min_us).
var (
	latencyMaxIndex = columnIndex("connect_latency_max_us")
	rttMaxIndex     = columnIndex("rtt_max_us")
	rttMinIndex     = columnIndex("rtt_min_us")
)

// add accumulates one bucket row the way the rollups do (the statements of
// upsertRows and rollupFrom): maximum, sums, minimum.
func (f *flowSum) add(o *flowSum) {
	f.pid = max(f.pid, o.pid)
	f.peer = max(f.peer, o.peer)
	m := max(f.c[latencyMaxIndex], o.c[latencyMaxIndex])
	rm := max(f.c[rttMaxIndex], o.c[rttMaxIndex])
	rn := minNonzero(f.c[rttMinIndex], o.c[rttMinIndex])
	for i := range f.c {
		f.c[i] += o.c[i]
	}
	f.c[latencyMaxIndex], f.c[rttMaxIndex], f.c[rttMinIndex] = m, rm, rn
	f.first = min(f.first, o.first)
	f.last = max(f.last, o.last)
}

// sums accumulates bucket rows per flow key id. Flows live in one slice;
// key ids, which both databases hand out in sequence, index a dense
// slice (a map only for ids beyond denseKeys), so that a range of a
// million rows costs an array access per row.
type sums struct {
	dense  []int32 // key id -> 1 + index in flows; 0: none yet
	sparse map[int64]int32
	keys   []int64
	flows  []flowSum
	idx    []int32                // addPiece's and addEncoded's buffer
	cols   [flowSumFields][]int64 // addEncoded's buffers
	buf    []uint64
	// negative: a maximum value below zero was added (see addEncoded).
	negative bool
}

// reserve makes room for n flows of key ids up to maxKey.
func (s *sums) reserve(n int, maxKey int64) {
	s.keys = slices.Grow(s.keys, n)
	s.flows = slices.Grow(s.flows, n)
	if maxKey >= 0 && maxKey < denseKeys && int64(len(s.dense)) <= maxKey {
		s.dense = slices.Grow(s.dense, int(maxKey+1)-len(s.dense))[:maxKey+1]
	}
}

// denseKeys bounds the dense index: 16 M ids, 64 MB at most.
const denseKeys = 1 << 24

func newSums() *sums { return &sums{sparse: map[int64]int32{}} }

func (s *sums) add(key int64, row *flowSum) {
	if row.pid < 0 || row.peer < 0 || row.c[latencyMaxIndex] < 0 || row.c[rttMaxIndex] < 0 || row.last < 0 {
		s.negative = true
	}
	if key >= 0 && key < denseKeys {
		if key >= int64(len(s.dense)) {
			s.dense = slices.Grow(s.dense, int(key+1)*2-len(s.dense))[:min(int(key+1)*2, denseKeys)]
		}
		if i := s.dense[key]; i > 0 {
			s.flows[i-1].add(row)
			return
		}
		s.dense[key] = int32(len(s.flows) + 1)
	} else {
		if i, ok := s.sparse[key]; ok {
			s.flows[i].add(row)
			return
		}
		s.sparse[key] = int32(len(s.flows))
	}
	s.keys = append(s.keys, key)
	s.flows = append(s.flows, *row)
}

// has reports whether key has counters.
func (s *sums) has(key int64) bool {
	if key >= 0 && key < int64(len(s.dense)) {
		return s.dense[key] > 0
	}
	_, ok := s.sparse[key]
	return ok
}

// bucketColumns are the columns a range query reads from a bucket table,
// in flowSum's order.
var bucketColumns = "key_id, pid, peer_pid, " + strings.Join(counterColumns, ", ") + ", first_seen, last_seen"

// observations names the summed flows by their keys, sorted by key.
func (sm *sums) observations(keys map[int64]flowKey) ([]Observation, error) {
	return sm.observationsRanked(keys, nil)
}

// observationsRanked is observations, with rank (when not nil) giving
// each key id's place in key order, which sorts faster than the keys.
func (sm *sums) observationsRanked(keys map[int64]flowKey, rank func(int64) int32) ([]Observation, error) {
	if len(sm.flows) == 0 {
		return nil, nil
	}
	type named struct {
		k    *flowKey
		i    int32
		rank int32
	}
	order := make([]named, 0, len(sm.flows))
	ks := make([]flowKey, len(sm.flows))
	for i, id := range sm.keys {
		k, ok := keys[id]
		if !ok {
			return nil, fmt.Errorf("read observations: flow key %d has counters but no key", id)
		}
		ks[i] = k
		n := named{k: &ks[i], i: int32(i)}
		if rank != nil {
			n.rank = rank(id)
		}
		order = append(order, n)
	}
	if rank != nil {
		slices.SortFunc(order, func(a, b named) int { return int(a.rank) - int(b.rank) })
	} else {
		slices.SortFunc(order, func(a, b named) int { return a.k.compare(*b.k) })
	}
	out := make([]Observation, len(order))
	for j, n := range order {
		sm.observation(&out[j], n.k, n.i)
	}
	return out, nil
}

// observation fills o with flow i of sm, named k.
func (sm *sums) observation(o *Observation, k *flowKey, i int32) {
	f := &sm.flows[i]
	o.HostID, o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, o.Port, o.Comm, o.PeerComm = k.host, k.dir, k.proto, k.local, k.remote, k.port, k.comm, k.peerComm
	o.PID, o.PeerPID = uint32(f.pid), uint32(f.peer)
	for i, p := range counterFields(&o.Counters) {
		*p = uint64(f.c[i])
	}
	o.FirstSeen, o.LastSeen = fromNs(f.first), fromNs(f.last)
}
