package store_test

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
)

// hourly writes one flow (two, on two hosts) with one connection at :10
// and :40 of every hour from start for n hours, and returns the times.
func hourly(t *testing.T, s *store.Store, start time.Time, n int, flows int) []time.Time {
	t.Helper()
	var at []time.Time
	var b store.Batch
	for h := range n {
		for _, m := range []time.Duration{10 * time.Minute, 40 * time.Minute} {
			ts := start.Add(time.Duration(h)*time.Hour + m)
			at = append(at, ts)
			for f := range flows {
				o := obs("a", "outbound", "198.51.100.1", "198.51.100.2", uint16(1000+f), "curl", ts, 1, 10)
				b.Observations = append(b.Observations, o)
			}
			if len(b.Observations) >= 2000 {
				if err := s.Write(context.Background(), b); err != nil {
					t.Fatal(err)
				}
				b = store.Batch{}
			}
		}
	}
	b.Listeners = append(b.Listeners, store.Listener{Bucket: start.Truncate(time.Minute), HostID: "a", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 80, Comm: "nginx", Drops: 1, FirstSeen: start, LastSeen: start})
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return at
}

func connections(t *testing.T, s *store.Store, r store.Range) uint64 {
	t.Helper()
	got, err := s.Observations(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, o := range got {
		n += o.Connections
	}
	return n
}

// count is how many of at fall in [from, to) (zero ends open).
func count(at []time.Time, from, to time.Time) uint64 {
	var n uint64
	for _, t := range at {
		if (from.IsZero() || !t.Before(from)) && (to.IsZero() || t.Before(to)) {
			n++
		}
	}
	return n
}

func day(d, h, m int) time.Time { return time.Date(2026, 11, d, h, m, 0, 0, time.UTC) }

// With minutes kept a day and hours three, a range older than the
// minutes is answered from hours, and older than the hours from days:
// the totals stay whole, a bucket the range's start cuts counts wholly
// when its events overlap the range (the coarser resolution), and the
// deleted rows are gone. Through the cache too (deptrace serve).
func TestRetentionPerLevelAnswersOldRangesFromCoarserLevels(t *testing.T) {
	ctx := context.Background()
	now := day(20, 12, 30)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			s.SetAutoCompact(false)
			at := hourly(t, s, day(15, 0, 0), 5*24+12, 1)
			if _, err := s.Compact(ctx, now); err != nil { // pieces too must go with their buckets
				t.Fatal(err)
			}
			// A cache (deptrace serve) warmed before retention, which
			// deletes no key here: it must not answer from what went.
			c := open(t, spec)
			c.EnableCache(store.CacheConfig{Now: func() time.Time { return now }})
			for _, r := range []store.Range{{}, {Since: day(18, 5, 30), Until: day(18, 7, 0)}, {Since: day(19, 11, 30)}, {Since: day(20, 9, 30), Until: day(20, 11, 0)}} {
				if got, want := connections(t, c, r), count(at, r.Since, r.Until); got != want {
					t.Fatalf("before retention, %+v: %d connections, want %d", r, got, want)
				}
			}
			r := store.Retention{Minutes: 24 * time.Hour, Hours: 72 * time.Hour}
			for range 2 { // a second pass changes nothing
				if _, err := s.RetainLevels(ctx, r, now); err != nil {
					t.Fatal(err)
				}
			}
			m, h, d, err := s.Oldest(ctx)
			if err != nil || !m.Equal(day(19, 12, 0)) || !h.Equal(day(17, 0, 0)) || !d.IsZero() {
				t.Fatalf("oldest kept: minutes %s, hours %s, days %s (%v); want 19 Nov 12:00, 17 Nov 00:00, all", m, h, d, err)
			}
			for table, before := range map[string]time.Time{"flow_minutes": day(19, 12, 0), "flow_hours": day(17, 0, 0), "listener_minutes": day(19, 12, 0)} {
				var n int
				if err := s.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+` WHERE bucket < `+itoa(before.UnixNano())).Scan(&n); err != nil || n != 0 {
					t.Errorf("%s: %d rows before %s (%v), want 0", table, n, before, err)
				}
			}
			var days int
			if err := s.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM flow_days`).Scan(&days); err != nil || days != 6 {
				t.Errorf("%d day rows (%v), want 6", days, err)
			}
			cases := []struct {
				name string
				r    store.Range
				want uint64
			}{
				{"everything", store.Range{}, count(at, time.Time{}, time.Time{})},
				{"from inside a day-only day: the whole day", store.Range{Since: day(16, 6, 20)}, count(at, day(16, 0, 0), time.Time{})},
				{"inside the hours: whole hours", store.Range{Since: day(18, 5, 30), Until: day(18, 7, 0)}, count(at, day(18, 5, 0), day(18, 7, 0))},
				{"an hour whose events end before the range", store.Range{Since: day(18, 5, 45), Until: day(18, 7, 0)}, count(at, day(18, 6, 0), day(18, 7, 0))},
				{"from the hours into the minutes", store.Range{Since: day(18, 23, 15)}, count(at, day(18, 23, 0), time.Time{})},
				{"minutes", store.Range{Since: day(20, 9, 30), Until: day(20, 11, 0)}, count(at, day(20, 9, 30), day(20, 11, 0))},
				{"minutes just kept", store.Range{Since: day(19, 11, 30)}, count(at, day(19, 11, 0), time.Time{})},
				{"before everything kept", store.Range{Until: day(15, 0, 0)}, 0},
			}
			check := func(s *store.Store, how string) {
				for _, c := range cases {
					if got := connections(t, s, c.r); got != c.want {
						t.Errorf("%s, %s: %d connections, want %d", how, c.name, got, c.want)
					}
				}
			}
			check(s, "cold")
			for _, c := range cases { // whole old hours and days from their pieces: the same as from rows
				a, err := s.Observations(ctx, c.r)
				if err != nil {
					t.Fatal(err)
				}
				b, err := s.ObservationsWithoutPieces(ctx, c.r)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(a, b) {
					t.Errorf("%s: with pieces %+v\nfrom rows %+v", c.name, a, b)
				}
			}
			check(s, "cold, again") // nothing in the answers is consumed
			check(c, "cached")
			check(c, "cached, warm")
			ls, err := s.Listeners(ctx, store.Range{})
			if err != nil || len(ls) != 1 || ls[0].Drops != 1 {
				t.Errorf("listeners of the whole history: %+v (%v), want the one from 15 Nov, from its day row", ls, err)
			}
		})
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestRetentionCheck(t *testing.T) {
	h := time.Hour
	for _, c := range []struct {
		r    store.Retention
		want string
	}{
		{store.Retention{Minutes: 72 * h, Hours: 24 * h, Days: 400 * 24 * h}, "retention of minutes (72h0m0s) longer than that of hours (24h0m0s)"},
		{store.Retention{Minutes: 0, Hours: 24 * h, Days: 0}, "retention of minutes (for ever) longer than that of hours (24h0m0s)"},
		{store.Retention{Minutes: h, Hours: 24 * h, Days: 2 * h}, "retention of hours (24h0m0s) longer than that of days (2h0m0s)"},
		{store.Retention{Minutes: -h}, "retention of minutes -1h0m0s: allowed 0 (keep for ever) or a positive duration"},
	} {
		if err := c.r.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.r, err, c.want)
		}
	}
	for _, ok := range []store.Retention{store.DefaultRetention, {}, {Minutes: h, Hours: h, Days: h}, {Minutes: h}} {
		if err := ok.Check(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
}

// Past the size ceiling the oldest hours go first, every level alike,
// down to under the ceiling (SQLite: pages in use), and the newest
// history stays whole; PostgreSQL, whose files keep the space for new
// rows, acts once until the store grows again.
func TestStoreMaxSizeDeletesOldestFirst(t *testing.T) {
	ctx := context.Background()
	now := day(20, 12, 30)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			s.SetAutoCompact(false)
			at := hourly(t, s, day(10, 0, 0), 10*24+12, 40)
			size, err := s.Size(ctx)
			if err != nil || size <= 0 {
				t.Fatalf("size %d, %v", size, err)
			}
			if c, err := s.EnforceMaxSize(ctx, size*2, now); err != nil || c.Acted {
				t.Fatalf("under the ceiling: %+v, %v", c, err)
			}
			maxBytes := size / 2
			c, err := s.EnforceMaxSize(ctx, maxBytes, now)
			if err != nil || !c.Acted {
				t.Fatalf("over the ceiling: %+v, %v", c, err)
			}
			t.Logf("size %d, ceiling %d: deleted before %s, %d minute rows; now %d bytes", c.Size, maxBytes, c.From, c.MinuteRows, c.After)
			if !c.From.After(day(10, 0, 0)) || c.From.After(day(20, 12, 0)) || c.From.UnixNano()%int64(time.Hour) != 0 {
				t.Errorf("deleted before %s: want an hour boundary after the oldest and before the current hour", c.From)
			}
			if name == "sqlite" && c.After > maxBytes {
				t.Errorf("%d bytes after, over the ceiling %d", c.After, maxBytes)
			}
			if got, want := connections(t, s, store.Range{}), 40*count(at, c.From, time.Time{}); got != want {
				t.Errorf("%d connections kept, want %d: every one since %s", got, want, c.From)
			}
			if got := connections(t, s, store.Range{Until: c.From}); got != 0 {
				t.Errorf("%d connections before %s", got, c.From)
			}
			if name == "postgres" {
				again, err := s.EnforceMaxSize(ctx, maxBytes, now)
				if err != nil || again.Acted {
					t.Errorf("acted again before the store grew: %+v, %v", again, err)
				}
			}
		})
	}
}

// minutely writes flows flows with one connection each in every minute
// from start for n hours, and returns the times of one flow.
func minutely(t *testing.T, s *store.Store, start time.Time, n int, flows int) []time.Time {
	t.Helper()
	var at []time.Time
	var b store.Batch
	for m := range n * 60 {
		ts := start.Add(time.Duration(m)*time.Minute + 20*time.Second)
		at = append(at, ts)
		for f := range flows {
			b.Observations = append(b.Observations, obs("a", "outbound", "198.51.100.1", "198.51.100.2", uint16(1000+f), "curl", ts, 1, 10))
		}
		if len(b.Observations) >= 5000 || m == n*60-1 {
			if err := s.Write(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			b = store.Batch{}
		}
	}
	return at
}

// A store of less than two days over the ceiling loses its oldest hours,
// about as many as bring it to 90% of the ceiling, not whole UTC days
// (which left a third of the ceiling and a quarter of the history).
// Every level starts at the cut; the day the cut falls in keeps its day
// row, which no range reads while its remaining hours are kept.
func TestStoreMaxSizeCutsHoursNotDays(t *testing.T) {
	ctx := context.Background()
	start, now := day(19, 2, 0), day(20, 18, 30)
	const flows = 10
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			s.SetAutoCompact(false)
			at := minutely(t, s, start, 40, flows)
			if _, err := s.Compact(ctx, now); err != nil { // pieces too must go with their buckets
				t.Fatal(err)
			}
			size, err := s.Size(ctx)
			if err != nil || size <= 0 {
				t.Fatalf("size %d, %v", size, err)
			}
			maxBytes := size * 9 / 10
			c, err := s.EnforceMaxSize(ctx, maxBytes, now)
			if err != nil || !c.Acted {
				t.Fatalf("over the ceiling: %+v, %v", c, err)
			}
			t.Logf("size %d, ceiling %d: deleted before %s, %d minute rows; now %d bytes (%.0f%% of the ceiling)",
				c.Size, maxBytes, c.From, c.MinuteRows, c.After, 100*float64(c.After)/float64(maxBytes))
			// The rows are even over the 40 hours: 19% of them (down to
			// 90% of 90%) are the first 7.6 hours, so up to 10:00.
			if c.From.Before(day(19, 9, 0)) || c.From.After(day(19, 13, 0)) || c.From.UnixNano()%int64(time.Hour) != 0 {
				t.Errorf("deleted before %s: want an hour boundary from 19 Nov 09:00 to 13:00", c.From)
			}
			if name == "sqlite" && (c.After > maxBytes || c.After < maxBytes*7/10) {
				t.Errorf("%d bytes after, want from 70%% of the ceiling %d to the ceiling", c.After, maxBytes)
			}
			m, h, d, err := s.Oldest(ctx)
			if err != nil || !m.Equal(c.From) || !h.Equal(c.From) || !d.Equal(c.From) {
				t.Errorf("oldest kept: minutes %s, hours %s, days %s (%v); want %s at every level", m, h, d, err, c.From)
			}
			// No part of the history counted twice (the cut day's day row
			// and its hours) nor lost, through pieces or rows.
			for _, r := range []store.Range{{}, {Since: day(19, 0, 0), Until: day(20, 0, 0)}, {Since: c.From.Add(-30 * time.Minute), Until: c.From.Add(90 * time.Minute)}} {
				since := r.Since
				if since.Before(c.From) {
					since = c.From
				}
				want := flows * count(at, since, r.Until)
				if got := connections(t, s, r); got != want {
					t.Errorf("%+v: %d connections, want %d: every one since %s", r, got, want, c.From)
				}
				without, err := s.ObservationsWithoutPieces(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				var n uint64
				for _, o := range without {
					n += o.Connections
				}
				if n != want {
					t.Errorf("%+v without pieces: %d connections, want %d", r, n, want)
				}
			}
			if got := connections(t, s, store.Range{Until: c.From}); got != 0 {
				t.Errorf("%d connections before %s", got, c.From)
			}
			if name == "postgres" {
				again, err := s.EnforceMaxSize(ctx, maxBytes, now)
				if err != nil || again.Acted {
					t.Errorf("acted again before the store grew: %+v, %v", again, err)
				}
			}
			// Once the hours of the cut day go too, its day row answers
			// for it, whole (day resolution, as for a range that starts
			// inside a day).
			if _, err := s.RetainLevels(ctx, store.Retention{Minutes: 12 * time.Hour, Hours: 12 * time.Hour}, now); err != nil {
				t.Fatal(err)
			}
			if got, want := connections(t, s, store.Range{}), flows*count(at, day(19, 0, 0), time.Time{}); got != want {
				t.Errorf("after the cut day's hours went: %d connections, want %d: the whole day's, then every one", got, want)
			}
		})
	}
}

// Over the ceiling with all its history in the current hour, which it
// never deletes, the store deletes nothing and says so (Blocked, not
// Acted), with what remains and when it may go; once the hour has
// ended, that hour goes.
func TestStoreMaxSizeBlockedByTheCurrentHour(t *testing.T) {
	ctx := context.Background()
	now := day(20, 12, 40)
	const flows = 20
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			s.SetAutoCompact(false)
			for m := range 40 {
				ts := day(20, 12, m).Add(20 * time.Second)
				b := store.Batch{ID: fmt.Sprintf("batch-%d", m)}
				for f := range flows {
					b.Observations = append(b.Observations, obs("a", "outbound", "198.51.100.1", "198.51.100.2", uint16(1000+f), "curl", ts, 1, 10))
				}
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			size, err := s.Size(ctx)
			if err != nil || size <= 0 {
				t.Fatalf("size %d, %v", size, err)
			}
			c, err := s.EnforceMaxSize(ctx, size/2, now)
			if err != nil {
				t.Fatal(err)
			}
			// Kept: each flow's 40 minute rows, its hour row and its day row.
			want := store.Ceiling{Size: size, After: size, Blocked: true, KeptRows: 42 * flows, BatchIDs: 40, DeletableFrom: day(20, 13, 0)}
			if c != want {
				t.Errorf("over the ceiling within the current hour: %+v;\nwant %+v", c, want)
			}
			if got := connections(t, s, store.Range{}); got != flows*40 {
				t.Errorf("%d connections kept, want every one: %d", got, flows*40)
			}
			if m, h, d, err := s.Oldest(ctx); err != nil || !m.IsZero() || !h.IsZero() || !d.IsZero() {
				t.Errorf("history starts at minutes %s, hours %s, days %s (%v); want nothing deleted", m, h, d, err)
			}
			// The hour over, its buckets go.
			c, err = s.EnforceMaxSize(ctx, size/2, day(20, 13, 5))
			if err != nil || !c.Acted || !c.From.Equal(day(20, 13, 0)) {
				t.Errorf("after the hour: %+v, %v; want the hour before 13:00 deleted", c, err)
			}
			// Still over (SQLite measures again: the day rows stay), it
			// says that nothing more can go; PostgreSQL acts once a check.
			if blocked := name == "sqlite" && c.After > size/2; c.Blocked != blocked || (blocked && c.KeptRows != flows) {
				t.Errorf("after the hour: %+v; want blocked %v, with the %d day rows kept", c, blocked, flows)
			}
			if got := connections(t, s, store.Range{}); got != 0 {
				t.Errorf("%d connections kept after the hour went", got)
			}
		})
	}
}
