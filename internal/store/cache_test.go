package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// A long-running reader's cache of past hours and days answers exactly
// what the store holds: the same as a reader without it, after late
// writes into hours it holds (by another store handle, as an agent's
// replayed spool would), writes into the current hour, retention, and a
// write log pruned past what it had read.
func TestCacheExact(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	now := start.Add(62*time.Hour + 25*time.Minute) // inside the history: later hours are not past
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			w := open(t, spec) // the writers' and the reference reader's handle
			history(t, w, start)
			// Half the history compacted: the cache fills from pieces
			// and from rows.
			if _, err := w.Compact(ctx, start.Add(36*time.Hour)); err != nil {
				t.Fatal(err)
			}
			c := open(t, spec)
			c.EnableCache(store.CacheConfig{Now: func() time.Time { return now }})
			rng := rand.New(rand.NewPCG(5, 6))
			ranges := []store.Range{{}, {Since: now.Add(-24 * time.Hour)}, {Since: now.Add(-30 * time.Hour), Until: now},
				{Since: start.Add(3 * time.Hour), Until: start.Add(70 * time.Hour)}, {Since: start.Truncate(24 * time.Hour).Add(24 * time.Hour)}}
			for i := 0; i < 12; i++ {
				a := start.Add(time.Duration(rng.Int64N(int64(75*time.Hour))) - 2*time.Hour)
				ranges = append(ranges, store.Range{Since: a, Until: a.Add(time.Duration(rng.Int64N(int64(50 * time.Hour))))})
			}
			check := func(stage string) {
				t.Helper()
				for _, r := range ranges {
					got, err := c.Observations(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					want, err := w.ObservationsFromMinutes(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%s: range %s – %s: the cached reader gives %d flows, the minutes %d, or different counters", stage, r.Since, r.Until, len(got), len(want))
					}
				}
			}
			check("first read")
			st := c.CacheStats()
			if st.Fills == 0 || st.Pieces == 0 {
				t.Fatalf("the cache filled nothing: %+v", st)
			}
			check("from the cache")
			if got := c.CacheStats(); got.Hits <= st.Hits || got.Fills != st.Fills {
				t.Fatalf("the second read did not come from the cache: before %+v, after %+v", st, got)
			}

			// Late writes into a past hour the cache holds, on a known
			// flow and a new one, and into the current hour.
			late := start.Add(40*time.Hour + 10*time.Minute)
			lateObs := func(at time.Time, comm string) store.Observation {
				return store.Observation{Bucket: at.Truncate(time.Minute), HostID: "h1", Direction: "outbound", Proto: "tcp",
					LocalAddr: "198.51.100.1", RemoteAddr: "198.51.100.10", Port: 8000, Comm: comm,
					Counters:  tracer.Counters{Connections: 7, BytesSent: 70, ConnectLatencyMaxUs: 9_999_999},
					FirstSeen: at.Add(-time.Hour), LastSeen: at}
			}
			before := c.CacheStats()
			if err := w.Write(ctx, store.Batch{Observations: []store.Observation{lateObs(late, "p0"), lateObs(late, "late-new"), lateObs(now.Add(-time.Minute), "p0")}}); err != nil {
				t.Fatal(err)
			}
			check("after late writes")
			if got := c.CacheStats(); got.Dropped <= before.Dropped {
				t.Errorf("a late write dropped nothing: before %+v, after %+v", before, got)
			}

			// A late write whose log entry is pruned before the cache
			// reads it: the cache must start over.
			before = c.CacheStats()
			if err := w.Write(ctx, store.Batch{Observations: []store.Observation{lateObs(late.Add(-5*time.Hour), "p1")}}); err != nil {
				t.Fatal(err)
			}
			if err := w.PruneWriteLog(ctx, time.Now().Add(time.Hour).UnixNano()); err != nil {
				t.Fatal(err)
			}
			check("after pruning the write log")
			if got := c.CacheStats(); got.Resets <= before.Resets {
				t.Errorf("a pruned log did not reset the cache: before %+v, after %+v", before, got)
			}

			before = c.CacheStats()
			if _, err := w.Retain(ctx, start.Add(20*time.Hour+30*time.Minute), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			check("after retention")
			if got := c.CacheStats(); got.Resets <= before.Resets {
				t.Errorf("retention did not reset the cache: before %+v, after %+v", before, got)
			}
			// New flows after retention (SQLite may reuse a deleted
			// key's id) are named right.
			if err := w.Write(ctx, store.Batch{Observations: []store.Observation{lateObs(late, "after-retention")}}); err != nil {
				t.Fatal(err)
			}
			check("after a write following retention")

			// A bound smaller than one hour's sums: still exact.
			small := open(t, spec)
			small.EnableCache(store.CacheConfig{Bytes: 1, Now: func() time.Time { return now }})
			for _, r := range ranges[:3] {
				got, err := small.Observations(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				want, err := w.ObservationsFromMinutes(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("a cache bounded to 1 byte: range %s – %s: %d flows, the minutes %d, or different counters", r.Since, r.Until, len(got), len(want))
				}
			}
			if st := small.CacheStats(); st.Evicted == 0 || st.Pieces > 0 {
				t.Errorf("a cache bounded to 1 byte kept pieces or evicted none: %+v", st)
			}
		})
	}
}

// A store written before the write log (schema 6) opens, migrates, and
// answers the same; writes and the cache then work on it. Schema 7 only
// adds the write log, so a schema-6 store is this build's store without
// it (nor the pieces of schema 8), which is how the test makes one.
func TestUpgradeToWriteLog(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			s.SetAutoCompact(false) // its tables are dropped below
			history(t, s, start)
			ranges := []store.Range{{}, {Since: start.Add(30 * time.Hour)}, {Since: start.Add(5 * time.Hour), Until: start.Add(47*time.Hour + 3*time.Minute)}}
			var want [][]store.Observation
			for _, r := range ranges {
				o, err := s.Observations(ctx, r)
				if err != nil || len(o) == 0 {
					t.Fatalf("%d observations, %v", len(o), err)
				}
				want = append(want, o)
			}
			undoSchema11(t, s, want)
			for _, q := range []string{`DROP TABLE write_log`, `DROP TABLE write_log_state`, `DROP TABLE flow_pieces`, `DROP TABLE piece_state`, `DROP TABLE piece_todo`, `DROP TABLE key_pack`,
				`ALTER TABLE retention_state DROP COLUMN hours_from`, `ALTER TABLE retention_state DROP COLUMN days_from`, `ALTER TABLE retention_state DROP COLUMN ceiling_size`, `DROP TABLE end_identities`, `DELETE FROM schema_version WHERE version >= 7`} {
				if _, err := s.DB().ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if v, err := s.Version(ctx); err != nil || v != 6 {
				t.Fatalf("made schema %d (%v), want 6", v, err)
			}
			s.Close()

			u := open(t, spec)
			if v, err := u.Version(ctx); err != nil || v != store.SchemaVersion || v < 7 {
				t.Fatalf("after upgrade: schema %d (%v), want %d", v, err, store.SchemaVersion)
			}
			u.EnableCache(store.CacheConfig{Now: func() time.Time { return start.Add(80 * time.Hour) }})
			for i, r := range ranges {
				for pass := 0; pass < 2; pass++ { // filling the cache, then from it
					got, err := u.Observations(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, want[i]) {
						t.Errorf("after upgrade, pass %d: range %s – %s: %d flows, before %d, or different counters", pass, r.Since, r.Until, len(got), len(want[i]))
					}
				}
			}
			w := open(t, spec)
			at := start.Add(10 * time.Hour)
			o := store.Observation{Bucket: at.Truncate(time.Minute), HostID: "h0", Direction: "outbound", Proto: "tcp", LocalAddr: "198.51.100.1",
				RemoteAddr: "198.51.100.10", Port: 8000, Comm: "p0", Counters: tracer.Counters{Connections: 1000}, FirstSeen: at, LastSeen: at}
			if err := w.Write(ctx, store.Batch{Observations: []store.Observation{o}}); err != nil {
				t.Fatal(err)
			}
			got, err := u.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := w.ObservationsFromMinutes(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, ref) {
				t.Errorf("after upgrade and a late write: the cached reader gives %d flows, the minutes %d, or different counters", len(got), len(ref))
			}
			if fmt.Sprint(got) == fmt.Sprint(want[0]) {
				t.Errorf("the late write of 1000 connections changed nothing")
			}
		})
	}
}

// Writers writing into cached hours while the cached reader reads: once
// they are done, the reader answers exactly what the store holds (a write
// still in progress while the reader took its snapshot must not be lost).
func TestCacheExactUnderConcurrentWrites(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	now := start.Add(72 * time.Hour)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			w := open(t, spec)
			history(t, w, start)
			c := open(t, spec)
			c.EnableCache(store.CacheConfig{Now: func() time.Time { return now }})
			r := store.Range{Since: now.Add(-48*time.Hour - 7*time.Minute)}
			if _, err := c.Observations(ctx, r); err != nil {
				t.Fatal(err)
			}
			const writers, batches = 4, 25
			done := make(chan error, writers)
			for i := 0; i < writers; i++ {
				go func(i int) {
					ws, err := store.Open(ctx, spec)
					if err != nil {
						done <- err
						return
					}
					defer ws.Close()
					rng := rand.New(rand.NewPCG(uint64(i), 9))
					for b := 0; b < batches; b++ {
						at := now.Add(-time.Duration(rng.Int64N(int64(47 * time.Hour))))
						o := store.Observation{Bucket: at.Truncate(time.Minute), HostID: fmt.Sprintf("h%d", rng.IntN(3)), Direction: "outbound", Proto: "tcp",
							LocalAddr: "198.51.100.1", RemoteAddr: "198.51.100.10", Port: uint16(8000 + rng.IntN(4)), Comm: fmt.Sprintf("w%d", rng.IntN(3)),
							Counters: tracer.Counters{Connections: 1 + rng.Uint64N(5), BytesSent: rng.Uint64N(1000)}, FirstSeen: at, LastSeen: at}
						if err := ws.Write(ctx, store.Batch{Observations: []store.Observation{o}}); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}(i)
			}
			reads := 0
			for finished := 0; finished < writers; {
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
					finished++
				default:
					if _, err := c.Observations(ctx, r); err != nil {
						t.Fatal(err)
					}
					reads++
				}
			}
			got, err := c.Observations(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			want, err := w.ObservationsFromMinutes(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("after %d concurrent writes and %d reads: the cached reader gives %d flows, the minutes %d, or different counters", writers*batches, reads, len(got), len(want))
			}
			if st := c.CacheStats(); st.Dropped == 0 || st.Hits == 0 {
				t.Errorf("the cache was not exercised: %+v", st)
			}
			t.Logf("%d writes, %d reads while they ran, cache %+v", writers*batches, reads, c.CacheStats())
		})
	}
}
