package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Open minutes (schema 12): the hour and day rows of a host's current
// minute are rolled up from its minute rows once the minute is over,
// instead of upserted with every interval's write. An agent writes every
// 5 s, so this spares two of the three row upserts of eleven intervals in
// twelve (two thirds of the agent's store write; docs/performance.md).
//
// open_minutes holds, per host, the minute held open (open_bucket, 0:
// none) and the newest minute rolled up (rolled_through). The invariant,
// kept in each write's transaction: every minute row of a host is in its
// hour and day rows, except the rows of its open minute. So:
//
//   - a write for a minute newer than the open one first rolls the open
//     one up (reading its minute rows, before this write adds to them),
//     and holds open the newest recent minute it writes that is newer than
//     rolled_through; rows of the open minute go to the minute table
//     only, every other row to all three, as before;
//   - a minute is held open only while recent (openRecent) by the
//     store's clock (PostgreSQL's own: agents' clocks differ), and never
//     before the oldest minute retention keeps: late rows (a replayed
//     spool, a host whose clock is behind) are written to every level at
//     once, so old hours never wait for a roll-up;
//   - rolled_through only moves forward, and past every minute a write
//     sends to every level: a minute already in the hour and day rows is
//     never held open (and rolled up a second time). A host's record
//     starts past its newest recent minute already stored, which a
//     deptrace before schema 12 wrote to every level;
//   - Compact, Retain and RetainLevels roll up the minutes held open
//     longer than openRecent after they ended (an agent that stopped).
//
// Readers answer an hour or a day from its row only when no host holds
// one of its minutes open: openFrom, the oldest minute held open, read in
// the query's snapshot, splits a range (planOpen); what follows it is
// read from minute rows (or their pieces). Compact builds no hour or day
// piece that reaches it.

// openRecent is how recent a minute must be to be held open, and how
// long after its end an open minute may stay open: agents write an
// interval's counters a few seconds after it ends.
const openRecent = pieceGrace

// deferRollups runs in a write's transaction, before its rows are
// written: it rolls up the open minutes the write closes and reports,
// per row, whether the row belongs to an open minute (the minute table
// only). hosts[i] is rows[i]'s host. It returns the buckets rolled up, so
// that their pieces and cached hours are invalidated with the write's.
func (s *Store) deferRollups(ctx context.Context, tx *sql.Tx, hosts []string, rows []flowRow) (minuteOnly []bool, rolled []flowRow, err error) {
	floor, err := s.openFloor(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	newest := map[string]int64{} // per host, the newest minute written
	for i, r := range rows {
		newest[hosts[i]] = max(newest[hosts[i]], r.bucket)
	}
	order := make([]string, 0, len(newest))
	for h := range newest {
		order = append(order, h)
	}
	slices.Sort(order) // concurrent writers lock state rows in one order
	open := map[string]int64{}
	for _, h := range order {
		st, err := s.lockOpenMinute(ctx, tx, h, floor)
		if err != nil {
			return nil, nil, err
		}
		was := st
		if st.open != 0 && newest[h] > st.open {
			if err := s.rollUp(ctx, tx, h, st.open); err != nil {
				return nil, nil, err
			}
			rolled = append(rolled, flowRow{bucket: st.open})
			st.rolled, st.open = st.open, 0
		}
		if st.open == 0 {
			// The newest recent minute not rolled up yet, if any.
			for i, r := range rows {
				if hosts[i] == h && r.bucket > st.rolled && r.bucket >= floor && r.bucket > st.open {
					st.open = r.bucket
				}
			}
		}
		for i, r := range rows {
			if hosts[i] == h && r.bucket != st.open {
				st.rolled = max(st.rolled, r.bucket) // in every level now
			}
		}
		if st != was {
			if _, err := tx.ExecContext(ctx, s.d.rebind(`UPDATE open_minutes SET open_bucket = ?, rolled_through = ? WHERE host_id = ?`), st.open, st.rolled, h); err != nil {
				return nil, nil, fmt.Errorf("record the open minute of %s: %w", h, err)
			}
		}
		if st.open != 0 {
			open[h] = st.open
		}
	}
	minuteOnly = make([]bool, len(rows))
	for i, r := range rows {
		if o, ok := open[hosts[i]]; ok && r.bucket == o {
			minuteOnly[i] = true
		}
	}
	return minuteOnly, rolled, nil
}

// retentionLockKey is the advisory lock (PostgreSQL) between writers
// (shared) and retention moving its cutoff (exclusive); negative, apart
// from the pieces' (pieceLockKey).
const retentionLockKey = -0x64657074726163

// openFloor is the oldest minute a write may hold open: recent by the
// store's clock, and kept by retention. On PostgreSQL the write holds
// retentionLockKey shared until it commits, so that retention's move of
// its cutoff waits for the write, and then rolls up what it opened (see
// advanceRetention). An advisory lock rather than FOR SHARE on the row: a
// waiting exclusive request holds back new shared ones, so a busy fleet of
// writers cannot keep retention waiting.
func (s *Store) openFloor(ctx context.Context, tx *sql.Tx) (int64, error) {
	var kept, now int64
	var err error
	if s.d.name == postgres.name {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, int64(retentionLockKey)); err != nil {
			return 0, fmt.Errorf("lock the retention state: %w", err)
		}
		// A statement of its own, after the lock: it sees a cutoff
		// retention committed while this waited.
		err = tx.QueryRowContext(ctx, `SELECT retained_from, (EXTRACT(EPOCH FROM clock_timestamp()) * 1e9)::bigint FROM retention_state WHERE id = 1`).Scan(&kept, &now)
	} else {
		now = time.Now().UnixNano()
		err = tx.QueryRowContext(ctx, `SELECT retained_from FROM retention_state WHERE id = 1`).Scan(&kept)
	}
	if err != nil {
		return 0, fmt.Errorf("read the retention state: %w", err)
	}
	return max(now-int64(openRecent), kept), nil
}

type openState struct{ open, rolled int64 }

// lockOpenMinute reads host's open-minute state, creating it, and on
// PostgreSQL locks its row until tx ends (SQLite: tx holds the write
// lock). A new record starts past the host's newest minute from floor on
// already stored: rows a deptrace before schema 12 wrote to every level.
func (s *Store) lockOpenMinute(ctx context.Context, tx *sql.Tx, host string, floor int64) (openState, error) {
	q := `SELECT open_bucket, rolled_through FROM open_minutes WHERE host_id = ?`
	if s.d.name == postgres.name {
		q += ` FOR UPDATE`
	}
	var st openState
	err := tx.QueryRowContext(ctx, s.d.rebind(q), host).Scan(&st.open, &st.rolled)
	if errors.Is(err, sql.ErrNoRows) {
		var stored sql.NullInt64
		if err := tx.QueryRowContext(ctx, s.d.rebind(`SELECT MAX(m.bucket) FROM flow_minutes m JOIN flow_keys k ON k.id = m.key_id WHERE m.bucket >= ? AND k.host_id = ?`),
			floorTo(floor, levels[0].width), host).Scan(&stored); err != nil {
			return st, fmt.Errorf("read the newest minute of %s: %w", host, err)
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO open_minutes (host_id, open_bucket, rolled_through) VALUES (?, 0, ?) ON CONFLICT (host_id) DO NOTHING`), host, stored.Int64); err != nil {
			return st, fmt.Errorf("record the open minute of %s: %w", host, err)
		}
		err = tx.QueryRowContext(ctx, s.d.rebind(q), host).Scan(&st.open, &st.rolled)
	}
	if err != nil {
		return st, fmt.Errorf("read the open minute of %s: %w", host, err)
	}
	return st, nil
}

// rollUp adds host's minute rows of bucket to its hour and day rows.
// Each key has one minute row per bucket, so no grouping is needed.
func (s *Store) rollUp(ctx context.Context, tx *sql.Tx, host string, bucket int64) error {
	cols := "m.pid, m.peer_pid, m." + strings.Join(counterColumns, ", m.") + ", m.first_seen, m.last_seen"
	for _, l := range levels[1:] {
		q := "INSERT INTO " + l.table + " (" + rowColumns + ") SELECT CAST(? AS BIGINT), m.key_id, " + cols +
			" FROM flow_minutes m JOIN flow_keys k ON k.id = m.key_id WHERE m.bucket = ? AND k.host_id = ?" +
			" ON CONFLICT (bucket, key_id) DO UPDATE SET " + upsertSet(l.table)
		if _, err := tx.ExecContext(ctx, s.d.rebind(q), floorTo(bucket, l.width), bucket, host); err != nil {
			return fmt.Errorf("roll up minute %d of %s into %s: %w", bucket, host, l.table, err)
		}
	}
	return nil
}

// rollUpOpen rolls up every minute held open that started before
// before, each in a transaction of its own.
func (s *Store) rollUpOpen(ctx context.Context, before int64) error {
	rs, err := s.db.QueryContext(ctx, s.d.rebind(`SELECT host_id FROM open_minutes WHERE open_bucket <> 0 AND open_bucket < ? ORDER BY host_id`), before)
	if err != nil {
		return fmt.Errorf("read the open minutes: %w", err)
	}
	var hosts []string
	for rs.Next() {
		var h string
		if err := rs.Scan(&h); err != nil {
			rs.Close()
			return fmt.Errorf("read the open minutes: %w", err)
		}
		hosts = append(hosts, h)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return fmt.Errorf("read the open minutes: %w", err)
	}
	for _, h := range hosts {
		if err := s.inTx(ctx, func(tx *sql.Tx) error {
			st, err := s.lockOpenMinute(ctx, tx, h, math.MaxInt64)
			if err != nil || st.open == 0 || st.open >= before {
				return err // the host's own write got there first
			}
			if err := s.rollUp(ctx, tx, h, st.open); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, s.d.rebind(`UPDATE open_minutes SET open_bucket = 0, rolled_through = ? WHERE host_id = ?`), st.open, h); err != nil {
				return fmt.Errorf("record the roll-up of %s: %w", h, err)
			}
			rolled := []flowRow{{bucket: st.open}}
			if err := s.invalidatePieces(ctx, tx, rolled); err != nil {
				return err
			}
			return s.logWrite(ctx, tx, rolled)
		}); err != nil {
			return err
		}
	}
	return nil
}

// openFromSQL reads the oldest minute held open (NULL: none).
const openFromSQL = `SELECT MIN(open_bucket) FROM open_minutes WHERE open_bucket <> 0`

// openFromTx is openFrom in a write transaction (math.MaxInt64: none).
func openFromTx(ctx context.Context, tx *sql.Tx) (int64, error) {
	var w sql.NullInt64
	if err := tx.QueryRowContext(ctx, openFromSQL).Scan(&w); err != nil {
		return 0, fmt.Errorf("read the open minutes: %w", err)
	}
	if !w.Valid {
		return math.MaxInt64, nil
	}
	return w.Int64, nil
}

// planOpen is plan for a store where minutes from w on may be held open:
// the part of [lo, hi) from w is read from minute rows only.
func planOpen(lo, hi, w int64, lvls []level) []segment {
	switch {
	case w >= hi:
		return plan(lo, hi, lvls)
	case w <= lo:
		return plan(lo, hi, lvls[:1])
	}
	return joinSegments(plan(lo, w, lvls), plan(w, hi, lvls[:1]))
}

// coldPlanOpen is coldPlan for a store where minutes from w on may be
// held open (see planOpen).
func coldPlanOpen(rd reader, lo, hi, w int64) ([]segment, []pieceID, error) {
	if w >= hi {
		return coldPlan(rd, lo, hi)
	}
	var segs []segment
	var pieces []pieceID
	if lo < w {
		var err error
		if segs, pieces, err = coldPlan(rd, lo, w); err != nil {
			return nil, nil, err
		}
	}
	return joinSegments(segs, plan(max(lo, w), hi, levels[:1])), pieces, nil
}

// wholeBucket reports whether no host holds a minute of piece id's
// bucket open, in tx (which holds the piece's lock).
func wholeBucket(ctx context.Context, tx *sql.Tx, id pieceID) (bool, error) {
	if id.level == 0 {
		return true, nil
	}
	w, err := openFromTx(ctx, tx)
	if err != nil {
		return false, err
	}
	return id.bucket+levels[id.level].width <= w, nil
}
