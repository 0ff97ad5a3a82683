package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// BenchmarkGrowth measures what the store takes per active dependency
// per day at each level, for sizing a disk or a PostgreSQL:
//
//	go test -run '^$' -bench Growth -benchtime 2x ./internal/store/
//
// growthDeps dependencies (flow keys of one host) each have counters in
// every minute of b.N UTC days, written one batch a minute (an agent
// writes one every 5 s into the same minute rows: the same rows, the
// same size), with a batch id as the agent's; then compacted (pieces
// built, as the agent's writes do in the background). PostgreSQL is
// measured after VACUUM FULL: the live data; add headroom for the row
// versions autovacuum has not yet reclaimed. Reported per level: the
// rows' table with its index plus the level's share of the pieces;
// B/dep: the flow keys and key pack (once per dependency, not per day);
// B/batch: applied_batches (one row per batch, kept store.BatchMemory).
func BenchmarkGrowth(b *testing.B) {
	const growthDeps = 200
	ctx := context.Background()
	for _, name := range []string{"sqlite", "postgres"} {
		if only := os.Getenv("DEPTRACE_BENCH_BACKEND"); only != "" && only != name {
			continue
		}
		b.Run(name, func(b *testing.B) {
			// A fresh store for every round (b.N): the sizes are of b.N days.
			spec := filepath.Join(b.TempDir(), "growth.db")
			if name == "postgres" {
				spec = pgtest.Start(b)
			}
			s, err := store.Open(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.SetAutoCompact(false)
			day0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
			batches := 0
			b.ResetTimer()
			for d := range b.N {
				for m := range 24 * 60 {
					at := day0.Add(time.Duration(d)*24*time.Hour + time.Duration(m)*time.Minute)
					batch := store.Batch{ID: fmt.Sprintf("0123456789abcdef0123456789abcdef-%d", batches)}
					for i := range growthDeps {
						batch.Observations = append(batch.Observations, growthObs(i, at))
					}
					if err := s.Write(ctx, batch); err != nil {
						b.Fatal(err)
					}
					batches++
				}
			}
			b.StopTimer()
			compact(b, s, name, day0.Add(time.Duration(b.N)*24*time.Hour+time.Hour))
			if name == "postgres" {
				if _, err := s.DB().ExecContext(ctx, `VACUUM FULL`); err != nil {
					b.Fatal(err)
				}
			}
			tables, err := s.TableBytes(ctx)
			if err != nil {
				b.Fatal(err)
			}
			pieces, err := s.PieceBytes(ctx)
			if err != nil {
				b.Fatal(err)
			}
			var pieceData int64
			for _, n := range pieces {
				pieceData += n
			}
			perDepDay := float64(growthDeps * b.N)
			var total float64
			for i, l := range []string{"minutes", "hours", "days"} {
				n := float64(tables["flow_"+l])
				if pieceData > 0 {
					n += float64(tables["flow_pieces"]) * float64(pieces[i]) / float64(pieceData)
				}
				total += n / perDepDay
				b.ReportMetric(n/perDepDay, "B/dep/day-"+l)
				b.Logf("%s: %s: table %d B, pieces %d B of data", name, l, tables["flow_"+l], pieces[i])
			}
			b.ReportMetric(total, "B/dep/day")
			b.ReportMetric(float64(tables["flow_keys"]+tables["key_pack"])/growthDeps, "B/dep")
			b.ReportMetric(float64(tables["applied_batches"])/float64(batches), "B/batch")
			size, err := s.Size(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: %d days of %d dependencies, %d batches: store %d B; tables %v", name, b.N, growthDeps, batches, size, tables)
		})
	}
}

// growthObs is dependency i's minute at at, with a busy service's
// counters: a few hundred connections and a few MB a minute, and an RTT
// sample per connection and harvest.
func growthObs(i int, at time.Time) store.Observation {
	dir := "outbound"
	if i%2 == 1 {
		dir = "inbound"
	}
	return store.Observation{
		Bucket: at, HostID: "web-17.prod.example", Direction: dir, Proto: "tcp",
		LocalAddr: "10.20.30.40", RemoteAddr: fmt.Sprintf("10.20.%d.%d", i/200, 1+i%200), Port: uint16(1000 + i), Comm: "service-" + fmt.Sprint(i%17), PID: 4242,
		Counters: tracer.Counters{Connections: 300 + uint64(i), BytesSent: 2_000_000 + uint64(i)*977, BytesReceived: 9_000_000 + uint64(i)*313,
			ConnectLatencyCount: 300, ConnectLatencySumUs: 90_000, ConnectLatencyMaxUs: 1_900, Retransmits: uint64(i % 3),
			RTTSamples: 312, RTTSumUs: 312 * (400 + uint64(i)), RTTMinUs: 120 + uint64(i%50), RTTMaxUs: 2_100 + uint64(i)},
		FirstSeen: at.Add(time.Second), LastSeen: at.Add(59 * time.Second),
	}
}
