package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// quiet opens a store that builds pieces only when told (Compact), so
// that a test knows what is compacted when.
func quiet(t *testing.T, spec string) *store.Store {
	s := open(t, spec)
	s.SetAutoCompact(false)
	return s
}

// randomRanges returns ranges over [start-4h, start+80h): open ends, ends
// cut inside minutes, ends on minutes, hours and days.
func randomRanges(start time.Time, seed uint64, n int) []store.Range {
	rng := rand.New(rand.NewPCG(seed, 4))
	out := []store.Range{{}, {Since: start.Add(5 * time.Hour)}, {Until: start.Add(50 * time.Hour)}, {Since: start.Add(26*time.Hour + 13*time.Second)}}
	for i := 0; i < n; i++ {
		a := start.Add(time.Duration(rng.Int64N(int64(84*time.Hour))) - 4*time.Hour)
		b := a.Add(time.Duration(rng.Int64N(int64(60 * time.Hour))))
		switch i % 5 {
		case 0:
			a, b = a.Truncate(time.Hour), b.Truncate(24*time.Hour).Add(24*time.Hour)
		case 1:
			a, b = a.Truncate(time.Minute), b.Truncate(time.Minute)
		case 2:
			a, b = a.Truncate(24*time.Hour), b.Truncate(time.Hour)
		case 3:
			b = time.Time{}
		}
		out = append(out, store.Range{Since: a, Until: b})
	}
	return out
}

// sameAnswers checks that every range gives the same observations from
// the pieces and rollups as from the minute rows alone, and as SQL's own
// GROUP BY of the minute rows.
func sameAnswers(t *testing.T, s *store.Store, stage string, ranges []store.Range) {
	t.Helper()
	ctx := context.Background()
	for _, r := range ranges {
		got, err := s.Observations(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		want, err := s.ObservationsFromMinutes(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: range %s – %s: pieces and rollups give %d flows, minutes %d, or different counters", stage, r.Since, r.Until, len(got), len(want))
		}
		ref, err := s.ObservationsSQL(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(want, ref) {
			t.Errorf("%s: range %s – %s: the minutes summed by the store give %d flows, by SQL %d, or different counters", stage, r.Since, r.Until, len(want), len(ref))
		}
	}
}

// Pieces equal the rows of their buckets value by value, queries that
// read them answer exactly what the minute rows give, late writes into
// compacted buckets make no piece stale (they are deleted, queued, and
// built again), and retention removes pieces with the rest.
func TestPiecesEqualRows(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	ranges := randomRanges(start, 11, 40)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			history(t, s, start)
			st, err := s.Compact(ctx, start.Add(100*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if st.Pieces == 0 || st.Busy {
				t.Fatalf("compaction built nothing or was busy: %+v", st)
			}
			pieces, flows, err := s.PiecesMatchRows(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("compacted: %+v; %d pieces of %d flows in all", st, pieces, flows)
			used := 0
			for _, r := range ranges {
				plan, err := s.PlanRows(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if plan["flow_pieces"] > 0 {
					used++
				}
			}
			if used < len(ranges)/2 {
				t.Fatalf("only %d of %d ranges read pieces", used, len(ranges))
			}
			sameAnswers(t, s, "compacted", ranges)

			// Late writes into compacted minutes, hours and days, from
			// another handle, as a replayed spool would.
			w := quiet(t, spec)
			var late []store.Observation
			for i := 0; i < 30; i++ {
				at := start.Add(time.Duration(i)*2*time.Hour + 7*time.Minute + 30*time.Second)
				late = append(late, store.Observation{Bucket: at.Truncate(time.Minute), HostID: "h1", Direction: "outbound", Proto: "tcp",
					LocalAddr: "198.51.100.1", RemoteAddr: "198.51.100.10", Port: 8000, Comm: []string{"p0", "late-new"}[i%2],
					Counters:  tracer.Counters{Connections: 7, BytesSent: 70, ConnectLatencyMaxUs: 9_999_999},
					FirstSeen: at.Add(-time.Hour), LastSeen: at})
			}
			if err := w.Write(ctx, store.Batch{Observations: late}); err != nil {
				t.Fatal(err)
			}
			queued, err := s.PiecesQueued(ctx)
			if err != nil || queued == 0 {
				t.Fatalf("late writes queued %d pieces (%v)", queued, err)
			}
			if _, _, err := s.PiecesMatchRows(ctx); err != nil {
				t.Fatalf("after late writes, before compaction: %v", err)
			}
			sameAnswers(t, s, "after late writes", ranges)
			st, err = s.Compact(ctx, start.Add(100*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if st.Todo != queued {
				t.Errorf("compaction rebuilt %d of the %d queued pieces: %+v", st.Todo, queued, st)
			}
			if n, _ := s.PiecesQueued(ctx); n != 0 {
				t.Errorf("%d pieces still queued", n)
			}
			if _, _, err := s.PiecesMatchRows(ctx); err != nil {
				t.Fatalf("after late writes, compacted again: %v", err)
			}
			sameAnswers(t, s, "after late writes, compacted again", ranges)

			if _, err := s.Retain(ctx, start.Add(30*time.Hour+17*time.Minute+20*time.Second), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			after, _, err := s.PiecesMatchRows(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if after >= pieces {
				t.Errorf("retention kept %d of %d pieces", after, pieces)
			}
			sameAnswers(t, s, "after retention", ranges)
		})
	}
}

// Writers writing late into compacted buckets while compactors run on
// other handles: once both are done, no piece differs from its rows, and
// queries answer what the minute rows give (on PostgreSQL the writers'
// and compactors' transactions run concurrently).
func TestPiecesExactUnderConcurrentWrites(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	now := start.Add(72 * time.Hour)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			history(t, s, start)
			if _, err := s.Compact(ctx, now); err != nil {
				t.Fatal(err)
			}
			const writers, batches, compactors = 4, 25, 2
			done := make(chan error, writers+compactors)
			stop := make(chan struct{})
			for i := 0; i < writers; i++ {
				go func(i int) {
					ws, err := store.Open(ctx, spec)
					if err != nil {
						done <- err
						return
					}
					defer ws.Close()
					ws.SetAutoCompact(false) // the compactors below do it
					rng := rand.New(rand.NewPCG(uint64(i), 9))
					for b := 0; b < batches; b++ {
						at := now.Add(-time.Duration(rng.Int64N(int64(71 * time.Hour))))
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
			runs := make(chan int, compactors)
			for i := 0; i < compactors; i++ {
				go func() {
					cs, err := store.Open(ctx, spec)
					if err != nil {
						done <- err
						return
					}
					defer cs.Close()
					n := 0
					for {
						select {
						case <-stop:
							runs <- n
							done <- nil
							return
						default:
						}
						if _, err := cs.Compact(ctx, now); err != nil {
							runs <- n
							done <- err
							return
						}
						n++
						if n > 100000 {
							runs <- n
							done <- fmt.Errorf("compactor looped %d times", n)
							return
						}
					}
				}()
			}
			for i := 0; i < writers; i++ {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			total := 0
			for i := 0; i < compactors; i++ {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				total += <-runs
			}
			if _, _, err := s.PiecesMatchRows(ctx); err != nil {
				t.Fatalf("after %d late writes and %d compactions: %v", writers*batches, total, err)
			}
			r := []store.Range{{}, {Since: now.Add(-48*time.Hour - 7*time.Minute)}, {Since: start.Add(90 * time.Minute), Until: now.Add(-3*time.Hour - 30*time.Second)}}
			sameAnswers(t, s, "after concurrent late writes and compactions", r)
			st, err := s.Compact(ctx, now)
			if err != nil || st.Busy {
				t.Fatalf("final compaction: %+v, %v", st, err)
			}
			if n, _ := s.PiecesQueued(ctx); n != 0 {
				t.Errorf("%d pieces still queued after a final compaction", n)
			}
			if _, _, err := s.PiecesMatchRows(ctx); err != nil {
				t.Fatal(err)
			}
			sameAnswers(t, s, "compacted again", r)
			t.Logf("%d late writes, %d compactions while they ran", writers*batches, total)
		})
	}
}

// A store of schema 7 (before pieces) opens, migrates to schema 8 and
// answers the same, before and after compaction builds the pieces of the
// rows it already held.
func TestUpgradeToPieces(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	ranges := randomRanges(start, 12, 15)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			history(t, s, start)
			var want [][]store.Observation
			for _, r := range ranges {
				o, err := s.ObservationsFromMinutes(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, o)
			}
			undoSchema11(t, s, want)
			for _, q := range []string{`DROP TABLE flow_pieces`, `DROP TABLE piece_state`, `DROP TABLE piece_todo`, `DROP TABLE key_pack`, `ALTER TABLE retention_state DROP COLUMN hours_from`, `ALTER TABLE retention_state DROP COLUMN days_from`, `ALTER TABLE retention_state DROP COLUMN ceiling_size`, `DROP TABLE end_identities`, `DELETE FROM schema_version WHERE version >= 8`} {
				if _, err := s.DB().ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if v, err := s.Version(ctx); err != nil || v != 7 {
				t.Fatalf("made schema %d (%v), want 7", v, err)
			}
			s.Close()

			u := quiet(t, spec)
			if v, err := u.Version(ctx); err != nil || v != store.SchemaVersion || v < 8 {
				t.Fatalf("after upgrade: schema %d (%v), want %d", v, err, store.SchemaVersion)
			}
			check := func(stage string) {
				for i, r := range ranges {
					got, err := u.Observations(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, want[i]) {
						t.Errorf("%s: range %s – %s: %d flows, before the upgrade %d, or different counters", stage, r.Since, r.Until, len(got), len(want[i]))
					}
				}
			}
			check("upgraded")
			st, err := u.Compact(ctx, start.Add(100*time.Hour))
			if err != nil || st.Pieces == 0 {
				t.Fatalf("compaction after the upgrade: %+v, %v", st, err)
			}
			if _, _, err := u.PiecesMatchRows(ctx); err != nil {
				t.Fatal(err)
			}
			check("upgraded and compacted")
		})
	}
}

// A store written by a newer deptrace is refused with one line naming
// both versions.
func TestNewerSchemaIsRefused(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			if _, err := s.DB().ExecContext(ctx, fmt.Sprintf(`INSERT INTO schema_version (version) VALUES (%d)`, store.SchemaVersion+1)); err != nil {
				t.Fatal(err)
			}
			s.Close()
			_, err := store.Open(ctx, spec)
			if err == nil {
				t.Fatal("a store of a newer schema opened")
			}
			want := fmt.Sprintf("store has schema version %d, this deptrace knows up to %d: upgrade deptrace", store.SchemaVersion+1, store.SchemaVersion)
			if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line with %q", err, want)
			}
		})
	}
}

// Writes start a compaction in the background: once the writing handle
// is closed, the buckets it wrote have pieces, equal to their rows.
func TestWritesCompactInTheBackground(t *testing.T) {
	ctx := context.Background()
	start := time.Now().UTC().Add(-80 * time.Hour).Truncate(time.Hour)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			history(t, s, start) // in the past: sealed
			deadline := time.Now().Add(time.Minute)
			for {
				st, err := s.LastCompaction()
				if err != nil {
					t.Fatal(err)
				}
				if st.Pieces > 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			st, err := s.LastCompaction()
			if st.Pieces == 0 || err != nil {
				t.Fatalf("no background compaction finished within a minute: %+v, %v", st, err)
			}
			pieces, _, err := s.PiecesMatchRows(ctx)
			if err != nil || pieces == 0 {
				t.Fatalf("%d pieces after the background compaction, %v", pieces, err)
			}
			sameAnswers(t, s, "compacted in the background", randomRanges(start, 13, 10))
		})
	}
}

// The key pack names flows right after retention deleted the newest key
// (SQLite then gives its id to the next new key), and names and orders
// keys added after it was built.
func TestKeyPackAfterRetention(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			day := func(d int) time.Time { return t0.Add(time.Duration(d) * 24 * time.Hour) }
			// The old flow is written last: its key has the largest id.
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{
				obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", day(3), 1, 10),
			}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{
				obs("old", "outbound", "198.51.100.9", "198.51.100.3", 5432, "gone", day(0), 1, 10),
			}}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Compact(ctx, day(5)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Retain(ctx, day(2), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{
				obs("new", "outbound", "198.51.100.7", "198.51.100.3", 5432, "fresh", day(3), 1, 10),
				obs("aaa", "outbound", "198.51.100.8", "198.51.100.3", 5432, "first", day(3), 1, 10),
			}}); err != nil {
				t.Fatal(err)
			}
			check := func(stage string) {
				got, err := s.Observations(ctx, store.Range{})
				if err != nil {
					t.Fatal(err)
				}
				want, err := s.ObservationsFromMinutes(ctx, store.Range{})
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) || len(got) != 3 {
					t.Errorf("%s: %d flows %+v, the minutes %+v", stage, len(got), got, want)
				}
			}
			check("after retention")
			if _, err := s.Compact(ctx, day(5)); err != nil {
				t.Fatal(err)
			}
			check("packed again")
			// Keys added after the pack: named by id, placed by key.
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{
				obs("mmm", "outbound", "198.51.100.6", "198.51.100.3", 5432, "later", day(3), 1, 10),
				obs("zzz", "outbound", "198.51.100.5", "198.51.100.3", 5432, "last", day(3), 1, 10),
				obs("a", "outbound", "198.51.100.4", "198.51.100.3", 5432, "before", day(3), 1, 10),
			}}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			want, err := s.ObservationsFromMinutes(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) || len(got) != 6 {
				t.Errorf("keys added after the pack: %d flows %+v, the minutes %+v", len(got), got, want)
			}
		})
	}
}
