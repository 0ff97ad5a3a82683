package store

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Retention bounds the history kept at each resolution. A level whose
// window is 0 is kept for ever. Windows never shrink towards coarser
// levels: Minutes <= Hours <= Days, a 0 (for ever) only where every
// coarser level is 0 too.
type Retention struct {
	Minutes, Hours, Days time.Duration
}

// DefaultRetention keeps minute buckets for 2 days, hour buckets for 30
// days and day buckets for 400 days (13 months, so that a month can be
// compared with the same month a year before).
var DefaultRetention = Retention{Minutes: 48 * time.Hour, Hours: 30 * 24 * time.Hour, Days: 400 * 24 * time.Hour}

// Check reports the first window that is out of order, naming it after
// its level ("minutes", "hours", "days").
func (r Retention) Check() error {
	ws := []struct {
		name string
		d    time.Duration
	}{{"minutes", r.Minutes}, {"hours", r.Hours}, {"days", r.Days}}
	for i, w := range ws {
		if w.d < 0 {
			return fmt.Errorf("retention of %s %s: allowed 0 (keep for ever) or a positive duration", w.name, w.d)
		}
		for _, c := range ws[i+1:] {
			if w.d == 0 && c.d != 0 || w.d != 0 && c.d != 0 && c.d < w.d {
				return fmt.Errorf("retention of %s (%s) longer than that of %s (%s): allowed a window no longer than each coarser level's, 0 (for ever) only when the coarser levels are 0 too",
					w.name, forever(w.d), c.name, forever(c.d))
			}
		}
	}
	return nil
}

func forever(d time.Duration) string {
	if d == 0 {
		return "for ever"
	}
	return d.String()
}

// retained is where the history each query may read starts, per level
// (math.MinInt64: from the beginning). Queries never read before days;
// they read days only before hours, hours and days only before minutes:
// the part of a range older than a level's start is answered from the
// coarser levels. days <= hours <= minutes.
type retained struct {
	minutes, hours, days int64
}

func fromState(v int64) int64 {
	if v == 0 {
		return math.MinInt64
	}
	return v
}

func (s *Store) retained(ctx context.Context) (retained, error) {
	var m, h, d int64
	if err := s.db.QueryRowContext(ctx, `SELECT retained_from, hours_from, days_from FROM retention_state WHERE id = 1`).Scan(&m, &h, &d); err != nil {
		return retained{}, fmt.Errorf("read retention state: %w", err)
	}
	z := retained{fromState(m), fromState(h), fromState(d)}
	// Kept in order whatever wrote the state.
	z.hours = max(z.hours, z.days)
	z.minutes = max(z.minutes, z.hours)
	return z, nil
}

// old plans the part of [lo, hi) older than the minutes kept: from day
// rows before the hours kept, from hour and day rows before the minutes
// kept. Where the range's start cuts a day (or an hour) of that part,
// the bucket counts if its events overlap the range, as for a minute
// (see Range): the answer there has the coarser level's resolution.
func (z retained) old(lo, hi int64) []segment {
	var segs []segment
	if a, b := lo, min(hi, z.hours); a < b {
		segs = append(segs, plan(a, b, levels[2:])...)
	}
	if a, b := max(lo, z.hours), min(hi, z.minutes); a < b {
		segs = append(segs, plan(a, b, levels[1:])...)
	}
	return segs
}

// advanceRetention moves the starts of the kept history forward (never
// back), in order, and deletes what lies before them: at each level the
// buckets that end by its start. A bucket the start cuts (a day, when
// EnforceMaxSize cuts at an hour) stays whole: no range reads it while
// the finer levels hold its part from the start, and once they no
// longer do it is a bucket the range's start cuts, counted at its
// resolution (see Range), as Retain leaves it.
func (s *Store) advanceRetention(ctx context.Context, z retained) (minuteRows int64, err error) {
	z.hours = max(z.hours, z.days)
	z.minutes = max(z.minutes, z.hours)
	if err := s.recordCutoff(ctx, z); err != nil {
		return 0, err
	}
	// The part before z.minutes is read from hours and days: they must
	// hold its open minutes before its minute rows go. After the cutoff
	// is recorded, so that no write opens one there meanwhile (see
	// openFloor).
	if z.minutes != math.MinInt64 {
		if err := s.rollUpOpen(ctx, z.minutes); err != nil {
			return 0, err
		}
	}
	for i, from := range []int64{z.minutes, z.hours, z.days} {
		if from == math.MinInt64 {
			continue
		}
		from = floorTo(from, levels[i].width)
		for _, t := range []string{"flow_pieces", "piece_todo"} {
			if _, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM `+t+` WHERE level = ? AND bucket < ?`), i, from); err != nil {
				return minuteRows, fmt.Errorf("delete old buckets of %s: %w", t, err)
			}
		}
		for _, t := range []string{levels[i].table, listenerTables[i], dnsTables[i]} {
			res, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM `+t+` WHERE bucket < ?`), from)
			if err != nil {
				return minuteRows, fmt.Errorf("delete old buckets of %s: %w", t, err)
			}
			if i == 0 && t == levels[0].table {
				minuteRows, _ = res.RowsAffected()
			}
		}
	}
	if z.days == math.MinInt64 {
		return minuteRows, nil
	}
	// The keys and names of a day row kept stay with it.
	return minuteRows, s.forgetBefore(ctx, floorTo(z.days, levels[2].width))
}

// recordCutoff moves the starts of the kept history forward (never back).
// On PostgreSQL it waits, under retentionLockKey, for the writes that read
// the old cutoff (see openFloor).
func (s *Store) recordCutoff(ctx context.Context, z retained) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if s.d.name == postgres.name {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(retentionLockKey)); err != nil {
				return fmt.Errorf("lock the retention state: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`UPDATE retention_state SET
			retained_from = CASE WHEN retained_from < ? THEN ? ELSE retained_from END,
			hours_from = CASE WHEN hours_from < ? THEN ? ELSE hours_from END,
			days_from = CASE WHEN days_from < ? THEN ? ELSE days_from END WHERE id = 1`),
			z.minutes, z.minutes, z.hours, z.hours, z.days, z.days); err != nil {
			return fmt.Errorf("record retention cutoff: %w", err)
		}
		return nil
	})
}

// forgetBefore deletes flow keys, services, hosts and addresses not seen since
// a day before t (a key's last event can precede its bucket's start by
// up to an interval), and, when keys went, tells caches to start over in
// the transaction that deletes them: SQLite may hand a deleted key's id
// to a new key.
func (s *Store) forgetBefore(ctx context.Context, t int64) error {
	if err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM flow_keys WHERE last_seen < ?`), t-levels[2].width)
		if err != nil {
			return fmt.Errorf("delete old flow keys: %w", err)
		}
		// Only deleted keys make a cache wrong (their ids may be handed
		// out again); deleted buckets lie before what queries read. The
		// agents retain once a minute each: a reset every time would
		// leave deptrace serve's cache empty.
		if n, _ := res.RowsAffected(); n == 0 {
			return nil
		}
		s.keyCache.clear()
		if _, err := tx.ExecContext(ctx, `DELETE FROM key_pack`); err != nil {
			return fmt.Errorf("delete the key pack: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO write_log (at, bucket) VALUES (?, ?)`), time.Now().UnixNano(), logEverything); err != nil {
			return fmt.Errorf("append to the write log: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := s.forgetNames(ctx, t); err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM open_minutes WHERE open_bucket = 0 AND rolled_through < ?`), t); err != nil {
		return fmt.Errorf("delete old open-minute records: %w", err)
	}
	return nil
}

// forgetNames deletes the services, hosts, addresses and identities not
// seen since t. Each container's namespace is a host of its own (its id
// holds the namespace's cookie), so on a machine where containers come
// and go hosts pile up until retention takes them, and every query reads
// them all.
func (s *Store) forgetNames(ctx context.Context, t int64) error {
	for _, table := range []string{"services", "host_addrs", "hosts", "end_identities"} {
		if _, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM `+table+` WHERE last_seen < ?`), t); err != nil {
			return fmt.Errorf("delete old rows of %s: %w", table, err)
		}
	}
	return nil
}

// RetainLevels deletes, at each level, the buckets older than its window
// before now, and returns how many minute rows went. A finer level goes
// in whole buckets of the next coarser one (minutes by the hour, hours
// by the UTC day), so that what remains of a range is answered from
// whole coarser buckets; so a level keeps up to an hour (minutes) or a
// day (hours, days) more than its window.
func (s *Store) RetainLevels(ctx context.Context, r Retention, now time.Time) (int64, error) {
	if err := r.Check(); err != nil {
		return 0, err
	}
	from := func(d time.Duration, align int64) int64 {
		if d == 0 {
			return math.MinInt64
		}
		return floorTo(now.Add(-d).UnixNano(), align)
	}
	day := levels[2].width
	return s.advanceRetention(ctx, retained{
		minutes: from(r.Minutes, levels[1].width),
		hours:   from(r.Hours, day),
		days:    from(r.Days, day),
	})
}

// Oldest is the start of the oldest bucket queries can still read, at
// each level (zero: nothing was deleted there).
func (s *Store) Oldest(ctx context.Context) (minutes, hours, days time.Time, err error) {
	z, err := s.retained(ctx)
	t := func(v int64) time.Time {
		if v == math.MinInt64 {
			return time.Time{}
		}
		return fromNs(v)
	}
	return t(z.minutes), t(z.hours), t(z.days), err
}

// storeTables are every table deptrace creates, for Size on PostgreSQL.
var storeTables = []string{"hosts", "host_addrs", "services", "flow_keys", "flow_minutes", "flow_hours", "flow_days",
	"listener_minutes", "listener_hours", "listener_days", "retention_state", "applied_batches", "write_log",
	"write_log_state", "flow_pieces", "piece_state", "piece_todo", "key_pack", "end_identities", "schema_version",
	"flow_names", "dns_minutes", "dns_hours", "dns_days", "open_minutes"}

// Size is how many bytes the store takes: on SQLite the pages in use (a
// file does not shrink when rows are deleted, but its free pages are
// used again before it grows); on PostgreSQL the size of deptrace's
// tables with their indexes and TOAST, as on disk (also kept after a
// delete, and used again once vacuumed).
func (s *Store) Size(ctx context.Context) (int64, error) {
	var n int64
	if s.d.name == postgres.name {
		q := `SELECT COALESCE(SUM(pg_total_relation_size(to_regclass(t))), 0)::bigint FROM unnest($1::text[]) t`
		if err := s.db.QueryRowContext(ctx, q, storeTables).Scan(&n); err != nil {
			return 0, fmt.Errorf("read the store's size: %w", err)
		}
		return n, nil
	}
	var pages, free, size int64
	for _, p := range []struct {
		pragma string
		v      *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := s.db.QueryRowContext(ctx, `PRAGMA `+p.pragma).Scan(p.v); err != nil {
			return 0, fmt.Errorf("read the store's size (%s): %w", p.pragma, err)
		}
	}
	return (pages - free) * size, nil
}

// Ceiling is what EnforceMaxSize did.
type Ceiling struct {
	Size  int64 // bytes before
	After int64 // bytes after (Size when it did nothing)
	// Acted: it deleted the buckets before From (an hour), at every
	// level; the day From falls in keeps its day row (advanceRetention).
	Acted      bool
	From       time.Time
	MinuteRows int64
	// Blocked: the store is over the ceiling, but nothing is left that
	// it may delete (or, with Acted, nothing more): every bucket row is
	// of the current hour (with today's day rows), which it never
	// deletes, or there is none. KeptRows counts those rows, BatchIDs the ids of
	// applied batches (kept BatchMemory; the ceiling never deletes them);
	// DeletableFrom is when the current hour ends, from which its rows
	// may go.
	Blocked       bool
	KeptRows      int64
	BatchIDs      int64
	DeletableFrom time.Time
}

// ceilingTarget is the share of the ceiling the store is brought down
// to when it acts, so that it does not act again at the next write.
const ceilingTarget = 0.9

// EnforceMaxSize deletes the oldest buckets, every level alike (the
// oldest hour of history first), when the store is larger than max
// bytes, down to about 90% of it; the current hour is never deleted.
// Which hours go is estimated from their share of the bucket rows: whole
// days overshot by far a store of a day or two. PostgreSQL keeps
// the space of deleted rows for new ones once vacuumed (it vacuums the
// tables it deleted from) rather than giving it back to the file system:
// so there it acts again only once the store has grown past the size it
// had when it last acted.
func (s *Store) EnforceMaxSize(ctx context.Context, maxBytes int64, now time.Time) (Ceiling, error) {
	size, err := s.Size(ctx)
	c := Ceiling{Size: size, After: size}
	if err != nil || maxBytes <= 0 || size <= maxBytes {
		return c, err
	}
	pg := s.d.name == postgres.name
	if pg {
		var last int64
		if err := s.db.QueryRowContext(ctx, `SELECT ceiling_size FROM retention_state WHERE id = 1`).Scan(&last); err != nil {
			return c, fmt.Errorf("read retention state: %w", err)
		}
		if size <= last {
			return c, nil
		}
	}
	hour, day := levels[1].width, levels[2].width
	latest := floorTo(now.UnixNano(), hour)
	for range 8 { // an estimate: SQLite measures again and goes on
		// The rows a cut at the end of each hour deletes: minute and hour
		// rows by their hour, a day row only by its day's last hour (the
		// day a cut falls in keeps its row).
		perHour := map[int64]int64{}
		var total int64
		for i := range levels {
			group := fmt.Sprintf(`bucket - (bucket %% %d)`, hour)
			if i == 2 {
				group = fmt.Sprintf(`bucket + %d`, day-hour)
			}
			for _, t := range []string{levels[i].table, listenerTables[i], dnsTables[i]} {
				rows, err := s.db.QueryContext(ctx, fmt.Sprintf(`SELECT %s, COUNT(*) FROM %s GROUP BY 1`, group, t))
				if err != nil {
					return c, fmt.Errorf("count the rows of %s: %w", t, err)
				}
				for rows.Next() {
					var h, n int64
					if err := rows.Scan(&h, &n); err != nil {
						rows.Close()
						return c, fmt.Errorf("count the rows of %s: %w", t, err)
					}
					perHour[h] += n
					total += n
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return c, fmt.Errorf("count the rows of %s: %w", t, err)
				}
			}
		}
		if total == 0 {
			c.Blocked = true
			break
		}
		hours := make([]int64, 0, len(perHour))
		for h := range perHour {
			hours = append(hours, h)
		}
		slices.Sort(hours)
		need := int64(math.Ceil(float64(total) * float64(size-int64(float64(maxBytes)*ceilingTarget)) / float64(size)))
		cut, sum := hours[0], int64(0)
		for _, h := range hours {
			cut = h + hour
			if sum += perHour[h]; sum >= need {
				break
			}
		}
		cut = min(cut, latest)
		var deletable int64 // the rows a cut at cut deletes
		for _, h := range hours {
			if h < cut {
				deletable += perHour[h]
			}
		}
		z, err := s.retained(ctx)
		if err != nil {
			return c, err
		}
		if cut <= z.days || deletable == 0 {
			// Nothing older left to delete (any more): every row is of
			// the current hour (or today's day row).
			c.Blocked, c.KeptRows = true, total
			break
		}
		n, err := s.advanceRetention(ctx, retained{cut, cut, cut})
		c.MinuteRows += n
		if err != nil {
			return c, err
		}
		c.Acted, c.From = true, fromNs(cut)
		if pg {
			var ts []string
			for i := range levels {
				ts = append(ts, levels[i].table, listenerTables[i], dnsTables[i])
			}
			if _, err := s.db.ExecContext(ctx, `VACUUM `+strings.Join(append(ts, "flow_pieces", "flow_keys"), ", ")); err != nil {
				return c, fmt.Errorf("vacuum after deleting old buckets: %w", err)
			}
		}
		if c.After, err = s.Size(ctx); err != nil {
			return c, err
		}
		if pg {
			if _, err := s.db.ExecContext(ctx, `UPDATE retention_state SET ceiling_size = $1 WHERE id = 1`, c.After); err != nil {
				return c, fmt.Errorf("record retention state: %w", err)
			}
			break
		}
		if c.After <= maxBytes {
			break
		}
		size = c.After
	}
	if c.Blocked {
		c.DeletableFrom = fromNs(latest + hour)
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM applied_batches`).Scan(&c.BatchIDs); err != nil {
			return c, fmt.Errorf("count the batch ids: %w", err)
		}
	}
	return c, nil
}

// sumOld adds the segments of the part of a range older than the minutes
// kept (retained.old) to sm: each whole hour or day from its piece where
// compaction built one, the rest from rows, as coldPlan does for the
// newer part. lo and hi are the range's ends (for the event filter of a
// bucket its start cuts).
func sumOld(rd reader, old []segment, lo, hi int64, sm *sums) error {
	var rows []segment
	var pieces []pieceID
	for _, sg := range old {
		i := slices.Index(levels, sg.level)
		if sg.events || i < 1 {
			rows = append(rows, sg)
			continue
		}
		cur := sg.lo
		if err := rd.pieceDir(i, sg.lo, sg.hi, func(id pieceID) {
			if id.bucket > cur {
				rows = append(rows, segment{sg.level, cur, id.bucket, false})
			}
			pieces = append(pieces, id)
			cur = id.bucket + sg.level.width
		}); err != nil {
			return err
		}
		if cur < sg.hi {
			rows = append(rows, segment{sg.level, cur, sg.hi, false})
		}
	}
	if err := rd.sums(rows, lo, hi, sm); err != nil {
		return err
	}
	return addPieces(rd, pieces, sm)
}
