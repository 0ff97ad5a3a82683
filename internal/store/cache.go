package store

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// A cache of the sums of past hours and days, for a long-running reader
// (deptrace serve). A range's whole hours before the current one are
// answered from the cached rows of each hour (or of each day wholly
// inside the range); only the ragged ends (minutes, the current hour) are
// read from the database. The flow keys are cached too (a key id names
// the same flow until retention deletes it).
//
// The cache stays exact through the write log (migration 7): every write
// of flow counters appends the hours it touched in the same transaction,
// and the cache reads the log in the same snapshot as the rows it reads,
// before using anything it holds. An hour written since it was cached (a
// late write, as when an agent replays its spool after an outage) is
// dropped with its day, whatever the writer's clock; retention drops
// everything; so does a log pruned past what the cache had read.

// CacheConfig configures the cache of EnableCache.
type CacheConfig struct {
	// Bytes bounds the memory of the cached sums (keys not counted);
	// the least recently used hours and days go first. Zero is
	// DefaultCacheBytes.
	Bytes int64
	// Now tells which hours are past (the current hour is never
	// cached: every write changes it). Nil is time.Now.
	Now func() time.Time
}

// DefaultCacheBytes is the cache's default memory bound.
const DefaultCacheBytes = 512 << 20

// CacheStats counts what the cache did.
type CacheStats struct {
	// Hits and Fills count hours and days answered from the cache and
	// read into it; Dropped those a write changed; Evicted those that
	// went for memory; Resets the times everything went.
	Hits, Fills, Dropped, Evicted, Resets int64
	Pieces                                int
	Bytes                                 int64
}

// EnableCache makes Observations keep the sums of past hours and days in
// memory for later queries on this Store. For long-running readers; call
// it before the first query or between queries (it starts an empty
// cache), never during one.
func (s *Store) EnableCache(cfg CacheConfig) {
	if cfg.Bytes <= 0 {
		cfg.Bytes = DefaultCacheBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s.cache = &cache{cfg: cfg, pieces: map[pieceID]*piece{}, keys: map[int64]flowKey{}}
}

// CacheStats reports what the cache did (zero without EnableCache).
func (s *Store) CacheStats() CacheStats {
	c := s.cache
	if c == nil {
		return CacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Pieces, st.Bytes = len(c.pieces), c.bytes
	return st
}

type cache struct {
	mu     sync.Mutex
	cfg    CacheConfig
	pieces map[pieceID]*piece
	bytes  int64
	tick   uint64
	keys   map[int64]flowKey
	rank   map[int64]int32 // of keys, in key order; nil: to do
	maxKey int64           // the largest id in keys
	synced bool
	pos    logPos
	stats  CacheStats
}

// pieceID names one bucket of one level (0: minutes, 1: hours, 2: days).
type pieceID struct {
	level  int
	bucket int64
}

// piece is one bucket's rows, by column: ids, and each of flowSum's 24
// values per flow, nil where every flow's is zero (most counters, on
// most flows).
type piece struct {
	ids   []int64
	cols  [flowSumFields][]int64
	bytes int64
	used  uint64
	// negative: a maximum column holds a negative value (see addPiece).
	negative bool
}

// flowSumFields is the number of int64 values in a flowSum, in order:
// pid, peer, the 20 counters, first, last.
const flowSumFields = 24

// fields views f as its 24 values (checked in init).
func (f *flowSum) fields() *[flowSumFields]int64 {
	return (*[flowSumFields]int64)(unsafe.Pointer(f))
}

func init() {
	var f flowSum
	if unsafe.Sizeof(f) != flowSumFields*8 || unsafe.Offsetof(f.c) != 16 || unsafe.Offsetof(f.last) != 23*8 {
		panic("store: flowSum is not 24 int64 in order")
	}
}

// fieldKind says how each value accumulates (see flowSum.add): '+' sum,
// 'M' maximum, 'm' minimum, 'n' minimum of the non-zero values.
var fieldKind = func() [flowSumFields]byte {
	var k [flowSumFields]byte
	for i := range k {
		k[i] = '+'
	}
	k[0], k[1], k[2+latencyMaxIndex], k[2+rttMaxIndex], k[23] = 'M', 'M', 'M', 'M', 'M'
	k[2+rttMinIndex] = 'n'
	k[22] = 'm'
	return k
}()

func newPiece(rows []flowSum, ids []int64) *piece {
	p := &piece{ids: ids, bytes: 64 + int64(len(ids))*8} // 64: the piece itself
	for f := 0; f < flowSumFields; f++ {
		nonzero := false
		for i := range rows {
			if v := rows[i].fields()[f]; v != 0 {
				nonzero = true
				if v < 0 && fieldKind[f] == 'M' {
					p.negative = true
				}
			}
		}
		if !nonzero {
			continue
		}
		col := make([]int64, len(rows))
		for i := range rows {
			col[i] = rows[i].fields()[f]
		}
		p.cols[f] = col
		p.bytes += int64(len(col)) * 8
	}
	return p
}

// addPiece adds a piece's rows to sm, as sm.add would row by row: a
// column at a time. A maximum over a column of zeros changes nothing,
// since no maximum column holds a negative value (pids, latencies, times
// since 1970; newPiece marks a piece that would); a minimum does.
func (sm *sums) addPiece(p *piece) {
	if len(p.ids) == 0 {
		return
	}
	if p.negative {
		var row flowSum
		for i, id := range p.ids {
			for f := range row.fields() {
				row.fields()[f] = 0
				if col := p.cols[f]; col != nil {
					row.fields()[f] = col[i]
				}
			}
			sm.add(id, &row)
		}
		return
	}
	idx := sm.idx[:0]
	for _, id := range p.ids {
		idx = append(idx, sm.slot(id))
	}
	sm.idx = idx
	for f := 0; f < flowSumFields; f++ {
		col, kind := p.cols[f], fieldKind[f]
		switch {
		case kind == 'm' && col == nil:
			for _, j := range idx {
				dst := &sm.flows[j].fields()[f]
				*dst = min(*dst, 0)
			}
		case kind == 'm':
			for i, j := range idx {
				dst := &sm.flows[j].fields()[f]
				*dst = min(*dst, col[i])
			}
		case col == nil:
		case kind == '+':
			for i, j := range idx {
				sm.flows[j].fields()[f] += col[i]
			}
		case kind == 'n':
			for i, j := range idx {
				dst := &sm.flows[j].fields()[f]
				*dst = minNonzero(*dst, col[i])
			}
		default:
			for i, j := range idx {
				dst := &sm.flows[j].fields()[f]
				*dst = max(*dst, col[i])
			}
		}
	}
}

// slot returns the index of key's flow in sm, adding one if there is
// none: zero, but for the earliest first seen (the largest value, for
// the minimum addPiece then takes).
func (sm *sums) slot(key int64) int32 {
	if key >= 0 && key < int64(len(sm.dense)) && sm.dense[key] > 0 {
		return sm.dense[key] - 1
	}
	if i, ok := sm.sparse[key]; ok {
		return i
	}
	n := len(sm.flows)
	fresh := flowSum{first: math.MaxInt64}
	sm.add(key, &fresh)
	return int32(n)
}

// sync reads the write log and drops what changed since the last query.
func (c *cache) sync(rd reader) error {
	hours, lost, next, err := rd.logSince(c.pos)
	if err != nil {
		return err
	}
	if !c.synced {
		c.synced, c.pos = true, next
		return nil
	}
	c.pos = next
	if lost {
		c.reset()
		return nil
	}
	day := levels[2].width
	for _, h := range hours {
		if h == logEverything {
			c.reset()
			return nil
		}
		for m := h; m < h+levels[1].width; m += levels[0].width {
			c.drop(pieceID{0, m})
		}
		c.drop(pieceID{1, h})
		c.drop(pieceID{2, floorTo(h, day)})
	}
	return nil
}

func (c *cache) reset() {
	c.pieces, c.bytes, c.keys, c.rank, c.maxKey = map[pieceID]*piece{}, 0, map[int64]flowKey{}, nil, 0
	c.stats.Resets++
}

func (c *cache) drop(id pieceID) {
	if p, ok := c.pieces[id]; ok {
		c.bytes -= p.bytes
		delete(c.pieces, id)
		c.stats.Dropped++
	}
}

// observations answers [klo, hi) like Store.observations, from the cache
// where it can: old, the segments of the part older than the minutes
// kept (see retained.old), from the database, the rest, [lo, hi), from
// the cache where it can. The caller holds c.mu.
func (c *cache) observations(rd reader, klo, lo, hi int64, old []segment) ([]Observation, error) {
	if err := c.sync(rd); err != nil {
		return nil, err
	}
	hi0, onlyOld := hi, lo >= hi
	hour, day := levels[1].width, levels[2].width
	from := lo
	if from == math.MinInt64 { // no start: from the oldest minute stored
		var err error
		if from, err = rd.oldest(); err != nil {
			return nil, err
		}
	}
	// Hours a host holds a minute of open are not whole yet (see
	// openminute.go): from the first, the database answers.
	w, err := rd.openFrom()
	if err != nil {
		return nil, err
	}
	a := ceilTo(from, hour)
	b := min(floorTo(hi, hour), floorTo(c.cfg.Now().UnixNano(), hour), floorTo(w, hour))
	var segs []segment
	var need []pieceID
	if a < b {
		// Whole past minutes up to the first whole hour, whole past hours
		// (and days) from the cache; from the database, the minute the
		// range's start cuts (with its event filter, see Range) and what
		// follows the last whole past hour: the current hour's row, or a
		// past range's last minutes.
		m0 := ceilTo(from, levels[0].width)
		segs = append(plan(lo, m0, levels), planOpen(b, hi, w, levels)...)
		for t := m0; t < a; t += levels[0].width {
			need = append(need, pieceID{0, t})
		}
		d0, d1 := ceilTo(a, day), floorTo(b, day)
		if d0 >= d1 {
			d0, d1 = b, b
		}
		for t := a; t < d0; t += hour {
			need = append(need, pieceID{1, t})
		}
		for t := d0; t < d1; t += day {
			need = append(need, pieceID{2, t})
		}
		for t := d1; t < b; t += hour {
			need = append(need, pieceID{1, t})
		}
	} else {
		segs = planOpen(lo, hi, w, levels)
	}
	if onlyOld {
		segs, need = nil, nil
	}
	sm := newSums()
	sm.reserve(len(c.keys), c.maxKey)
	if err := sumOld(rd, old, klo, hi0, sm); err != nil {
		return nil, err
	}
	if err := rd.sums(segs, lo, hi, sm); err != nil {
		return nil, err
	}
	if err := c.fill(rd, need); err != nil {
		return nil, err
	}
	c.tick++
	for _, id := range need {
		p := c.pieces[id]
		p.used = c.tick
		sm.addPiece(p)
	}
	if len(sm.flows) == 0 {
		c.evict()
		return nil, nil
	}
	var missing []int64
	for _, id := range sm.keys {
		if _, ok := c.keys[id]; !ok {
			missing = append(missing, id)
		}
	}
	add := func(id int64, k flowKey) {
		c.keys[id] = k
		c.maxKey = max(c.maxKey, id)
	}
	if len(missing) > 2000 {
		if err := rd.keys(klo, sm.has, add); err != nil {
			return nil, err
		}
	} else if len(missing) > 0 {
		if err := rd.keysByID(missing, add); err != nil {
			return nil, err
		}
	}
	if len(missing) > 0 || c.rank == nil {
		c.rankKeys()
	}
	out, err := sm.observationsRanked(c.keys, func(id int64) int32 { return c.rank[id] })
	c.evict()
	return out, err
}

// rankKeys numbers the cached keys in key order.
func (c *cache) rankKeys() {
	type idKey struct {
		id int64
		k  flowKey
	}
	ids := make([]idKey, 0, len(c.keys))
	for id, k := range c.keys {
		ids = append(ids, idKey{id, k})
	}
	slices.SortFunc(ids, func(a, b idKey) int { return a.k.compare(b.k) })
	c.rank = make(map[int64]int32, len(ids))
	for i, x := range ids {
		c.rank[x.id] = int32(i)
	}
}

// fill reads the pieces of need the cache lacks: the stored piece of a
// bucket where there is one (see pieces.go), else its rows, one bucket
// per query (a run of buckets in one would hold all their rows at once).
func (c *cache) fill(rd reader, need []pieceID) error {
	var missing []pieceID
	for _, id := range need {
		if _, ok := c.pieces[id]; ok {
			c.stats.Hits++
			continue
		}
		missing = append(missing, id)
	}
	put := func(id pieceID, p *piece) {
		c.pieces[id] = p
		c.bytes += p.bytes
		c.stats.Fills++
	}
	if len(missing) > 0 {
		err := rd.pieces(missing, func(id pieceID, data []byte) error {
			p, err := decodePiece(id.bucket, data)
			if err != nil {
				return fmt.Errorf("piece %d/%d: %w", id.level, id.bucket, err)
			}
			put(id, p)
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, id := range missing {
		if _, ok := c.pieces[id]; ok {
			continue
		}
		l := levels[id.level]
		var rows []flowSum
		var ids []int64
		err := rd.buckets(l, id.bucket, id.bucket+l.width, func(_, key int64, row *flowSum) {
			rows = append(rows, *row)
			ids = append(ids, key)
		})
		if err != nil {
			return err
		}
		put(id, newPiece(rows, ids))
	}
	return nil
}

// evict drops the least recently used pieces while over the bound.
func (c *cache) evict() {
	if c.bytes <= c.cfg.Bytes {
		return
	}
	ids := make([]pieceID, 0, len(c.pieces))
	for id := range c.pieces {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b pieceID) int { return compareInt(int64(c.pieces[a].used), int64(c.pieces[b].used)) })
	for _, id := range ids {
		if c.bytes <= c.cfg.Bytes {
			break
		}
		c.bytes -= c.pieces[id].bytes
		delete(c.pieces, id)
		c.stats.Evicted++
	}
}
