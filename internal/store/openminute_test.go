package store_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
)

// A host's current minute reaches the hour and day rows only once the
// minute is over (openminute.go). Every reader must still answer every
// range as the minute rows do, while minutes are open, after they are
// rolled up by the host's next minute, after a restarted writer carries
// on, after late rows, and after Compact rolls up the minute of a host
// that stopped; Compact must build no hour piece while a minute of the
// hour is open; and once everything is rolled up, the hour and day rows
// must equal the sums of their minutes.
func TestOpenMinutesAreRolledUpExactly(t *testing.T) {
	ctx := context.Background()
	// Minutes just before and after the next hour: recent enough to be
	// held open (the store's clock), and the ranges cross an hour.
	h := time.Now().Truncate(time.Hour).Add(time.Hour)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			w := open(t, spec)
			w.SetAutoCompact(false)
			c := open(t, spec) // a reader with the cache, as deptrace serve's
			c.EnableCache(store.CacheConfig{Now: func() time.Time { return h.Add(3 * time.Hour) }})
			// write writes one batch of two flows per host; each host's
			// flows at its own time.
			write := func(s *store.Store, hostsAt ...any) {
				t.Helper()
				var b store.Batch
				for i := 0; i < len(hostsAt); i += 3 {
					host, at, conns := hostsAt[i].(string), hostsAt[i+1].(time.Time), uint64(hostsAt[i+2].(int))
					b.Observations = append(b.Observations,
						obs(host, "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", at, conns, 10*conns),
						obs(host, "inbound", "198.51.100.1", "198.51.100.3", 8080, "app", at, 2*conns, conns))
				}
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			ranges := []store.Range{{}, {Since: h.Add(-time.Hour), Until: h.Add(time.Hour)}, {Since: h.Add(-time.Hour), Until: h},
				{Since: h, Until: h.Add(time.Hour)}, {Since: h.Add(-90 * time.Second)}, {Since: h.Add(-40 * time.Second), Until: h.Add(30 * time.Second)},
				{Since: h.Truncate(24 * time.Hour).Add(-24 * time.Hour), Until: h.Truncate(24 * time.Hour).Add(48 * time.Hour)}, {Since: h.Add(-3 * time.Hour)}}
			check := func(stage string) {
				t.Helper()
				for _, r := range ranges {
					want, err := w.ObservationsFromMinutes(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					for reader, read := range map[string]func(context.Context, store.Range) ([]store.Observation, error){
						"Observations": w.Observations, "without pieces": w.ObservationsWithoutPieces, "cached": c.Observations,
					} {
						got, err := read(ctx, r)
						if err != nil {
							t.Fatal(err)
						}
						if !reflect.DeepEqual(got, want) {
							t.Errorf("%s: %s, range %s – %s: %d flows %v; the minutes give %d flows %v", stage, reader, r.Since, r.Until, len(got), conns(got), len(want), conns(want))
						}
					}
				}
			}
			hourRows := func() int {
				t.Helper()
				rows, err := w.ReadRollup(ctx, "flow_hours", 0)
				if err != nil {
					t.Fatal(err)
				}
				return len(rows)
			}

			write(w, "x", h.Add(-2*time.Minute+5*time.Second), 1)
			write(w, "y", h.Add(-2*time.Minute+7*time.Second), 3)
			if n := hourRows(); n != 0 {
				t.Fatalf("%d hour rows after writes to open minutes only: the hour was written at once, not rolled up", n)
			}
			check("two hosts hold a minute open")
			write(w, "x", h.Add(-2*time.Minute+25*time.Second), 5)
			check("a second write to the open minute")
			write(w, "x", h.Add(-time.Minute+5*time.Second), 7)
			if n := hourRows(); n != 2 {
				t.Fatalf("%d hour rows after x's next minute; want x's 2 flows rolled up", n)
			}
			check("x's first minute rolled up, its second open")
			w2 := open(t, spec) // the agent restarted: the state is the store's
			w2.SetAutoCompact(false)
			write(w2, "x", h.Add(-time.Minute+40*time.Second), 11)
			write(w2, "x", h.Add(5*time.Second), 13)
			check("a restarted writer rolls x's minute up and opens the next hour's first")
			write(w2, "x", h.Add(-2*time.Minute+50*time.Second), 17) // a late row: every level at once
			check("a late row for a rolled-up minute")
			write(w2, "z", h.Add(-time.Minute+1*time.Second), 19)
			check("a third host opens the hour's last minute")

			// At h+2m the hour [h-1h, h) is sealed, y's minute is stale
			// and rolled up, but z's (h-1m) is not: no piece for the hour.
			if _, err := w.Compact(ctx, h.Add(2*time.Minute)); err != nil {
				t.Fatal(err)
			}
			hourPiece := func() int {
				t.Helper()
				var n int
				if err := w.DB().QueryRowContext(ctx, w.Rebind(`SELECT COUNT(*) FROM flow_pieces WHERE level = 1 AND bucket = ?`), h.Add(-time.Hour).UnixNano()).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := hourPiece(); n != 0 {
				t.Errorf("Compact built the piece of an hour whose last minute z holds open")
			}
			check("y's stale minute rolled up by Compact, z's still open")
			// One batch, two hosts: y's rolled-up minute (every level) and
			// x's open one (the minute table).
			write(w, "y", h.Add(-2*time.Minute+55*time.Second), 23, "x", h.Add(40*time.Second), 29)
			check("a row for y's rolled-up minute, with x's open one")
			if _, err := w.Compact(ctx, h.Add(2*time.Minute+time.Second)); err != nil {
				t.Fatal(err)
			}
			if n := hourPiece(); n != 1 {
				t.Errorf("no piece of the hour once z's minute was rolled up")
			}
			if _, n, err := w.PiecesMatchRows(ctx); err != nil || n == 0 {
				t.Errorf("pieces against their rows: %d flows checked, %v", n, err)
			}
			check("every minute but x's rolled up, the hour compacted")

			if _, err := w.Compact(ctx, h.Add(2*time.Hour)); err != nil {
				t.Fatal(err)
			}
			check("every minute rolled up")
			rollupsEqualMinutes(t, w)
		})
	}
}

// A store upgraded to schema 12 in the middle of a minute already holds
// that minute's rows in every level (the older deptrace wrote them so):
// the minute must not be held open and rolled up again.
func TestUpgradeToOpenMinutesMidMinute(t *testing.T) {
	ctx := context.Background()
	m := time.Now().Truncate(time.Minute).Add(10 * time.Minute)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			w := open(t, spec)
			w.SetAutoCompact(false)
			write := func(at time.Time, c uint64) {
				t.Helper()
				if err := w.Write(ctx, store.Batch{Observations: []store.Observation{obs("x", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", at, c, c)}}); err != nil {
					t.Fatal(err)
				}
			}
			write(m.Add(time.Second), 1)
			// m's rows in every level, and no open-minute record: as a
			// store of schema 11 is after migration 12.
			if _, err := w.Compact(ctx, m.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			if _, err := w.DB().ExecContext(ctx, `DELETE FROM open_minutes`); err != nil {
				t.Fatal(err)
			}
			write(m.Add(20*time.Second), 5)
			write(m.Add(time.Minute+time.Second), 7)
			if _, err := w.Compact(ctx, m.Add(3*time.Hour)); err != nil {
				t.Fatal(err)
			}
			rollupsEqualMinutes(t, w)
		})
	}
}

// Retention that deletes the minute rows of a minute still held open must
// first roll it up: the hour and day rows then answer for it.
func TestRetentionRollsUpOpenMinutes(t *testing.T) {
	ctx := context.Background()
	// Recent (held open), and far enough from its hour's end that Retain's
	// cutoff leaves the hour.
	m := time.Now().Truncate(time.Hour).Add(2*time.Hour + 10*time.Minute)
	retain := map[string]func(*store.Store) error{
		"Retain": func(s *store.Store) error {
			_, err := s.Retain(ctx, m.Add(2*time.Minute), store.DefaultBucket)
			return err
		},
		"RetainLevels": func(s *store.Store) error {
			_, err := s.RetainLevels(ctx, store.Retention{Minutes: time.Hour, Hours: 72 * time.Hour, Days: 30 * 24 * time.Hour}, m.Add(3*time.Hour))
			return err
		},
	}
	for how, retain := range retain {
		for name, spec := range backends(t) { // a fresh store each
			t.Run(name+"/"+how, func(t *testing.T) {
				w := open(t, spec)
				w.SetAutoCompact(false)
				if err := w.Write(ctx, store.Batch{Observations: []store.Observation{obs("x", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", m.Add(time.Second), 3, 30)}}); err != nil {
					t.Fatal(err)
				}
				if err := retain(w); err != nil {
					t.Fatal(err)
				}
				hours, err := w.ReadRollup(ctx, "flow_hours", 0)
				if err != nil {
					t.Fatal(err)
				}
				var got int64
				for _, r := range hours {
					got += r.Counters[0]
				}
				if got != 3 {
					t.Errorf("the hour rows hold %d connections after retention; want 3 (the open minute's)", got)
				}
			})
		}
	}
}

// rollupsEqualMinutes checks every hour and day row against the sum of
// its minute rows.
func rollupsEqualMinutes(t *testing.T, s *store.Store) {
	t.Helper()
	for table, width := range store.RollupTables() {
		got, err := s.ReadRollup(context.Background(), table, 0)
		if err != nil {
			t.Fatal(err)
		}
		want, err := s.ReadRollup(context.Background(), "flow_minutes", width)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v; the minutes sum to %v", table, got, want)
		}
	}
}

// A minute older than the minutes retention keeps is never held open: its
// rows go to every level at once (retention, which rolled up the open
// minutes before its cutoff, would not come back for it).
func TestMinutesBeforeRetentionAreNotHeldOpen(t *testing.T) {
	ctx := context.Background()
	m := time.Now().Truncate(time.Hour).Add(2*time.Hour + 10*time.Minute)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			w := open(t, spec)
			w.SetAutoCompact(false)
			// Minutes kept from the hour after m's on.
			if _, err := w.RetainLevels(ctx, store.Retention{Minutes: time.Hour, Hours: 72 * time.Hour, Days: 30 * 24 * time.Hour}, m.Add(2*time.Hour)); err != nil {
				t.Fatal(err)
			}
			if err := w.Write(ctx, store.Batch{Observations: []store.Observation{obs("x", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", m.Add(time.Second), 3, 30)}}); err != nil {
				t.Fatal(err)
			}
			hours, err := w.ReadRollup(ctx, "flow_hours", 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(hours) != 1 {
				t.Errorf("%d hour rows right after a write to a minute before the minutes kept; want 1: the minute was held open", len(hours))
			}
		})
	}
}

// conns lists each flow's connections, for failure messages.
func conns(os []store.Observation) []uint64 {
	var out []uint64
	for _, o := range os {
		out = append(out, o.Connections)
	}
	return out
}
