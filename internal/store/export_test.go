package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
)

// MigrationV1 is the first released schema, to test upgrades from it.
var MigrationV1 = migrations[0]

// DB exposes the database to tests that prepare an old schema or check
// tables directly.
func (s *Store) DB() *sql.DB { return s.db }

// Rebind writes q's ? placeholders as the store's database wants them.
func (s *Store) Rebind(q string) string { return s.d.rebind(q) }

// ObservationsFromMinutes answers a range from minute buckets only,
// ignoring rollups: the reference the rollups must equal.
func (s *Store) ObservationsFromMinutes(ctx context.Context, r Range) ([]Observation, error) {
	return s.observations(ctx, r, levels[:1], false)
}

// ObservationsWithoutPieces answers a range from the rows of the minute,
// hour and day tables, as schema 7 did.
func (s *Store) ObservationsWithoutPieces(ctx context.Context, r Range) ([]Observation, error) {
	return s.observations(ctx, r, levels, false)
}

// ListenersFromMinutes is Listeners from minute buckets only.
func (s *Store) ListenersFromMinutes(ctx context.Context, r Range) ([]Listener, error) {
	return s.listeners(ctx, r, levels[:1])
}

// RollupRow is one row of a flow bucket table, for comparing levels.
type RollupRow struct {
	Bucket, Key, PID, PeerPID int64
	Counters                  [20]int64
	First, Last               int64
}

// RollupTables names the flow rollup tables and their bucket widths.
func RollupTables() map[string]int64 {
	m := map[string]int64{}
	for _, l := range levels[1:] {
		m[l.table] = l.width
	}
	return m
}

// ReadRollup reads a flow rollup table, or (width > 0) sums the minute
// rows into buckets of width the way the rollup must.
func (s *Store) ReadRollup(ctx context.Context, table string, width int64) (map[[2]int64]RollupRow, error) {
	cols := "bucket, key_id, pid, peer_pid, " + strings.Join(counterColumns, ", ") + ", first_seen, last_seen"
	q := "SELECT " + cols + " FROM " + table
	if width > 0 {
		b := fmt.Sprintf("bucket - (bucket %% %d)", width)
		var aggs []string
		for _, c := range counterColumns {
			aggs = append(aggs, aggregate(c, "SUM"))
		}
		q = "SELECT " + b + ", key_id, MAX(pid), MAX(peer_pid), " + strings.Join(aggs, ", ") + ", MIN(first_seen), MAX(last_seen) FROM flow_minutes GROUP BY " + b + ", key_id"
	}
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[[2]int64]RollupRow{}
	for rows.Next() {
		var r RollupRow
		dest := []any{&r.Bucket, &r.Key, &r.PID, &r.PeerPID}
		for i := range r.Counters {
			dest = append(dest, &r.Counters[i])
		}
		dest = append(dest, &r.First, &r.Last)
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out[[2]int64{r.Bucket, r.Key}] = r
	}
	return out, rows.Err()
}

// PlanRows counts the bucket rows a range reads, per table, and under
// "flow_pieces" the pieces it reads.
func (s *Store) PlanRows(ctx context.Context, r Range) (map[string]int64, error) {
	lo, hi, z, err := s.bounds(ctx, r)
	if err != nil {
		return nil, err
	}
	lo = max(lo, z.minutes)
	var segs []segment
	var pieces []pieceID
	if err := s.read(ctx, func(rd reader) error {
		var err error
		segs, pieces, err = coldPlan(rd, lo, hi)
		return err
	}); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, sg := range segs {
		var args []any
		q := segmentSQL(sg, "COUNT(*)", lo, hi, &args)
		var n int64
		if err := s.db.QueryRowContext(ctx, s.d.rebind(q), args...).Scan(&n); err != nil {
			return nil, err
		}
		out[sg.level.table] += n
	}
	if len(pieces) > 0 {
		out["flow_pieces"] = int64(len(pieces))
	}
	return out, nil
}

// PiecesMatchRows checks every stored piece against the rows of its
// bucket, value by value, and returns how many it checked and how many
// flows they held.
func (s *Store) PiecesMatchRows(ctx context.Context) (pieces, flows int, err error) {
	var ids []pieceID
	rs, err := s.db.QueryContext(ctx, `SELECT level, bucket FROM flow_pieces ORDER BY level, bucket`)
	if err != nil {
		return 0, 0, err
	}
	for rs.Next() {
		var id pieceID
		if err := rs.Scan(&id.level, &id.bucket); err != nil {
			rs.Close()
			return 0, 0, err
		}
		ids = append(ids, id)
	}
	rs.Close()
	err = s.read(ctx, func(rd reader) error {
		got := map[pieceID]*piece{}
		if err := rd.pieces(ids, func(id pieceID, data []byte) error {
			p, err := decodePiece(id.bucket, data)
			got[id] = p
			return err
		}); err != nil {
			return err
		}
		for _, id := range ids {
			p := got[id]
			if p == nil {
				return fmt.Errorf("piece %+v listed but not read", id)
			}
			l := levels[id.level]
			want := map[int64]flowSum{}
			if err := rd.buckets(l, id.bucket, id.bucket+l.width, func(_, key int64, row *flowSum) { want[key] = *row }); err != nil {
				return err
			}
			if len(want) != len(p.ids) {
				return fmt.Errorf("piece %s %d: %d flows, its rows %d", l.table, id.bucket, len(p.ids), len(want))
			}
			for i, key := range p.ids {
				w, ok := want[key]
				if !ok {
					return fmt.Errorf("piece %s %d: flow %d has no row", l.table, id.bucket, key)
				}
				for f := 0; f < flowSumFields; f++ {
					var v int64
					if p.cols[f] != nil {
						v = p.cols[f][i]
					}
					if v != w.fields()[f] {
						return fmt.Errorf("piece %s %d: flow %d value %d is %d, its row %d", l.table, id.bucket, key, f, v, w.fields()[f])
					}
				}
			}
			pieces++
			flows += len(p.ids)
		}
		return nil
	})
	return pieces, flows, err
}

// PiecesQueued counts the buckets queued for Compact by late writes.
func (s *Store) PiecesQueued(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM piece_todo`).Scan(&n)
	return n, err
}

// ObservationsSQL answers a range from minute buckets only, summed by
// SQL's own SUM, MAX and MIN with a GROUP BY and joined to the keys in
// SQL: a reference independent of the Go sums (SQLite) and of sum8
// (PostgreSQL) that Observations uses.
func (s *Store) ObservationsSQL(ctx context.Context, r Range) ([]Observation, error) {
	lo, hi, z, err := s.bounds(ctx, r)
	lo = max(lo, z.minutes) // from minute rows: only where they are kept
	if err != nil || lo >= hi {
		return nil, err
	}
	var args []any
	var parts []string
	for _, sg := range plan(lo, hi, levels[:1]) {
		parts = append(parts, segmentSQL(sg, bucketColumns, lo, hi, &args))
	}
	if len(parts) == 0 {
		return nil, nil
	}
	agg := "MAX(pid), MAX(peer_pid)"
	for _, c := range counterColumns {
		if maxColumns[c] || minColumns[c] {
			agg += ", " + aggregate(c, "")
		} else {
			agg += ", CAST(SUM(" + c + ") AS BIGINT)"
		}
	}
	q := `SELECT k.host_id, k.direction, k.proto, k.local_addr, k.remote_addr, k.port, k.comm, k.peer_comm, a.*
		FROM (SELECT key_id, ` + agg + `, MIN(first_seen), MAX(last_seen) FROM (` + strings.Join(parts, " UNION ALL ") + `) u GROUP BY key_id) a
		JOIN flow_keys k ON k.id = a.key_id`
	rows, err := s.db.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Observation
	for rows.Next() {
		var o Observation
		var port int
		var key, pid, peer, first, last int64
		var c [20]int64
		dest := []any{&o.HostID, &o.Direction, &o.Proto, &o.LocalAddr, &o.RemoteAddr, &port, &o.Comm, &o.PeerComm, &key, &pid, &peer}
		for i := range c {
			dest = append(dest, &c[i])
		}
		dest = append(dest, &first, &last)
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		o.Port, o.PID, o.PeerPID = uint16(port), uint32(pid), uint32(peer)
		for i, f := range counterFields(&o.Counters) {
			*f = uint64(c[i])
		}
		o.FirstSeen, o.LastSeen = fromNs(first), fromNs(last)
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b Observation) int { return keyOf(a).compare(keyOf(b)) })
	if err := rows.Err(); err != nil {
		return nil, err
	}
	lo0, _ := r.bounds()
	return out, s.nameObservations(ctx, lo0, out)
}

// DNSFromMinutes is DNS from minute buckets only.
func (s *Store) DNSFromMinutes(ctx context.Context, r Range) ([]DNSObservation, error) {
	return s.dns(ctx, r, levels[:1])
}

// PruneWriteLog prunes the write log of entries written before cutoff,
// as writers do once an hour.
func (s *Store) PruneWriteLog(ctx context.Context, cutoff int64) error {
	return s.inTx(ctx, func(tx *sql.Tx) error { return s.pruneWriteLog(ctx, tx, cutoff) })
}

// TableBytes is the space each of deptrace's tables takes with its
// indexes (SQLite: its pages, as dbstat counts them; PostgreSQL:
// pg_total_relation_size).
func (s *Store) TableBytes(ctx context.Context) (map[string]int64, error) {
	q := `SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d JOIN sqlite_schema m ON m.name = d.name GROUP BY m.tbl_name`
	var args []any
	if s.d.name == postgres.name {
		q, args = `SELECT t, pg_total_relation_size(to_regclass(t)) FROM unnest($1::text[]) t`, []any{storeTables}
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var t string
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			return nil, err
		}
		out[t] = n
	}
	return out, rows.Err()
}

// PieceBytes is the length of the pieces' data per level.
func (s *Store) PieceBytes(ctx context.Context) (map[int]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT level, SUM(LENGTH(data)) FROM flow_pieces GROUP BY level`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var l int
		var n int64
		if err := rows.Scan(&l, &n); err != nil {
			return nil, err
		}
		out[l] = n
	}
	return out, rows.Err()
}

// RowShapesFellBack is the number of row shapes the writes since the last
// prepareWrites wrote with the statement of every column, for want of
// their own (0 for PostgreSQL, which has no such statements).
func (s *Store) RowShapesFellBack() int {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	return len(s.stmtsWanted)
}
