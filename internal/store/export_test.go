package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// MigrationV1 is the first released schema, to test upgrades from it.
var MigrationV1 = migrations[0]

// DB exposes the database to tests that prepare an old schema or check
// tables directly.
func (s *Store) DB() *sql.DB { return s.db }

// ObservationsFromMinutes answers a range from minute buckets only,
// ignoring rollups: the reference the rollups must equal.
func (s *Store) ObservationsFromMinutes(ctx context.Context, r Range) ([]Observation, error) {
	return s.observations(ctx, r, levels[:1])
}

// ListenersFromMinutes is Listeners from minute buckets only.
func (s *Store) ListenersFromMinutes(ctx context.Context, r Range) ([]Listener, error) {
	return s.listeners(ctx, r, levels[:1])
}

// RollupRow is one row of a flow bucket table, for comparing levels.
type RollupRow struct {
	Bucket, Key, PID, PeerPID int64
	Counters                  [16]int64
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
			if maxColumns[c] {
				aggs = append(aggs, "MAX("+c+")")
			} else {
				aggs = append(aggs, "SUM("+c+")")
			}
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

// PlanRows counts the bucket rows a range reads, per table.
func (s *Store) PlanRows(ctx context.Context, r Range) (map[string]int64, error) {
	lo, hi, err := s.bounds(ctx, r)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, sg := range plan(lo, hi, levels) {
		var args []any
		q := segmentSQL(sg, "COUNT(*)", lo, hi, &args)
		var n int64
		if err := s.db.QueryRowContext(ctx, s.d.rebind(q), args...).Scan(&n); err != nil {
			return nil, err
		}
		out[sg.level.table] += n
	}
	return out, nil
}
