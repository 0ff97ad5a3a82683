package store

import (
	"context"
	"encoding/binary"
	"fmt"
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
		if maxColumns[c] {
			out = append(out, "MAX("+c+")")
		} else {
			out = append(out, "sum8("+c+")")
		}
	}
	return strings.Join(append(out, "MIN(first_seen)", "MAX(last_seen)"), ", ")
}()

// pgSums reads the segments' rows summed per flow (GROUP BY in
// PostgreSQL), and the flow keys, through pgx itself rather than
// database/sql: the sums come in binary and are decoded in place (eight
// bytes per column, no value boxed or allocated).
//
// One read-only repeatable-read transaction gives every statement the same
// snapshot. JIT is off (compiling a plan took longer than running it) and
// so are parallel workers (each would build the whole hash table of
// flows, then sort and merge them), and the hash table of every flow
// fits in memory rather than in batches on disk (measured, see
// docs/performance.md).
func (s *Store) pgSums(ctx context.Context, segs []segment, lo, hi int64) (*sums, map[int64]flowKey, error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("begin query: %w", err)
	}
	defer c.Close()
	var sm *sums
	var keys map[int64]flowKey
	err = c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("begin query: connection is a %T, not pgx", dc)
		}
		tx, err := sc.Conn().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return fmt.Errorf("begin query: %w", err)
		}
		defer tx.Rollback(ctx)
		for _, set := range []string{"SET LOCAL jit = off", "SET LOCAL max_parallel_workers_per_gather = 0", "SET LOCAL work_mem = '256MB'"} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return fmt.Errorf("query settings: %w", err)
			}
		}
		sm = newSums()
		var row flowSum
		var args []any
		var parts []string
		for _, sg := range segs {
			parts = append(parts, segmentSQL(sg, bucketColumns, lo, hi, &args))
		}
		// PostgreSQL sums in C what would otherwise cross the socket row
		// by row: one row per flow comes back.
		q := s.d.rebind("SELECT " + pgAggregates + " FROM (" + strings.Join(parts, "\n UNION ALL ") + ") u GROUP BY key_id")
		{
			sg := segment{level: level{table: "bucket tables"}}
			rows, err := tx.Query(ctx, q, append([]any{pgx.QueryResultFormats{pgx.BinaryFormatCode}}, args...)...)
			if err != nil {
				return fmt.Errorf("query %s: %w", sg.level.table, err)
			}
			for rows.Next() {
				vals := rows.RawValues()
				if len(vals) != 3+len(row.c)+2 {
					rows.Close()
					return fmt.Errorf("read %s: %d columns, want %d", sg.level.table, len(vals), 5+len(row.c))
				}
				var bad bool
				get := func(b []byte) int64 {
					if len(b) != 8 {
						bad = true
						return 0
					}
					return int64(binary.BigEndian.Uint64(b))
				}
				key := get(vals[0])
				row.pid, row.peer = get(vals[1]), get(vals[2])
				for i := range row.c {
					row.c[i] = get(vals[3+i])
				}
				row.first, row.last = get(vals[3+len(row.c)]), get(vals[4+len(row.c)])
				if bad {
					rows.Close()
					return fmt.Errorf("read %s: a column is not a binary bigint", sg.level.table)
				}
				sm.add(key, &row)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("read %s: %w", sg.level.table, err)
			}
		}
		if len(sm.flows) == 0 {
			return nil
		}
		args = nil
		rows, err := tx.Query(ctx, s.d.rebind(keysSQL(lo, &args)), args...)
		if err != nil {
			return fmt.Errorf("query flow keys: %w", err)
		}
		defer rows.Close()
		keys = make(map[int64]flowKey, len(sm.flows))
		for rows.Next() {
			var k flowKey
			var id int64
			var port int32
			if err := rows.Scan(&id, &k.host, &k.dir, &k.proto, &k.local, &k.remote, &port, &k.comm, &k.peerComm); err != nil {
				return fmt.Errorf("read flow key: %w", err)
			}
			if sm.has(id) {
				k.port = uint16(port)
				keys[id] = k
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, nil, err
	}
	return sm, keys, nil
}
