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
			write := func(s *store.Store, host string, at time.Time, conns uint64) {
				t.Helper()
				b := store.Batch{Observations: []store.Observation{
					obs(host, "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", at, conns, 10*conns),
					obs(host, "inbound", "198.51.100.1", "198.51.100.3", 8080, "app", at, 2*conns, conns),
				}}
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
			write(w, "y", h.Add(-2*time.Minute+55*time.Second), 23) // after its roll-up: every level
			check("a row for y's rolled-up minute")
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
			for table, width := range store.RollupTables() {
				got, err := w.ReadRollup(ctx, table, 0)
				if err != nil {
					t.Fatal(err)
				}
				want, err := w.ReadRollup(ctx, "flow_minutes", width)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s: %d rows, not the sums of their minutes (%d rows)", table, len(got), len(want))
				}
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
