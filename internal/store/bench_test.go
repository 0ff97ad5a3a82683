package store_test

// Benchmarks of the store: ingest from many simulated agents, and queries
// on a graph of 10,000 nodes and 50,000 edges with a day of history.
//
//	go test -run '^$' -bench . -benchtime 3x ./internal/store/
//
// Results are written down in docs/performance.md.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// benchBackends gives a fresh SQLite file and a throwaway PostgreSQL.
// With DEPTRACE_BENCH_DIR set, the SQLite file of history (named after
// the benchmark) is kept there and reused by later runs on the same UTC
// day (the history is pinned to today), to profile
// queries without loading the history each time; with
// DEPTRACE_BENCH_BACKEND=sqlite or postgres, only that back end runs.
func benchBackends(b *testing.B) map[string]string {
	only := os.Getenv("DEPTRACE_BENCH_BACKEND")
	out := map[string]string{}
	if only == "" || only == "sqlite" {
		out["sqlite"] = filepath.Join(b.TempDir(), "bench.db")
		if dir := os.Getenv("DEPTRACE_BENCH_DIR"); dir != "" {
			out["sqlite"] = filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "-")+".db")
		}
	}
	if only == "" || only == "postgres" {
		out["postgres"] = pgtest.Start(b)
	}
	return out
}

// loaded reports whether s already holds a history (a reused file).
func loaded(b *testing.B, s *store.Store) bool {
	hosts, err := s.Hosts(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return len(hosts) > 0
}

func hostAddr(h int) string { return fmt.Sprintf("10.%d.%d.1", h/256, h%256) }

// BenchmarkIngest: 16 simulated agents, each writing batches of 500 distinct
// edges (one interval of a busy host) concurrently.
func BenchmarkIngest(b *testing.B) {
	for name, spec := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			const agents, edgesPerBatch = 16, 500
			stores := make([]*store.Store, agents)
			for i := range stores {
				s, err := store.Open(context.Background(), spec)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				stores[i] = s
			}
			var next atomic.Int64
			at := time.Now().Truncate(time.Minute)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for a := 0; a < agents; a++ {
				wg.Add(1)
				go func(a int) {
					defer wg.Done()
					host := fmt.Sprintf("agent-%d", a)
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						batch := store.Batch{Hosts: []store.Host{{ID: host, Name: host, Addrs: []string{hostAddr(a)}, LastSeen: at}}}
						for e := 0; e < edgesPerBatch; e++ {
							batch.Observations = append(batch.Observations, store.Observation{
								Bucket: at.Add(time.Duration(i) * time.Minute), HostID: host, Direction: "outbound", Proto: "tcp",
								LocalAddr: hostAddr(a), RemoteAddr: hostAddr(e), Port: 5432, Comm: "app",
								Counters: tracer.Counters{Connections: 3, BytesSent: 100, BytesReceived: 1000}, FirstSeen: at, LastSeen: at})
						}
						if err := stores[a].Write(context.Background(), batch); err != nil {
							b.Error(err)
							return
						}
					}
				}(a)
			}
			wg.Wait()
			b.ReportMetric(float64(b.N*edgesPerBatch)/time.Since(start).Seconds(), "edges/s")
		})
	}
}

// dayOfHistory writes 2,500 hosts, each with one client process and three
// services (10,000 nodes), each client using 20 services elsewhere (50,000
// edges), every edge active once an hour for 24 hours (1.2 M rows).
func dayOfHistory(b *testing.B, s *store.Store, now time.Time) {
	const hosts, fanout = 2500, 20
	ports := []uint16{80, 5432, 6379}
	procs := []string{"nginx", "postgres", "redis-server"}
	ctx := context.Background()
	var hb store.Batch
	for h := 0; h < hosts; h++ {
		hb.Hosts = append(hb.Hosts, store.Host{ID: fmt.Sprintf("h%d", h), Name: fmt.Sprintf("h%d", h), Addrs: []string{hostAddr(h)}, LastSeen: now})
	}
	if err := s.Write(ctx, hb); err != nil {
		b.Fatal(err)
	}
	for hour := 24; hour >= 1; hour-- {
		at := now.Add(-time.Duration(hour) * time.Hour)
		for first := 0; first < hosts; first += 250 {
			var batch store.Batch
			for h := first; h < first+250; h++ {
				for k := 0; k < fanout; k++ {
					peer := (h + 1 + k*97) % hosts
					svc := k % 3
					batch.Observations = append(batch.Observations,
						store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", h), Direction: "outbound", Proto: "tcp",
							LocalAddr: hostAddr(h), RemoteAddr: hostAddr(peer), Port: ports[svc], Comm: "app",
							Counters: tracer.Counters{Connections: 5, BytesSent: 500, BytesReceived: 5000}, FirstSeen: at, LastSeen: at.Add(time.Second)})
					if k < 3 { // the service's own view names its process
						batch.Observations = append(batch.Observations,
							store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", peer), Direction: "inbound", Proto: "tcp",
								LocalAddr: hostAddr(peer), RemoteAddr: hostAddr(h), Port: ports[svc], Comm: procs[svc],
								Counters: tracer.Counters{Connections: 5, BytesSent: 5000, BytesReceived: 500}, FirstSeen: at, LastSeen: at.Add(time.Second)})
					}
				}
			}
			if err := s.Write(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchNow is a fixed time of day (12:30 UTC, today), so that a "last
// 24 h" range always splits the same way into minutes, hours and days:
// 30 minutes of minute buckets, 11 hours of hourly rollups of yesterday,
// and today's daily rollup.
func benchNow() time.Time {
	return time.Now().UTC().Truncate(24 * time.Hour).Add(12*time.Hour + 30*time.Minute)
}

// queryBench times building the whole graph (store query, listeners and
// the Go join), and look at depth 3 from one host.
//
// how: "" (the default: pieces, rollups, rows), "minutes" (minute rows
// only) or "rows" (rollups and rows, no pieces: schema 7's way).
func queryBench(b *testing.B, s *store.Store, label string, r store.Range, look bool, how string) {
	ctx := context.Background()
	hosts, err := s.Hosts(ctx)
	if err != nil {
		b.Fatal(err)
	}
	plan, err := s.PlanRows(ctx, r)
	if err != nil {
		b.Fatal(err)
	}
	if how == "" && s.CacheStats() == (store.CacheStats{}) {
		b.Logf("%s reads bucket rows and pieces %v", label, plan)
	}
	b.Run(label, func(b *testing.B) {
		var g graph.Graph
		var rows int
		var queryTime time.Duration
		cpu0 := cpuTime()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			var obs []store.Observation
			switch how {
			case "minutes":
				obs, err = s.ObservationsFromMinutes(ctx, r)
			case "rows":
				obs, err = s.ObservationsWithoutPieces(ctx, r)
			default:
				obs, err = s.Observations(ctx, r)
			}
			if err != nil {
				b.Fatal(err)
			}
			ls, err := s.Listeners(ctx, r)
			if err != nil {
				b.Fatal(err)
			}
			queryTime += time.Since(t0)
			rows = len(obs)
			g = graph.Build(obs, hosts, ls)
			if look {
				roots, err := graph.Resolve(g, hosts, "h42")
				if err != nil {
					b.Fatal(err)
				}
				graph.Look(g, roots, 3, true, true, 0)
			}
		}
		b.ReportMetric(float64(len(g.Nodes)), "nodes")
		b.ReportMetric(float64(len(g.Edges)), "edges")
		b.ReportMetric(float64(rows), "flows")
		b.ReportMetric(queryTime.Seconds()/float64(b.N), "store-s/op")
		// CPU time of this process: all the work for SQLite, decoding and
		// the graph for PostgreSQL. On a shared machine it moves less than
		// wall time with the load.
		b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
		var total int64
		for t, n := range plan {
			if t != "flow_pieces" {
				total += n
			}
		}
		if how == "" && s.CacheStats() == (store.CacheStats{}) {
			b.ReportMetric(float64(total), "bucket-rows")
			b.ReportMetric(float64(plan["flow_pieces"]), "pieces")
		}
	})
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkQueryDay: a day of history, every edge active once an hour.
func BenchmarkQueryDay(b *testing.B) {
	for name, spec := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := store.Open(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			now := benchNow()
			t0 := time.Now()
			if !loaded(b, s) {
				dayOfHistory(b, s, now)
			}
			b.Logf("%s: loaded a day of history in %s", name, time.Since(t0).Round(time.Millisecond))
			compact(b, s, name, now)
			day := store.Range{Since: now.Add(-24 * time.Hour)}
			sameAsRows(b, s, map[string]store.Range{"24h": day, "24h-closed": {Since: now.Add(-24*time.Hour - 17*time.Second), Until: now.Add(-17 * time.Second)},
				"1h": {Since: now.Add(-time.Hour)}, "7h-odd": {Since: now.Add(-7*time.Hour - 29*time.Minute - 3*time.Second), Until: now.Add(-2*time.Hour + 11*time.Minute)}})
			queryBench(b, s, "graph-24h", day, false, "")
			queryBench(b, s, "graph-24h-no-pieces", day, false, "rows")
			queryBench(b, s, "graph-24h-minutes-only", day, false, "minutes")
			queryBench(b, s, "graph-24h-closed", store.Range{Since: now.Add(-24*time.Hour - 17*time.Second), Until: now.Add(-17 * time.Second)}, false, "")
			queryBench(b, s, "graph-1h", store.Range{Since: now.Add(-time.Hour)}, false, "")
			queryBench(b, s, "look-depth3-24h", day, true, "")
			cachedBench(b, spec, now, "24h", day)
		})
	}
}

// BenchmarkQueryDayBusyHour: the day history, and every edge active once
// more at 12:10, in the hour that is current at 12:30: under steady
// traffic the current hour holds a row per active flow, which a query
// reads as rows (it has no piece yet).
func BenchmarkQueryDayBusyHour(b *testing.B) {
	for name, spec := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := store.Open(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			now := benchNow()
			if !loaded(b, s) {
				dayOfHistory(b, s, now)
				busyHour(b, s, now.Add(-20*time.Minute))
			}
			compact(b, s, name, now)
			day := store.Range{Since: now.Add(-24 * time.Hour)}
			sameAsRows(b, s, map[string]store.Range{"24h": day})
			queryBench(b, s, "graph-24h", day, false, "")
			queryBench(b, s, "graph-24h-closed", store.Range{Since: now.Add(-24*time.Hour - 17*time.Second), Until: now.Add(-17 * time.Second)}, false, "")
			queryBench(b, s, "graph-24h-no-pieces", day, false, "rows")
		})
	}
}

// busyHour writes every edge of dayOfHistory once more, at at.
func busyHour(b *testing.B, s *store.Store, at time.Time) {
	const hosts, fanout = 2500, 20
	ports := []uint16{80, 5432, 6379}
	procs := []string{"nginx", "postgres", "redis-server"}
	for first := 0; first < hosts; first += 250 {
		var batch store.Batch
		for h := first; h < first+250; h++ {
			for k := 0; k < fanout; k++ {
				peer := (h + 1 + k*97) % hosts
				svc := k % 3
				batch.Observations = append(batch.Observations,
					store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", h), Direction: "outbound", Proto: "tcp",
						LocalAddr: hostAddr(h), RemoteAddr: hostAddr(peer), Port: ports[svc], Comm: "app",
						Counters: tracer.Counters{Connections: 2, BytesSent: 200, BytesReceived: 2000}, FirstSeen: at, LastSeen: at.Add(time.Second)})
				if k < 3 {
					batch.Observations = append(batch.Observations,
						store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", peer), Direction: "inbound", Proto: "tcp",
							LocalAddr: hostAddr(peer), RemoteAddr: hostAddr(h), Port: ports[svc], Comm: procs[svc],
							Counters: tracer.Counters{Connections: 2, BytesSent: 2000, BytesReceived: 200}, FirstSeen: at, LastSeen: at.Add(time.Second)})
				}
			}
		}
		if err := s.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}

// monthOfHistory writes the same 10,000 nodes and 50,000 edges as
// dayOfHistory over 30 days, every edge active once a day (at an hour
// that differs per edge): 1.7 M observations.
func monthOfHistory(b *testing.B, s *store.Store, now time.Time) {
	const hosts, fanout = 2500, 20
	ports := []uint16{80, 5432, 6379}
	procs := []string{"nginx", "postgres", "redis-server"}
	ctx := context.Background()
	var hb store.Batch
	for h := 0; h < hosts; h++ {
		hb.Hosts = append(hb.Hosts, store.Host{ID: fmt.Sprintf("h%d", h), Name: fmt.Sprintf("h%d", h), Addrs: []string{hostAddr(h)}, LastSeen: now})
	}
	if err := s.Write(ctx, hb); err != nil {
		b.Fatal(err)
	}
	for day := 30; day >= 1; day-- {
		for first := 0; first < hosts; first += 250 {
			var batch store.Batch
			for h := first; h < first+250; h++ {
				at := now.Add(-time.Duration(day)*24*time.Hour + time.Duration(h%24)*time.Hour)
				for k := 0; k < fanout; k++ {
					peer := (h + 1 + k*97) % hosts
					svc := k % 3
					c := tracer.Counters{Connections: 5, BytesSent: 500, BytesReceived: 5000, ConnectLatencyCount: 5, ConnectLatencySumUs: 1500, ConnectLatencyMaxUs: 700}
					batch.Observations = append(batch.Observations,
						store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", h), Direction: "outbound", Proto: "tcp",
							LocalAddr: hostAddr(h), RemoteAddr: hostAddr(peer), Port: ports[svc], Comm: "app",
							Counters: c, FirstSeen: at, LastSeen: at.Add(time.Second)})
					if k < 3 {
						batch.Observations = append(batch.Observations,
							store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", peer), Direction: "inbound", Proto: "tcp",
								LocalAddr: hostAddr(peer), RemoteAddr: hostAddr(h), Port: ports[svc], Comm: procs[svc],
								Counters: tracer.Counters{Connections: 5, BytesSent: 5000, BytesReceived: 500}, FirstSeen: at, LastSeen: at.Add(time.Second)})
					}
				}
			}
			if err := s.Write(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkQueryMonth: 30 days of history, every edge active once a day.
func BenchmarkQueryMonth(b *testing.B) {
	for name, spec := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := store.Open(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			now := benchNow()
			t0 := time.Now()
			if !loaded(b, s) {
				monthOfHistory(b, s, now)
			}
			b.Logf("%s: loaded 30 days of history in %s", name, time.Since(t0).Round(time.Millisecond))
			compact(b, s, name, now)
			month := store.Range{Since: now.Add(-30 * 24 * time.Hour)}
			sameAsRows(b, s, map[string]store.Range{"30d": month, "30d-closed": {Since: now.Add(-30*24*time.Hour - 17*time.Second), Until: now.Add(-17 * time.Second)},
				"24h": {Since: now.Add(-24 * time.Hour)}, "9d-odd": {Since: now.Add(-12*24*time.Hour - 5*time.Hour - 31*time.Minute - 7*time.Second), Until: now.Add(-3*24*time.Hour + 13*time.Hour + 2*time.Minute)}})
			queryBench(b, s, "graph-30d", month, false, "")
			queryBench(b, s, "graph-30d-no-pieces", month, false, "rows")
			queryBench(b, s, "graph-30d-minutes-only", month, false, "minutes")
			queryBench(b, s, "graph-30d-closed", store.Range{Since: now.Add(-30*24*time.Hour - 17*time.Second), Until: now.Add(-17 * time.Second)}, false, "")
			queryBench(b, s, "graph-24h", store.Range{Since: now.Add(-24 * time.Hour)}, false, "")
			cachedBench(b, spec, now, "30d", month)
		})
	}
}

// cachedBench times a long-running reader's queries (deptrace serve, with
// the cache of past hours and days): the first query of a fresh cache,
// which reads and keeps them ("cache-fill"), and later ones ("cached").
func cachedBench(b *testing.B, spec string, now time.Time, label string, r store.Range) {
	ctx := context.Background()
	cfg := store.CacheConfig{Now: func() time.Time { return now }}
	b.Run("graph-"+label+"-cache-fill", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s, err := store.Open(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			s.EnableCache(cfg)
			if _, err := s.Observations(ctx, r); err != nil {
				b.Fatal(err)
			}
			st := s.CacheStats()
			b.ReportMetric(float64(st.Bytes)/1e6, "cache-MB")
			s.Close()
		}
	})
	s, err := store.Open(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.EnableCache(cfg)
	if _, err := s.Observations(ctx, r); err != nil {
		b.Fatal(err)
	}
	queryBench(b, s, "graph-"+label+"-cached", r, false, "")
}

// sameAsRows fails the benchmark unless every range gives the same
// observations from pieces as from the rollup rows alone (schema 7's way)
// on the benchmark's history.
func sameAsRows(b *testing.B, s *store.Store, ranges map[string]store.Range) {
	ctx := context.Background()
	for label, r := range ranges {
		got, err := s.Observations(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		want, err := s.ObservationsWithoutPieces(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 || !reflect.DeepEqual(got, want) {
			b.Fatalf("%s: pieces give %d flows, the rows %d, or different counters", label, len(got), len(want))
		}
	}
	b.Logf("pieces and rows agree on %d ranges", len(ranges))
}

// compact builds the pieces of the history (what the agents' writes do in
// the background, see store.Compact) and logs what it took.
func compact(b *testing.B, s *store.Store, name string, now time.Time) {
	t0 := time.Now()
	st, err := s.Compact(context.Background(), now)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: compacted in %s: %+v", name, time.Since(t0).Round(time.Millisecond), st)
}

// BenchmarkAgentInterval: one agent's interval as `deptrace agent` writes
// it with 1,000 client hosts (docs/performance.md, "The agent and its
// output"): the flows with the counters short-lived TCP fills (the
// client's with its connect latency, both with RTT), already in the store
// from the interval before (the same keys), 5 s apart (a new minute every
// twelve intervals), into SQLite. "steady": 1,000 clients, 2,000 flows an
// interval. "varying": 700 to 1,000 clients an interval, and every
// seventh client's flow in one interval of three with failed connects
// (refused, timed out), so that row counts and sets of columns vary as
// the agent's do:
//
//	go test -run '^$' -bench AgentInterval -benchtime 60x ./internal/store/
func BenchmarkAgentInterval(b *testing.B) {
	b.Run("steady", func(b *testing.B) { agentIntervals(b, false) })
	b.Run("varying", func(b *testing.B) { agentIntervals(b, true) })
}

func agentIntervals(b *testing.B, varying bool) {
	s, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "agent.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	at := time.Now().Truncate(time.Minute)
	flows := 0
	batch := func(i int) store.Batch {
		// The agent's default 5 s interval: twelve intervals a minute.
		seen := at.Add(time.Duration(i) * 5 * time.Second)
		bucket := seen.Truncate(time.Minute)
		bt := store.Batch{Hosts: []store.Host{{ID: "h", Name: "h", Addrs: []string{"10.0.0.1"}, LastSeen: seen}}}
		clients := 1000
		if varying {
			clients = 700 + i*37%301
		}
		for c := 0; c < clients; c++ {
			client := fmt.Sprintf("127.0.%d.%d", c/250, c%250+1)
			out := tracer.Counters{Connections: 25, BytesSent: 1600, BytesReceived: 1600, ConnectLatencyCount: 25, ConnectLatencySumUs: 1250, ConnectLatencyMaxUs: 90,
				RTTSamples: 25, RTTSumUs: 500, RTTMinUs: 11, RTTMaxUs: 40}
			if varying && c%7 == i%3 {
				out.FailedConnections, out.FailedRefused, out.FailedTimeout = 3, 2, 1
			}
			bt.Observations = append(bt.Observations,
				store.Observation{Bucket: bucket, HostID: "h", Direction: "outbound", Proto: "tcp", LocalAddr: client, RemoteAddr: "127.0.0.1", Port: 7000, Comm: "deptrace-bench",
					Counters: out, FirstSeen: seen, LastSeen: seen},
				store.Observation{Bucket: bucket, HostID: "h", Direction: "inbound", Proto: "tcp", LocalAddr: "127.0.0.1", RemoteAddr: client, Port: 7000, Comm: "deptrace-bench",
					Counters: tracer.Counters{Connections: 25, BytesSent: 1600, BytesReceived: 1600, RTTSamples: 25, RTTSumUs: 450, RTTMinUs: 9, RTTMaxUs: 35}, FirstSeen: seen, LastSeen: seen})
		}
		return bt
	}
	if err := s.Write(context.Background(), batch(0)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer() // the batch is the tracer's work, not the store's
		bt := batch(i + 1)
		flows += len(bt.Observations)
		b.StartTimer()
		if err := s.Write(context.Background(), bt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(flows), "µs/flow")
}
