package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Pieces (schema 8): the sums of one sealed bucket (a past minute, hour or
// day) for every flow with counters in it, in one row of flow_pieces,
// packed by column (see encodePiece). A cold query reads a past hour as
// one piece instead of one 21-column row per flow: SQLite spends about
// 1.5 µs per such row (docs/performance.md), a piece about 50 ns per flow
// to decode and add.
//
// Pieces are built after the fact by Compact (which Write starts in the
// background at most once a minute), from the rows of their own level's
// table; the rows stay the truth. A piece is only ever used when present,
// and present only while it equals its rows:
//
//   - a write of flow counters deletes, in its transaction, the pieces of
//     every minute, hour and day it touches (normal writes touch the
//     current ones, which have none; a late write, as from a replayed
//     spool, removes the stale piece and queues the bucket in piece_todo
//     for Compact to build again);
//   - Compact builds a piece from the rows it reads in the same
//     transaction. On PostgreSQL, transactions run concurrently, so a
//     writer holds a shared advisory lock on each bucket it touches from
//     before it checks for pieces until it commits, and Compact holds the
//     exclusive one while it reads and stores: either Compact's read sees
//     the write, or the write sees (and deletes) the piece. On SQLite one
//     writer at a time does the same.
//
// Which buckets have pieces is therefore only a matter of speed, never of
// the answer: a bucket without one is read from its rows as before.

// pieceGrace is how long after a bucket ends Compact leaves it alone:
// agents write an interval's counters a few seconds after it ends.
const pieceGrace = 2 * time.Minute

// pieceLockKey is the advisory lock (PostgreSQL) of one bucket's piece.
func pieceLockKey(id pieceID) int64 {
	return id.bucket/int64(time.Second)*4 + int64(id.level)
}

// invalidatePieces runs in a write's transaction, after its rows: it
// deletes the pieces of the buckets the rows touched and queues those
// Compact has passed to be built again (see the top of this file).
func (s *Store) invalidatePieces(ctx context.Context, tx *sql.Tx, rowSets ...[]flowRow) error {
	var ids []pieceID
	for _, rows := range rowSets {
		for _, r := range rows {
			for i, l := range levels {
				if id := (pieceID{i, floorTo(r.bucket, l.width)}); !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
		}
	}
	if s.d.name == postgres.name {
		keys := make([]int64, len(ids))
		for i, id := range ids {
			keys[i] = pieceLockKey(id)
		}
		slices.Sort(keys)
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared(k) FROM unnest($1::bigint[]) AS k`, keys); err != nil {
			return fmt.Errorf("lock the pieces of the buckets written: %w", err)
		}
	}
	// After the locks: a statement of its own, so that it sees what
	// Compact committed while this waited.
	done, err := compactedThrough(ctx, tx, s.d)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if id.bucket > done[id.level] {
			continue // Compact has not come this far: no piece
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM flow_pieces WHERE level = ? AND bucket = ?`), id.level, id.bucket); err != nil {
			return fmt.Errorf("delete a stale piece: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO piece_todo (level, bucket) VALUES (?, ?) ON CONFLICT (level, bucket) DO NOTHING`), id.level, id.bucket); err != nil {
			return fmt.Errorf("queue a piece: %w", err)
		}
	}
	return nil
}

// compactedThrough reads, per level, the newest bucket Compact has passed.
func compactedThrough(ctx context.Context, tx *sql.Tx, d dialect) ([]int64, error) {
	done := make([]int64, len(levels))
	rs, err := tx.QueryContext(ctx, `SELECT level, done_through FROM piece_state`)
	if err != nil {
		return nil, fmt.Errorf("read the compaction state: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var l int
		var v int64
		if err := rs.Scan(&l, &v); err != nil {
			return nil, fmt.Errorf("read the compaction state: %w", err)
		}
		if l >= 0 && l < len(done) {
			done[l] = v
		}
	}
	return done, rs.Err()
}

// CompactStats counts what Compact did.
type CompactStats struct {
	// Pieces built (or rebuilt), and the bucket rows they were built
	// from; Todo of them were late writes' buckets.
	Pieces, Todo int
	Rows         int64
	// Busy: a bucket was locked by another writer or compactor; a later
	// run carries on.
	Busy bool
}

// Compact builds the pieces of every sealed bucket (one that ended
// pieceGrace before now) that has none yet, coarsest level first, and
// rebuilds those late writes deleted. It stops early, without error, when
// ctx is done (each piece is its own transaction, so what it built
// stays). Any number of store handles may run it at once, on one store.
func (s *Store) Compact(ctx context.Context, now time.Time) (CompactStats, error) {
	var st CompactStats
	err := s.compact(ctx, now.UnixNano(), &st)
	if ctx.Err() != nil {
		err = nil // stopped: whatever failed, failed because of it
	}
	return st, err
}

func (s *Store) compact(ctx context.Context, now int64, st *CompactStats) error {
	// Minutes held open by hosts that stopped writing are rolled up
	// first: until then their hours and days get no piece.
	if err := s.rollUpOpen(ctx, now-int64(openRecent)-levels[0].width); err != nil {
		return err
	}
	// Late writes' buckets first: they were compacted once, so they are
	// sealed.
	var todo []pieceID
	rs, err := s.db.QueryContext(ctx, `SELECT level, bucket FROM piece_todo ORDER BY level DESC, bucket LIMIT 10000`)
	if err != nil {
		return fmt.Errorf("read the pieces to rebuild: %w", err)
	}
	for rs.Next() {
		var id pieceID
		if err := rs.Scan(&id.level, &id.bucket); err != nil {
			rs.Close()
			return fmt.Errorf("read the pieces to rebuild: %w", err)
		}
		todo = append(todo, id)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return fmt.Errorf("read the pieces to rebuild: %w", err)
	}
	for _, id := range todo {
		if id.level < 0 || id.level >= len(levels) {
			continue
		}
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			// SQLite: a write first, so that the transaction holds the
			// write lock and reads the latest rows.
			res, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM piece_todo WHERE level = ? AND bucket = ?`), id.level, id.bucket)
			if err != nil {
				return fmt.Errorf("dequeue a piece: %w", err)
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return nil // another compactor did it
			}
			if whole, err := wholeBucket(ctx, tx, id); err != nil {
				return err
			} else if !whole {
				return errBusy // a minute of it is held open: later
			}
			if ok, err := s.lockPiece(ctx, tx, id); err != nil {
				return err
			} else if !ok {
				st.Busy = true
				return errBusy
			}
			st.Todo++
			return s.buildPiece(ctx, tx, id, st)
		})
		if errors.Is(err, errBusy) {
			continue // rolled back: still queued
		}
		if err != nil {
			return err
		}
	}
	for i := len(levels) - 1; i >= 0; i-- {
		l := levels[i]
		last := floorTo(now-int64(pieceGrace), l.width) - l.width // the newest sealed bucket
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			var more bool
			err := s.inTx(ctx, func(tx *sql.Tx) error {
				if s.d.name != postgres.name {
					// Take the write lock before reading (see above).
					if _, err := tx.ExecContext(ctx, `UPDATE piece_state SET done_through = done_through WHERE level = ?`, i); err != nil {
						return fmt.Errorf("lock the compaction state: %w", err)
					}
				}
				done, err := compactedThrough(ctx, tx, s.d)
				if err != nil {
					return err
				}
				last := last
				if i > 0 {
					// No hour or day a host holds a minute of open.
					w, err := openFromTx(ctx, tx)
					if err != nil {
						return err
					}
					last = min(last, floorTo(w, l.width)-l.width)
				}
				var next sql.NullInt64
				if err := tx.QueryRowContext(ctx, s.d.rebind(`SELECT MIN(bucket) FROM `+l.table+` WHERE bucket > ? AND bucket <= ?`), done[i], last).Scan(&next); err != nil {
					return fmt.Errorf("find the next bucket of %s to compact: %w", l.table, err)
				}
				if !next.Valid {
					return nil
				}
				id := pieceID{i, next.Int64}
				if ok, err := s.lockPiece(ctx, tx, id); err != nil {
					return err
				} else if !ok {
					st.Busy = true
					return errBusy
				}
				if err := s.buildPiece(ctx, tx, id, st); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, s.d.rebind(`UPDATE piece_state SET done_through = CASE WHEN done_through > ? THEN done_through ELSE ? END WHERE level = ?`),
					id.bucket, id.bucket, i); err != nil {
					return fmt.Errorf("record compaction: %w", err)
				}
				more = true
				return nil
			})
			if errors.Is(err, errBusy) {
				break
			}
			if err != nil {
				return err
			}
			if !more {
				break
			}
		}
	}
	return s.packKeys(ctx)
}

var errBusy = errors.New("piece busy")

// lockPiece takes the exclusive lock of a piece's bucket (PostgreSQL; see
// the top of this file), or reports that a writer or another compactor
// holds it.
func (s *Store) lockPiece(ctx context.Context, tx *sql.Tx, id pieceID) (bool, error) {
	if s.d.name != postgres.name {
		return true, nil
	}
	var ok bool
	if err := tx.QueryRowContext(ctx, `SELECT pg_try_advisory_xact_lock($1)`, pieceLockKey(id)).Scan(&ok); err != nil {
		return false, fmt.Errorf("lock a piece: %w", err)
	}
	return ok, nil
}

// buildPiece stores the piece of one bucket from its rows (or deletes it,
// when the bucket has none), in tx, which holds its lock.
func (s *Store) buildPiece(ctx context.Context, tx *sql.Tx, id pieceID, st *CompactStats) error {
	l := levels[id.level]
	rs, err := tx.QueryContext(ctx, s.d.rebind(`SELECT `+bucketColumns+` FROM `+l.table+` WHERE bucket = ? ORDER BY key_id`), id.bucket)
	if err != nil {
		return fmt.Errorf("read %s for a piece: %w", l.table, err)
	}
	var ids []int64
	var rows []flowSum
	for rs.Next() {
		var key int64
		var r flowSum
		dest := []any{&key, &r.pid, &r.peer}
		for i := range r.c {
			dest = append(dest, &r.c[i])
		}
		dest = append(dest, &r.first, &r.last)
		if err := rs.Scan(dest...); err != nil {
			rs.Close()
			return fmt.Errorf("read %s for a piece: %w", l.table, err)
		}
		ids = append(ids, key)
		rows = append(rows, r)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return fmt.Errorf("read %s for a piece: %w", l.table, err)
	}
	if len(ids) == 0 {
		if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM flow_pieces WHERE level = ? AND bucket = ?`), id.level, id.bucket); err != nil {
			return fmt.Errorf("delete a piece: %w", err)
		}
		return nil
	}
	data := encodePiece(id.bucket, ids, rows)
	if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO flow_pieces (level, bucket, flows, data) VALUES (?, ?, ?, ?)
		ON CONFLICT (level, bucket) DO UPDATE SET flows = excluded.flows, data = excluded.data`), id.level, id.bucket, len(ids), data); err != nil {
		return fmt.Errorf("store a piece of %s: %w", l.table, err)
	}
	st.Pieces++
	st.Rows += int64(len(ids))
	return nil
}

// compactSoon starts Compact in the background, at most once a minute per
// open store and one at a time, for up to a minute of work; Close stops
// it. Its last outcome is in LastCompaction.
func (s *Store) compactSoon() {
	if s.noAutoCompact.Load() {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastCompact.Load()
	if now-last < int64(time.Minute) || !s.lastCompact.CompareAndSwap(last, now) {
		return
	}
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgCtx == nil || s.bgCtx.Err() != nil || s.bgRunning {
		return
	}
	s.bgRunning = true
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, time.Minute)
		defer cancel()
		st, err := s.Compact(ctx, time.Now())
		s.bgMu.Lock()
		s.bgRunning, s.bgStats, s.bgErr = false, st, err
		s.bgMu.Unlock()
	}()
}

// SetAutoCompact turns the background compaction that writes start on
// (the default) or off, for this handle. Off, pieces are only built by
// explicit calls to Compact (or by other handles).
func (s *Store) SetAutoCompact(on bool) { s.noAutoCompact.Store(!on) }

// LastCompaction reports the outcome of the last background Compact that
// writes started (zero if none finished).
func (s *Store) LastCompaction() (CompactStats, error) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	return s.bgStats, s.bgErr
}

// coldPlan splits [lo, hi) like plan, but answers whole buckets from
// stored pieces where they exist: a day from its piece, or, when some of
// its hours have pieces, from those and its other hours' rows; an hour
// from its piece or its row; the whole minutes of an hour the range cuts
// from their pieces or rows. It returns the row segments and the pieces.
func coldPlan(rd reader, lo, hi int64) ([]segment, []pieceID, error) {
	minute, hour, day := levels[0].width, levels[1].width, levels[2].width
	var head, tail []segment
	a, b := lo, hi
	if f := floorTo(lo, minute); f != lo {
		head = []segment{{levels[0], f, f + minute, true}}
		a = f + minute
	}
	if f := floorTo(hi, minute); f != hi {
		if len(head) > 0 && head[0].lo == f { // both ends in one minute
			return head, nil, nil
		}
		tail = []segment{{levels[0], f, f + minute, true}}
		b = f
	}
	if a >= b {
		return append(head, tail...), nil, nil
	}
	have := map[pieceID]bool{}
	var days []int64 // with a day piece or an hour piece, ascending
	note := func(id pieceID) {
		have[id] = true
		if id.level > 0 {
			if d := floorTo(id.bucket, day); len(days) == 0 || days[len(days)-1] != d {
				days = append(days, d)
			}
		}
	}
	// Hours and days from the first day the range touches, and the
	// minutes of the hours at its ends.
	for _, l := range []int{2, 1} {
		if err := rd.pieceDir(l, floorTo(a, day), b, note); err != nil {
			return nil, nil, err
		}
	}
	slices.Sort(days)
	days = slices.Compact(days)
	for _, t := range []int64{a, b} {
		if t != math.MinInt64 && t != math.MaxInt64 {
			if err := rd.pieceDir(0, floorTo(t, hour), ceilTo(t+1, hour), note); err != nil {
				return nil, nil, err
			}
		}
	}
	var mid []segment
	var pieces []pieceID
	rows := func(i int, from, to int64) { mid = append(mid, segment{levels[i], from, to, false}) }
	var fill func(a, b int64, i int)
	var whole func(c0, c1 int64, i int)
	fill = func(a, b int64, i int) {
		if a >= b {
			return
		}
		if i == 0 {
			whole(a, b, 0)
			return
		}
		w := levels[i].width
		c0, c1 := ceilTo(a, w), floorTo(b, w)
		if c0 >= c1 {
			fill(a, b, i-1)
			return
		}
		fill(a, c0, i-1)
		whole(c0, c1, i)
		fill(c1, b, i-1)
	}
	whole = func(c0, c1 int64, i int) {
		if i == len(levels)-1 {
			t := c0
			for _, d := range days {
				if d < c0 || d >= c1 {
					continue
				}
				if d > t {
					rows(i, t, d)
				}
				if have[pieceID{i, d}] {
					pieces = append(pieces, pieceID{i, d})
				} else {
					whole(d, d+day, i-1)
				}
				t = d + day
			}
			if t < c1 {
				rows(i, t, c1)
			}
			return
		}
		w := levels[i].width
		for t := c0; t < c1; t += w {
			if have[pieceID{i, t}] {
				pieces = append(pieces, pieceID{i, t})
			} else {
				rows(i, t, t+w)
			}
		}
	}
	fill(a, b, len(levels)-1)
	return joinSegments(head, mid, tail), pieces, nil
}

// addPieces reads and adds the pieces of ids to sm.
func addPieces(rd reader, ids []pieceID, sm *sums) error {
	if len(ids) == 0 {
		return nil
	}
	n := 0
	err := rd.pieces(ids, func(id pieceID, data []byte) error {
		if err := sm.addEncoded(id.bucket, data); err != nil {
			return fmt.Errorf("piece %d/%d: %w", id.level, id.bucket, err)
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	if n != len(ids) {
		return fmt.Errorf("read pieces: %d of %d found", n, len(ids))
	}
	return nil
}
