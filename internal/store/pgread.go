package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// pgAggregates sums a flow's rows in bucketColumns' order, with sum8 (a
// bigint state, see migration 6) rather than SUM (a 128-bit or numeric
// state allocated per flow and column, then cast back).
var pgAggregates = func() string {
	out := []string{"key_id", "MAX(pid)", "MAX(peer_pid)"}
	for _, c := range counterColumns {
		out = append(out, aggregate(c, "sum8"))
	}
	return strings.Join(append(out, "MIN(first_seen)", "MAX(last_seen)"), ", ")
}()

// pgRead runs fn with a reader on one read-only repeatable-read
// transaction, which gives every statement the same snapshot, through pgx
// itself rather than database/sql: sums come in binary and are decoded in
// place (eight bytes per column, no value boxed or allocated).
//
// JIT is off (compiling a plan took longer than running it) and so are
// parallel workers (each would build the whole hash table of flows, then
// sort and merge them), and the hash table of every flow fits in memory
// rather than in batches on disk (measured, see docs/performance.md).
func (s *Store) pgRead(ctx context.Context, fn func(reader) error) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("begin query: %w", err)
	}
	defer func() { _ = c.Close() }() // returns a read connection to the pool
	return c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("begin query: connection is a %T, not pgx", dc)
		}
		tx, err := sc.Conn().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return fmt.Errorf("begin query: %w", err)
		}
		defer func() { _ = tx.Rollback(ctx) }() // a read-only snapshot: nothing to commit
		for _, set := range []string{"SET LOCAL jit = off", "SET LOCAL max_parallel_workers_per_gather = 0", "SET LOCAL work_mem = '256MB'"} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return fmt.Errorf("query settings: %w", err)
			}
		}
		return fn(&pgReader{ctx: ctx, tx: tx, d: s.d})
	})
}

type pgReader struct {
	ctx context.Context
	tx  pgx.Tx
	d   dialect
}

// flowRows reads q's rows, extra leading bigints then bucketColumns (or
// their aggregates), in binary.
func (r *pgReader) flowRows(q string, args []any, extra int, fn func(lead []int64, key int64, row *flowSum)) error {
	rows, err := r.tx.Query(r.ctx, r.d.rebind(q), append([]any{pgx.QueryResultFormats{pgx.BinaryFormatCode}}, args...)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var row flowSum
	lead := make([]int64, extra)
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != extra+3+len(row.c)+2 {
			return fmt.Errorf("%d columns, want %d", len(vals), extra+5+len(row.c))
		}
		var bad bool
		get := func(b []byte) int64 {
			if len(b) != 8 {
				bad = true
				return 0
			}
			return int64(binary.BigEndian.Uint64(b))
		}
		for i := range lead {
			lead[i] = get(vals[i])
		}
		vals = vals[extra:]
		key := get(vals[0])
		row.pid, row.peer = get(vals[1]), get(vals[2])
		for i := range row.c {
			row.c[i] = get(vals[3+i])
		}
		row.first, row.last = get(vals[3+len(row.c)]), get(vals[4+len(row.c)])
		if bad {
			return fmt.Errorf("a column is not a binary bigint")
		}
		fn(lead, key, &row)
	}
	rows.Close()
	return rows.Err()
}

// sums: PostgreSQL sums in C what would otherwise cross the socket row
// by row: one row per flow comes back.
func (r *pgReader) sums(segs []segment, lo, hi int64, sm *sums) error {
	if len(segs) == 0 {
		return nil
	}
	var args []any
	var parts []string
	for _, sg := range segs {
		parts = append(parts, segmentSQL(sg, bucketColumns, lo, hi, &args))
	}
	q := "SELECT " + pgAggregates + " FROM (" + strings.Join(parts, "\n UNION ALL ") + ") u GROUP BY key_id"
	if err := r.flowRows(q, args, 0, func(_ []int64, key int64, row *flowSum) { sm.add(key, row) }); err != nil {
		return fmt.Errorf("read bucket tables: %w", err)
	}
	return nil
}

func (r *pgReader) buckets(l level, from, to int64, fn func(bucket, key int64, row *flowSum)) error {
	q := "SELECT bucket, " + bucketColumns + " FROM " + l.table + " WHERE bucket >= ? AND bucket < ?"
	if err := r.flowRows(q, []any{from, to}, 1, func(lead []int64, key int64, row *flowSum) { fn(lead[0], key, row) }); err != nil {
		return fmt.Errorf("read %s: %w", l.table, err)
	}
	return nil
}

func (r *pgReader) keyRows(q string, args []any, want func(int64) bool, fn func(int64, flowKey)) error {
	rows, err := r.tx.Query(r.ctx, r.d.rebind(q), args...)
	if err != nil {
		return fmt.Errorf("query flow keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k flowKey
		var id int64
		var port int32
		if err := rows.Scan(&id, &k.host, &k.dir, &k.proto, &k.local, &k.remote, &port, &k.comm, &k.peerComm); err != nil {
			return fmt.Errorf("read flow key: %w", err)
		}
		if want == nil || want(id) {
			k.port = uint16(port)
			fn(id, k)
		}
	}
	return rows.Err()
}

func (r *pgReader) keys(lo int64, want func(int64) bool, fn func(int64, flowKey)) error {
	var args []any
	return r.keyRows(keysSQL(lo, &args), args, want, fn)
}

func (r *pgReader) keysByID(ids []int64, fn func(int64, flowKey)) error {
	var none []any
	return r.keyRows(keysSQL(math.MinInt64, &none)+" WHERE id = ANY($1)", []any{ids}, nil, fn)
}

// logSince: transactions commit in any order, so what the cache has not
// seen is what its last snapshot did not show: entries of transactions
// that had not committed then.
func (r *pgReader) logSince(pos logPos) ([]int64, bool, logPos, error) {
	next := pos
	var lost bool
	err := r.tx.QueryRow(r.ctx, `SELECT pg_current_snapshot()::text, COALESCE($1::text = '' OR
		(SELECT pruned_through FROM write_log_state WHERE id = 1) >= pg_snapshot_xmin(NULLIF($1::text, '')::pg_snapshot)::text::bigint, true)`,
		pos.snap).Scan(&next.snap, &lost)
	if err != nil {
		return nil, false, pos, fmt.Errorf("read the write log: %w", err)
	}
	if pos.snap == "" {
		return nil, false, next, nil
	}
	rows, err := r.tx.Query(r.ctx, `SELECT DISTINCT bucket FROM write_log
		WHERE xid >= pg_snapshot_xmin($1::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, $1::pg_snapshot)`, pos.snap)
	if err != nil {
		return nil, false, pos, fmt.Errorf("read the write log: %w", err)
	}
	defer rows.Close()
	var hours []int64
	for rows.Next() {
		var b int64
		if err := rows.Scan(&b); err != nil {
			return nil, false, pos, fmt.Errorf("read the write log: %w", err)
		}
		hours = append(hours, b)
	}
	if err := rows.Err(); err != nil {
		return nil, false, pos, fmt.Errorf("read the write log: %w", err)
	}
	return hours, lost, next, nil
}

func (r *pgReader) openFrom() (int64, error) {
	var from *int64
	if err := r.tx.QueryRow(r.ctx, openFromSQL).Scan(&from); err != nil {
		return 0, fmt.Errorf("read the open minutes: %w", err)
	}
	if from == nil {
		return math.MaxInt64, nil
	}
	return *from, nil
}

func (r *pgReader) oldest() (int64, error) {
	var from *int64
	if err := r.tx.QueryRow(r.ctx, `SELECT MIN(bucket) FROM flow_minutes`).Scan(&from); err != nil {
		return 0, fmt.Errorf("read the oldest bucket: %w", err)
	}
	if from == nil {
		return math.MaxInt64, nil
	}
	return *from, nil
}

func (r *pgReader) pieceDir(l int, from, to int64, fn func(pieceID)) error {
	var args []any
	rows, err := r.tx.Query(r.ctx, r.d.rebind(pieceDirSQL(l, from, to, &args)), args...)
	if err != nil {
		return fmt.Errorf("read the pieces stored: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var b int64
		if err := rows.Scan(&b); err != nil {
			return fmt.Errorf("read the pieces stored: %w", err)
		}
		fn(pieceID{l, b})
	}
	return rows.Err()
}

func (r *pgReader) pieces(ids []pieceID, fn func(pieceID, []byte) error) error {
	if len(ids) == 0 {
		return nil
	}
	lv := make([]int32, len(ids))
	bs := make([]int64, len(ids))
	for i, id := range ids {
		lv[i], bs[i] = int32(id.level), id.bucket
	}
	rows, err := r.tx.Query(r.ctx, `SELECT p.level, p.bucket, p.data FROM flow_pieces p JOIN unnest($1::int[], $2::bigint[]) AS w(l, b)
		ON p.level = w.l AND p.bucket = w.b`, pgx.QueryResultFormats{pgx.BinaryFormatCode}, lv, bs)
	if err != nil {
		return fmt.Errorf("read pieces: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != 3 || len(vals[0]) != 4 || len(vals[1]) != 8 {
			return fmt.Errorf("read pieces: unexpected columns")
		}
		id := pieceID{int(int32(binary.BigEndian.Uint32(vals[0]))), int64(binary.BigEndian.Uint64(vals[1]))}
		if err := fn(id, vals[2]); err != nil {
			return err
		}
	}
	rows.Close()
	return rows.Err()
}

func (r *pgReader) keyPack() (*keyPack, error) {
	rows, err := r.tx.Query(r.ctx, `SELECT data FROM key_pack WHERE id = 1`, pgx.QueryResultFormats{pgx.BinaryFormatCode})
	if err != nil {
		return nil, fmt.Errorf("read the key pack: %w", err)
	}
	defer rows.Close()
	var p *keyPack
	for rows.Next() {
		if p, err = decodeKeyPack(rows.RawValues()[0]); err != nil {
			return nil, fmt.Errorf("read the key pack: %w", err)
		}
	}
	return p, rows.Err()
}
