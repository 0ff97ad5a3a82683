package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// logWrite appends the hours rows touched to the write log, in the
// writer's transaction (see migration 7 and cache.go), and prunes the log
// at most once an hour per open store.
func (s *Store) logWrite(ctx context.Context, tx *sql.Tx, rowSets ...[]flowRow) error {
	hour := levels[1].width
	var hours []int64
	for _, rows := range rowSets {
		for _, r := range rows {
			if h := floorTo(r.bucket, hour); !slices.Contains(hours, h) {
				hours = append(hours, h)
			}
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
