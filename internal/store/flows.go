package store

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// counterColumns are the columns of tracer.Counters, in the order of
// counterFields.
var counterColumns = []string{
	"connections", "failed_connections", "failed_refused", "failed_timeout", "failed_reset", "failed_unreachable",
	"bytes_sent", "bytes_received", "datagrams_sent", "datagrams_received",
	"connect_latency_count", "connect_latency_sum_us", "connect_latency_max_us",
	"resets_sent", "resets_received", "retransmits",
}

// maxColumns accumulate by maximum; every other counter column by sum.
var maxColumns = map[string]bool{"connect_latency_max_us": true}

func counterFields(c *tracer.Counters) []*uint64 {
	return []*uint64{
		&c.Connections, &c.FailedConnections, &c.FailedRefused, &c.FailedTimeout, &c.FailedReset, &c.FailedUnreachable,
		&c.BytesSent, &c.BytesReceived, &c.DatagramsSent, &c.DatagramsReceived,
		&c.ConnectLatencyCount, &c.ConnectLatencySumUs, &c.ConnectLatencyMaxUs,
		&c.ResetsSent, &c.ResetsReceived, &c.Retransmits,
	}
}

// flowKey is a flow's identity, stored once in flow_keys.
type flowKey struct {
	host, dir, proto, local, remote string
	port                            uint16
	comm, peerComm                  string
}

func keyOf(o Observation) flowKey {
	return flowKey{o.HostID, o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, o.Port, o.Comm, o.PeerComm}
}

func (k flowKey) compare(o flowKey) int {
	return cmp.Or(strings.Compare(k.host, o.host), strings.Compare(k.dir, o.dir), strings.Compare(k.proto, o.proto),
		strings.Compare(k.local, o.local), strings.Compare(k.remote, o.remote), strings.Compare(k.comm, o.comm),
		strings.Compare(k.peerComm, o.peerComm), int(k.port)-int(o.port))
}

// flowRow is one row of a bucket table: a flow's counters over one bucket.
type flowRow struct {
	bucket      int64
	key         int64
	pid, peer   uint32
	c           tracer.Counters
	first, last int64
}

func (r *flowRow) add(o flowRow) {
	r.c.Add(o.c)
	r.pid = max(r.pid, o.pid)
	r.peer = max(r.peer, o.peer)
	if o.first != 0 && (r.first == 0 || o.first < r.first) {
		r.first = o.first
	}
	r.last = max(r.last, o.last)
}

// level is one resolution of stored counters: raw minute buckets, and the
// rollups that sum them.
type level struct {
	table string
	width int64 // bucket width in nanoseconds
}

var minuteLevel = level{"flow_minutes", int64(time.Minute)}

// levels, finest first. Every write adds to each of them in the same
// transaction, so a rollup row always equals the sum of its minute rows,
// late writes (a spool replayed after an outage) included.
var levels = []level{minuteLevel, {"flow_hours", int64(time.Hour)}, {"flow_days", int64(24 * time.Hour)}}

// floorTo and ceilTo align ns to multiples of w (UTC-aligned for hours and
// days, since the Unix epoch is at a day boundary).
func floorTo(ns, w int64) int64 {
	if ns == math.MinInt64 || ns == math.MaxInt64 {
		return ns
	}
	r := ns % w
	if r < 0 {
		r += w
	}
	return ns - r
}

func ceilTo(ns, w int64) int64 {
	f := floorTo(ns, w)
	if f == ns {
		return ns
	}
	return f + w
}

func (s *Store) writeFlows(ctx context.Context, tx *sql.Tx, obs []Observation) error {
	if len(obs) == 0 {
		return nil
	}
	// Resolve the distinct keys to ids, in a stable order so concurrent
	// writers take row locks in the same order.
	var keys []flowKey
	seen := map[flowKey]bool{}
	for _, o := range obs {
		k := keyOf(o)
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, flowKey.compare)
	lastSeen := map[flowKey]int64{}
	for _, o := range obs {
		k := keyOf(o)
		lastSeen[k] = max(lastSeen[k], ns(o.LastSeen), ns(o.Bucket))
	}
	ids, err := s.keyIDs(ctx, tx, keys, lastSeen)
	if err != nil {
		return err
	}
	rows := make([]flowRow, 0, len(obs))
	for _, o := range obs {
		rows = append(rows, flowRow{bucket: ns(o.Bucket.Truncate(time.Minute)), key: ids[keyOf(o)], pid: o.PID, peer: o.PeerPID,
			c: o.Counters, first: ns(o.FirstSeen), last: ns(o.LastSeen)})
	}
	for _, l := range levels {
		if err := s.upsertRows(ctx, tx, l, rows); err != nil {
			return err
		}
	}
	if err := s.invalidatePieces(ctx, tx, rows); err != nil {
		return err
	}
	return s.logWrite(ctx, tx, rows)
}

// logWrite appends the hours rows touched to the write log, in the
// writer's transaction (see migration 7 and cache.go), and prunes the log
// at most once an hour per open store.
func (s *Store) logWrite(ctx context.Context, tx *sql.Tx, rows []flowRow) error {
	hour := levels[1].width
	var hours []int64
	for _, r := range rows {
		if h := floorTo(r.bucket, hour); !slices.Contains(hours, h) {
			hours = append(hours, h)
		}
	}
	now := time.Now().UnixNano()
	for _, h := range hours {
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO write_log (at, bucket) VALUES (?, ?)`), now, h); err != nil {
			return fmt.Errorf("append to the write log: %w", err)
		}
	}
	last := s.lastLogPrune.Load()
	if now-last < int64(time.Hour) || !s.lastLogPrune.CompareAndSwap(last, now) {
		return nil
	}
	return s.pruneWriteLog(ctx, tx, now-int64(WriteLogKeep))
}

// WriteLogKeep is how long write log entries are kept at least (pruning
// runs at most once an hour per writer): a cache that has not read the
// log for longer may have to start over.
const WriteLogKeep = 2 * time.Hour

// pruneWriteLog deletes the entries written before cutoff (unix ns) and
// records the newest one deleted.
func (s *Store) pruneWriteLog(ctx context.Context, tx *sql.Tx, cutoff int64) error {
	if s.d.name == postgres.name {
		// One statement: what it deletes is exactly what it records.
		if _, err := tx.ExecContext(ctx, `WITH d AS (DELETE FROM write_log WHERE at < $1 RETURNING xid)
			UPDATE write_log_state SET pruned_through = GREATEST(pruned_through, COALESCE((SELECT MAX(xid::text::bigint) FROM d), 0)) WHERE id = 1`, cutoff); err != nil {
			return fmt.Errorf("prune the write log: %w", err)
		}
		return nil
	}
	// SQLite: the transaction holds the write lock, nothing commits between.
	var newest sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(id) FROM write_log WHERE at < ?`, cutoff).Scan(&newest); err != nil {
		return fmt.Errorf("prune the write log: %w", err)
	}
	if !newest.Valid {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM write_log WHERE at < ?`, cutoff); err != nil {
		return fmt.Errorf("prune the write log: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE write_log_state SET pruned_through = MAX(pruned_through, ?) WHERE id = 1`, newest.Int64); err != nil {
		return fmt.Errorf("prune the write log: %w", err)
	}
	return nil
}

// keyIDs inserts keys not yet known and returns the id of each.
func (s *Store) keyIDs(ctx context.Context, tx *sql.Tx, keys []flowKey, lastSeen map[flowKey]int64) (map[flowKey]int64, error) {
	ids := make(map[flowKey]int64, len(keys))
	read := func(rs *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		for rs.Next() {
			var k flowKey
			var id int64
			var port int
			if err := rs.Scan(&id, &k.host, &k.dir, &k.proto, &k.local, &k.remote, &port, &k.comm, &k.peerComm); err != nil {
				rs.Close()
				return fmt.Errorf("read flow key: %w", err)
			}
			k.port = uint16(port)
			ids[k] = id
		}
		return rs.Close()
	}
	if s.d.name == postgres.name {
		// One constant statement, a column of keys per array (see
		// upsertRows).
		text := make([][]string, 7)
		ports := make([]int32, 0, len(keys))
		seen := make([]int64, 0, len(keys))
		for _, k := range keys {
			for i, v := range []string{k.host, k.dir, k.proto, k.local, k.remote, k.comm, k.peerComm} {
				text[i] = append(text[i], v)
			}
			ports = append(ports, int32(k.port))
			seen = append(seen, lastSeen[k])
		}
		q := `INSERT INTO flow_keys (` + keyColumns + `) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[], $8::text[], $9::bigint[])` + keysUpsert
		if err := read(tx.QueryContext(ctx, q, text[0], text[1], text[2], text[3], text[4], ports, text[5], text[6], seen)); err != nil {
			return nil, fmt.Errorf("write %d flow keys: %w", len(keys), err)
		}
	}
	for start := 0; start < len(keys) && s.d.name != postgres.name; {
		n := chunkRows(len(keys) - start)
		part := keys[start : start+n]
		stmt, err := s.prepared(ctx, tx, keysInsert(n))
		if err != nil {
			return nil, fmt.Errorf("write %d flow keys: %w", n, err)
		}
		args := make([]any, 0, n*9)
		for _, k := range part {
			args = append(args, k.host, k.dir, k.proto, k.local, k.remote, int(k.port), k.comm, k.peerComm, lastSeen[k])
		}
		if err := read(stmt.QueryContext(ctx, args...)); err != nil {
			return nil, fmt.Errorf("write %d flow keys: %w", n, err)
		}
		start += n
	}
	for _, k := range keys {
		if _, ok := ids[k]; !ok {
			return nil, fmt.Errorf("write flow keys: no id returned for %+v", k)
		}
	}
	return ids, nil
}

// upsertRows adds rows to level l's table: rows are first merged per
// (bucket of l, key), since one statement may not update a row twice.
func (s *Store) upsertRows(ctx context.Context, tx *sql.Tx, l level, rows []flowRow) error {
	type rk struct{ bucket, key int64 }
	merged := map[rk]*flowRow{}
	var order []rk
	for _, r := range rows {
		r.bucket = floorTo(r.bucket, l.width)
		k := rk{r.bucket, r.key}
		if m, ok := merged[k]; ok {
			m.add(r)
			continue
		}
		merged[k] = &r
		order = append(order, k)
	}
	slices.SortFunc(order, func(a, b rk) int {
		if a.bucket != b.bucket {
			return compareInt(a.bucket, b.bucket)
		}
		return compareInt(a.key, b.key)
	})
	ncol := 6 + len(counterColumns)
	if s.d.name == postgres.name {
		// One statement whatever the number of rows: a column of the
		// new rows per array, so the text is constant (pgx prepares it
		// once per connection) and nothing parses thousands of
		// placeholders.
		colArgs := make([][]int64, ncol)
		for i := range colArgs {
			colArgs[i] = make([]int64, 0, len(order))
		}
		for _, k := range order {
			r := merged[k]
			vals := append([]int64{r.bucket, r.key, int64(r.pid), int64(r.peer)}, make([]int64, len(counterColumns))...)
			for i, v := range counterFields(&r.c) {
				vals[4+i] = int64(*v)
			}
			vals = append(vals, r.first, r.last)
			for i, v := range vals {
				colArgs[i] = append(colArgs[i], v)
			}
		}
		args := make([]any, ncol)
		unnest := make([]string, ncol)
		for i := range colArgs {
			args[i] = colArgs[i]
			unnest[i] = fmt.Sprintf("$%d::bigint[]", i+1)
		}
		q := "INSERT INTO " + l.table + " (" + rowColumns + ") SELECT * FROM unnest(" + strings.Join(unnest, ", ") + ") ON CONFLICT (bucket, key_id) DO UPDATE SET " + upsertSet(l.table)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("write %d rows to %s: %w", len(order), l.table, err)
		}
		return nil
	}
	// SQLite: statements of 256, 128, ... 1 rows, each prepared once per
	// open store, so that the parser (a third of the write's time when
	// every batch had a statement of its own) runs once.
	for start := 0; start < len(order); {
		n := chunkRows(len(order) - start)
		end := start + n
		stmt, err := s.prepared(ctx, tx, rowsInsert(l.table, n))
		if err != nil {
			return fmt.Errorf("write %d rows to %s: %w", n, l.table, err)
		}
		args := make([]any, 0, n*ncol)
		for _, k := range order[start:end] {
			r := merged[k]
			args = append(args, r.bucket, r.key, int64(r.pid), int64(r.peer))
			for _, v := range counterFields(&r.c) {
				args = append(args, int64(*v))
			}
			args = append(args, r.first, r.last)
		}
		if _, err := stmt.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("write %d rows to %s: %w", n, l.table, err)
		}
		start = end
	}
	return nil
}

// chunkRows is the number of rows of the next SQLite statement: a power
// of two, at most 256, so that few statement shapes exist.
func chunkRows(left int) int {
	n := 256
	for n > left {
		n /= 2
	}
	return n
}

// prepared returns q bound to tx: prepared once per open store by
// prepareWrites, or (a shape it did not prepare) prepared for tx alone.
func (s *Store) prepared(ctx context.Context, tx *sql.Tx, q string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	st := s.stmts[q]
	s.stmtMu.Unlock()
	if st == nil {
		return tx.PrepareContext(ctx, s.d.rebind(q))
	}
	return tx.StmtContext(ctx, st), nil
}

// prepareWrites prepares, once per open SQLite store, every statement
// shape the writes use (keys and each level's rows, 1 to 256 rows per
// statement). It runs outside any transaction: SQLite has one connection,
// which a transaction holds.
func (s *Store) prepareWrites(ctx context.Context) error {
	if s.d.name == postgres.name {
		return nil
	}
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if s.stmts != nil {
		return nil
	}
	stmts := map[string]*sql.Stmt{}
	var shapes []string
	for n := 1; n <= 256; n *= 2 {
		shapes = append(shapes, keysInsert(n))
		for _, l := range levels {
			shapes = append(shapes, rowsInsert(l.table, n))
		}
	}
	for _, q := range shapes {
		st, err := s.db.PrepareContext(ctx, s.d.rebind(q))
		if err != nil {
			for _, st := range stmts {
				st.Close()
			}
			return fmt.Errorf("prepare writes: %w", err)
		}
		stmts[q] = st
	}
	s.stmts = stmts
	return nil
}

// rowColumns are the columns a write gives a flow bucket table.
var rowColumns = "bucket, key_id, pid, peer_pid, " + strings.Join(counterColumns, ", ") + ", first_seen, last_seen"

// rowsInsert adds n rows to the flow bucket table t (SQLite).
func rowsInsert(t string, n int) string {
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", 6+len(counterColumns)), ", ") + ")"
	return "INSERT INTO " + t + " (" + rowColumns + ") VALUES " + strings.TrimSuffix(strings.Repeat(row+", ", n), ", ") +
		" ON CONFLICT (bucket, key_id) DO UPDATE SET " + upsertSet(t)
}

// keysInsert adds n flow keys and returns their ids (SQLite). DO UPDATE
// (not DO NOTHING) so that RETURNING names existing keys too, and so that
// retention sees the key as recent.
func keysInsert(n int) string {
	return `INSERT INTO flow_keys (` + keyColumns + `) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, ?), ", n), ", ") + keysUpsert
}

const keyColumns = `host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm, last_seen`

const keysUpsert = ` ON CONFLICT (host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm) DO UPDATE SET
			last_seen = CASE WHEN excluded.last_seen > flow_keys.last_seen THEN excluded.last_seen ELSE flow_keys.last_seen END
			RETURNING id, host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm`

// upsertSet is the ON CONFLICT update of a flow bucket table t: maximum
// of the pids and of the latency maximum, sums, earliest first and latest
// last seen.
func upsertSet(t string) string {
	var set strings.Builder
	fmt.Fprintf(&set, "pid = CASE WHEN excluded.pid > %[1]s.pid THEN excluded.pid ELSE %[1]s.pid END,\n", t)
	fmt.Fprintf(&set, "peer_pid = CASE WHEN excluded.peer_pid > %[1]s.peer_pid THEN excluded.peer_pid ELSE %[1]s.peer_pid END,\n", t)
	for _, c := range counterColumns {
		if maxColumns[c] {
			fmt.Fprintf(&set, "%[2]s = CASE WHEN excluded.%[2]s > %[1]s.%[2]s THEN excluded.%[2]s ELSE %[1]s.%[2]s END,\n", t, c)
		} else {
			fmt.Fprintf(&set, "%[2]s = %[1]s.%[2]s + excluded.%[2]s,\n", t, c)
		}
	}
	fmt.Fprintf(&set, `first_seen = CASE WHEN excluded.first_seen < %[1]s.first_seen THEN excluded.first_seen ELSE %[1]s.first_seen END,
		last_seen = CASE WHEN excluded.last_seen > %[1]s.last_seen THEN excluded.last_seen ELSE %[1]s.last_seen END`, t)
	return set.String()
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Range selects a time range [Since, Until); a zero end is open.
//
// Counters are kept per bucket, so a range is answered at bucket
// resolution: a minute bucket wholly inside the range counts wholly; a
// minute bucket the range cuts (at most one at each end) counts if its
// events (first to last seen) overlap the range; other buckets do not
// count. Hourly and daily rollups answer for the hours and days wholly
// inside the range, which gives the same sums as the minute buckets.
type Range struct {
	Since, Until time.Time
}

func (r Range) bounds() (lo, hi int64) {
	lo, hi = math.MinInt64, math.MaxInt64
	if !r.Since.IsZero() {
		lo = r.Since.UnixNano()
	}
	if !r.Until.IsZero() {
		hi = r.Until.UnixNano()
	}
	return lo, hi
}

// segment is one part of a range answered by one table: buckets in
// [lo, hi), and with events set, only rows whose events overlap the range.
type segment struct {
	level  level
	lo, hi int64
	events bool
}

// plan splits a range into segments, answering each part from the
// coarsest level whose whole buckets fit in it. With rollups false, every
// segment reads minute buckets (used to check the rollups).
func plan(lo, hi int64, lvls []level) []segment {
	minute := lvls[0].width
	var head, tail []segment
	a, b := lo, hi
	if f := floorTo(lo, minute); f != lo {
		head = []segment{{lvls[0], f, f + minute, true}}
		a = f + minute
	}
	if f := floorTo(hi, minute); f != hi {
		if len(head) > 0 && head[0].lo == f { // both ends in one minute
			return head
		}
		tail = []segment{{lvls[0], f, f + minute, true}}
		b = f
	}
	var mid []segment
	var fill func(a, b int64, i int)
	fill = func(a, b int64, i int) {
		if a >= b {
			return
		}
		if i == 0 {
			mid = append(mid, segment{lvls[0], a, b, false})
			return
		}
		w := lvls[i].width
		c0, c1 := ceilTo(a, w), floorTo(b, w)
		if c0 >= c1 {
			fill(a, b, i-1)
			return
		}
		fill(a, c0, i-1)
		mid = append(mid, segment{lvls[i], c0, c1, false})
		fill(c1, b, i-1)
	}
	fill(a, b, len(lvls)-1)
	return joinSegments(head, mid, tail)
}

// segmentSQL selects the rows of one segment.
func segmentSQL(sg segment, cols string, lo, hi int64, args *[]any) string {
	var conds []string
	if sg.lo != math.MinInt64 {
		conds = append(conds, "bucket >= ?")
		*args = append(*args, sg.lo)
	}
	if sg.hi != math.MaxInt64 {
		conds = append(conds, "bucket < ?")
		*args = append(*args, sg.hi)
	}
	if sg.events {
		if lo != math.MinInt64 {
			conds = append(conds, "last_seen >= ?")
			*args = append(*args, lo)
		}
		if hi != math.MaxInt64 {
			conds = append(conds, "first_seen < ?")
			*args = append(*args, hi)
		}
	}
	q := "SELECT " + cols + " FROM " + sg.level.table
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	return q
}

// bounds are r's ends in nanoseconds, the start no earlier than what
// retention kept at any level, and where each level's kept history
// starts.
func (s *Store) bounds(ctx context.Context, r Range) (lo, hi int64, z retained, err error) {
	lo, hi = r.bounds()
	z, err = s.retained(ctx)
	return max(lo, z.days), hi, z, err
}

// flowSum is one flow's counters summed over the rows of a range, in the
// order of the bucket tables' columns: pid and peer_pid by maximum, the
// counters of counterColumns, first_seen by minimum, last_seen by maximum.
type flowSum struct {
	pid, peer   int64
	c           [16]int64
	first, last int64
}

// latencyMaxIndex is the one counter (connect_latency_max_us) that
// accumulates by maximum.
var latencyMaxIndex = func() int {
	for i, c := range counterColumns {
		if maxColumns[c] {
			return i
		}
	}
	panic("no maximum column")
}()

// add accumulates one bucket row the way the rollups do (the statements of
// upsertRows and rollupFrom): maximum, sums, minimum.
func (f *flowSum) add(o *flowSum) {
	f.pid = max(f.pid, o.pid)
	f.peer = max(f.peer, o.peer)
	m := max(f.c[latencyMaxIndex], o.c[latencyMaxIndex])
	for i := range f.c {
		f.c[i] += o.c[i]
	}
	f.c[latencyMaxIndex] = m
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
	if row.pid < 0 || row.peer < 0 || row.c[latencyMaxIndex] < 0 || row.last < 0 {
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

// Observations returns, for every flow with counters in r, its counters
// summed over the range (Bucket is then zero), sorted by flow key. The
// whole past days, hours and minutes of the range are read from their
// pieces where compaction built them (see pieces.go), the rest from
// rollups where the range allows (see Range), and the flows named from
// the key pack (keypack.go); SQLite's rows are summed here rather than
// in SQL: a GROUP BY over a million rows costs SQLite a sort.
func (s *Store) Observations(ctx context.Context, r Range) ([]Observation, error) {
	return s.observations(ctx, r, levels, true)
}

// observations answers r from the levels lvls, and from pieces if
// usePieces (and lvls are all the levels).
func (s *Store) observations(ctx context.Context, r Range, lvls []level, usePieces bool) ([]Observation, error) {
	lo, hi, z, err := s.bounds(ctx, r)
	if err != nil {
		return nil, err
	}
	if lo >= hi {
		return nil, nil
	}
	// The part older than the minutes kept comes from coarser rows; the
	// rest (from mlo) is planned as if nothing were older.
	old := z.old(lo, hi)
	mlo := max(lo, z.minutes)
	if c := s.cache; c != nil && len(lvls) == len(levels) && usePieces {
		// One query at a time fills and reads the cache: see cache.sync.
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []Observation
		err := s.read(ctx, func(rd reader) error {
			var err error
			out, err = c.observations(rd, lo, mlo, hi, old)
			return err
		})
		return out, err
	}
	var out []Observation
	err = s.read(ctx, func(rd reader) error {
		var segs []segment
		var pieces []pieceID
		if mlo < hi {
			segs = plan(mlo, hi, lvls)
			if len(lvls) == len(levels) && usePieces {
				var err error
				if segs, pieces, err = coldPlan(rd, mlo, hi); err != nil {
					return err
				}
			}
		}
		sm := newSums()
		if usePieces {
			if err := sumOld(rd, old, lo, hi, sm); err != nil {
				return err
			}
		} else if err := rd.sums(old, lo, hi, sm); err != nil {
			return err
		}
		if err := rd.sums(segs, mlo, hi, sm); err != nil {
			return err
		}
		if err := addPieces(rd, pieces, sm); err != nil {
			return err
		}
		if len(sm.flows) == 0 {
			return nil
		}
		var err error
		if usePieces {
			out, err = sm.namedObservations(rd, lo)
			return err
		}
		keys := make(map[int64]flowKey, len(sm.flows))
		if err := rd.keys(lo, sm.has, func(id int64, k flowKey) { keys[id] = k }); err != nil {
			return err
		}
		out, err = sm.observations(keys)
		return err
	})
	return out, err
}

// bucketColumns are the columns a range query reads from a bucket table,
// in flowSum's order.
var bucketColumns = "key_id, pid, peer_pid, " + strings.Join(counterColumns, ", ") + ", first_seen, last_seen"

// keysSQL reads the keys of every flow seen since lo: a flow with a row in
// a range starting at lo was last seen at lo or later.
func keysSQL(lo int64, args *[]any) string {
	q := `SELECT id, host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm FROM flow_keys`
	if lo != math.MinInt64 {
		q += ` WHERE last_seen >= ?`
		*args = append(*args, lo)
	}
	return q
}

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

// joinSegments concatenates segment lists in order; adjacent segments of
// one level without an event filter become one scan.
func joinSegments(lists ...[]segment) []segment {
	var merged []segment
	for _, l := range lists {
		for _, sg := range l {
			if n := len(merged); n > 0 && !sg.events && !merged[n-1].events && merged[n-1].level == sg.level && merged[n-1].hi == sg.lo {
				merged[n-1].hi = sg.hi
				continue
			}
			merged = append(merged, sg)
		}
	}
	return merged
}
