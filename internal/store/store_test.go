package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// backends opens a fresh store of each kind; every test runs on both.
func backends(t *testing.T) map[string]string {
	return map[string]string{
		"sqlite":   filepath.Join(t.TempDir(), "deptrace.db"),
		"postgres": pgtest.Start(t),
	}
}

func open(t *testing.T, spec string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

func obs(host, dir, local, remote string, port uint16, comm string, at time.Time, conns, sent uint64) store.Observation {
	return store.Observation{
		Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp",
		LocalAddr: local, RemoteAddr: remote, Port: port, Comm: comm, PID: 42,
		Counters: tracer.Counters{Connections: conns, BytesSent: sent, BytesReceived: sent * 2}, FirstSeen: at, LastSeen: at.Add(time.Second),
	}
}

// fleet is a three-host dataset: client -> web:80, web -> db:5432, and
// web -> an external DNS server nobody runs an agent on.
func fleet(at time.Time) store.Batch {
	return store.Batch{
		Hosts: []store.Host{
			{ID: "client", Name: "client", NetNS: 1, Addrs: []string{"198.51.100.1"}, LastSeen: at},
			{ID: "web", Name: "web", NetNS: 2, Addrs: []string{"198.51.100.2", "2001:db8::2"}, LastSeen: at},
			{ID: "db", Name: "db", NetNS: 3, Addrs: []string{"198.51.100.3"}, LastSeen: at},
		},
		Services: []store.Service{{HostID: "db", Proto: "tcp", Port: 5432, Comm: "postgres", LastSeen: at}},
		Observations: []store.Observation{
			obs("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", at, 5, 100),
			obs("web", "inbound", "198.51.100.2", "198.51.100.1", 80, "nginx", at, 5, 900),
			obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", at, 2, 50),
			obs("db", "inbound", "198.51.100.3", "198.51.100.2", 5432, "postgres", at, 2, 70),
			obs("web", "outbound", "198.51.100.2", "203.0.113.53", 53, "nginx", at, 0, 30),
		},
	}
}

func TestMigrationsAreIdempotent(t *testing.T) {
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			a := open(t, spec)
			v, err := a.Version(context.Background())
			if err != nil || v != store.SchemaVersion {
				t.Fatalf("version %d, %v; want %d", v, err, store.SchemaVersion)
			}
			b := open(t, spec) // a second agent starting on the same store
			if v, _ := b.Version(context.Background()); v != store.SchemaVersion {
				t.Errorf("reopened at version %d", v)
			}
		})
	}
}

func TestCountersAccumulate(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			first := obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", t0, 3, 10)
			second := first
			second.Connections, second.BytesSent, second.BytesReceived = 4, 5, 6
			second.FirstSeen, second.LastSeen = t0.Add(-time.Second), t0.Add(30*time.Second)
			for _, b := range []store.Batch{{Observations: []store.Observation{first}}, {Observations: []store.Observation{second, second}}} {
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("got %d rows: %+v", len(got), got)
			}
			o := got[0]
			if o.Connections != 3+4+4 || o.BytesSent != 10+5+5 || o.BytesReceived != 20+6+6 {
				t.Errorf("counters overwritten or lost: %+v", o)
			}
			if !o.FirstSeen.Equal(t0.Add(-time.Second)) || !o.LastSeen.Equal(t0.Add(30*time.Second)) {
				t.Errorf("first/last: %s %s", o.FirstSeen, o.LastSeen)
			}
		})
	}
}

func TestRangesSelectBuckets(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			for h := 0; h < 3; h++ { // one connection per hour at 10:00, 11:00, 12:00
				at := t0.Add(time.Duration(h) * time.Hour)
				if err := s.Write(ctx, store.Batch{Observations: []store.Observation{obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", at, 1, 1)}}); err != nil {
					t.Fatal(err)
				}
			}
			count := func(r store.Range) uint64 {
				got, err := s.Observations(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				var n uint64
				for _, o := range got {
					n += o.Connections
				}
				return n
			}
			if n := count(store.Range{}); n != 3 {
				t.Errorf("all: %d", n)
			}
			if n := count(store.Range{Since: t0.Add(30 * time.Minute)}); n != 2 {
				t.Errorf("since 10:30: %d", n)
			}
			if n := count(store.Range{Since: t0.Add(30 * time.Minute), Until: t0.Add(90 * time.Minute)}); n != 1 {
				t.Errorf("10:30-11:30: %d", n)
			}
			if n := count(store.Range{Until: t0}); n != 0 {
				t.Errorf("before 10:00: %d", n)
			}
		})
	}
}

// A range's ends outside what nanoseconds since 1970 hold (years 1678 to
// 2262), or at their very ends, read as far past or far future: the
// store's bucket arithmetic never overflows (the CLI and the API refuse
// such times, but the store's API is not theirs alone).
func TestRangesBeyondNanoseconds(t *testing.T) {
	ctx := context.Background()
	past := time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	future := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	first, last := time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			for h := 0; h < 3; h++ {
				at := t0.Add(time.Duration(h) * 25 * time.Hour) // three days, so every level answers
				if err := s.Write(ctx, store.Batch{
					Services:     []store.Service{{HostID: "db", Proto: "tcp", Port: 5432, Comm: "postgres", LastSeen: at}},
					Observations: []store.Observation{obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", at, 1, 1)},
				}); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range []struct {
				name string
				r    store.Range
				want uint64
			}{
				{"since the year 1000", store.Range{Since: past}, 3},
				{"until the year 3000", store.Range{Until: future}, 3},
				{"1000 to 3000", store.Range{Since: past, Until: future}, 3},
				{"since the year 3000", store.Range{Since: future}, 0},
				{"until the year 1000", store.Range{Until: past}, 0},
				{"since the first nanosecond", store.Range{Since: first}, 3},
				{"until the last nanosecond", store.Range{Until: last}, 3},
				{"the first to the last nanosecond", store.Range{Since: first, Until: last}, 3},
				{"since the last nanosecond", store.Range{Since: last}, 0},
				{"until the first nanosecond", store.Range{Until: first}, 0},
			} {
				got, err := s.Observations(ctx, c.r)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				var n uint64
				for _, o := range got {
					n += o.Connections
				}
				if n != c.want {
					t.Errorf("%s: %d connections, want %d", c.name, n, c.want)
				}
				// The services a range lists are chosen by the same ends.
				svcs, err := s.Services(ctx, c.r)
				if err != nil {
					t.Fatalf("%s: services: %v", c.name, err)
				}
				if want := min(c.want, 1); uint64(len(svcs)) != want {
					t.Errorf("%s: %d services, want %d", c.name, len(svcs), want)
				}
			}
		})
	}
}

func TestRetentionNeverTouchesRecentBuckets(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			var batch store.Batch
			for m := 0; m < 10; m++ { // buckets 10:00 ... 10:09
				batch.Observations = append(batch.Observations, obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", t0.Add(time.Duration(m)*time.Minute), 1, 1))
			}
			if err := s.Write(ctx, batch); err != nil {
				t.Fatal(err)
			}
			// Cutoff in the middle of the 10:05 bucket: 10:00-10:04 ended
			// before it and go; 10:05 (partly older) and later stay.
			cutoff := t0.Add(5*time.Minute + 30*time.Second)
			n, err := s.Retain(ctx, cutoff, store.DefaultBucket)
			if err != nil {
				t.Fatal(err)
			}
			if n != 5 {
				t.Errorf("deleted %d rows, want 5", n)
			}
			got, _ := s.Observations(ctx, store.Range{})
			if len(got) != 1 || got[0].Connections != 5 || !got[0].FirstSeen.Equal(t0.Add(5*time.Minute)) {
				t.Errorf("left %+v; want the 5 buckets from 10:05", got)
			}
		})
	}
}

func TestConcurrentAgents(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			const agents, rounds = 8, 20
			var wg sync.WaitGroup
			errs := make(chan error, agents)
			for a := 0; a < agents; a++ {
				wg.Add(1)
				go func(a int) {
					defer wg.Done()
					s, err := store.Open(ctx, spec)
					if err != nil {
						errs <- err
						return
					}
					defer s.Close()
					host := fmt.Sprintf("host-%d", a)
					for r := 0; r < rounds; r++ {
						b := store.Batch{
							Hosts: []store.Host{{ID: host, Name: host, Addrs: []string{fmt.Sprintf("198.51.100.%d", a+1)}, LastSeen: t0}},
							// Every agent also reports the shared database:
							// same bucket, different reporting host.
							Observations: []store.Observation{obs(host, "outbound", fmt.Sprintf("198.51.100.%d", a+1), "198.51.100.200", 5432, "app", t0, 1, 10)},
						}
						if err := s.Write(ctx, b); err != nil {
							errs <- err
							return
						}
					}
				}(a)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			s := open(t, spec)
			got, _ := s.Observations(ctx, store.Range{})
			var total uint64
			for _, o := range got {
				total += o.Connections
			}
			if len(got) != agents || total != agents*rounds {
				t.Errorf("%d rows, %d connections; want %d rows, %d connections", len(got), total, agents, agents*rounds)
			}
		})
	}
}

// The same data gives the same graph on both back ends.
func TestGraphIsTheSameOnBothBackends(t *testing.T) {
	ctx := context.Background()
	var results []string
	for _, name := range []string{"sqlite", "postgres"} {
		spec := backends(t)[name]
		s := open(t, spec)
		if err := s.Write(ctx, fleet(t0)); err != nil {
			t.Fatal(err)
		}
		got, err := s.Observations(ctx, store.Range{Since: t0.Add(-time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		hosts, err := s.Hosts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g := graph.Build(got, hosts, nil)
		if len(g.Edges) != 3 {
			t.Errorf("%s: %d edges: %+v", name, len(g.Edges), g.Edges)
		}
		js, _ := json.Marshal(g)
		results = append(results, string(js))
		svcs, err := s.Services(ctx, store.Range{})
		if err != nil || len(svcs) != 1 || svcs[0].Comm != "postgres" {
			t.Errorf("%s services: %+v %v", name, svcs, err)
		}
	}
	if results[0] != results[1] {
		t.Errorf("sqlite and postgres graphs differ:\n%s\n%s", results[0], results[1])
	}
}

func TestUnreachableStoreIsOneLineError(t *testing.T) {
	_, err := store.Open(context.Background(), "postgres://nobody@/deptrace?host=/nonexistent-socket-dir&connect_timeout=2")
	if err == nil {
		t.Fatal("connected to nothing")
	}
	if msg := err.Error(); len(msg) == 0 || msg[:len("connect to store")] != "connect to store" {
		t.Errorf("error: %v", err)
	}
}

// Every field of tracer.Counters is stored and accumulates: sums, except
// the latency maximum; the peer process is kept.
func TestEveryCounterAccumulates(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			a := obs("web", "outbound", "", "/run/app.sock", 0, "nginx", t0, 0, 0)
			a.Proto, a.PeerPID, a.PeerComm = "unix", 77, "gunicorn"
			a.Counters = tracer.Counters{Connections: 1, FailedConnections: 2, FailedRefused: 3, FailedTimeout: 4, FailedReset: 5, FailedUnreachable: 6,
				BytesSent: 7, BytesReceived: 8, DatagramsSent: 9, DatagramsReceived: 10, ConnectLatencyCount: 11, ConnectLatencySumUs: 12,
				ConnectLatencyMaxUs: 500, ResetsSent: 14, ResetsReceived: 15, Retransmits: 16,
				RTTSamples: 2, RTTSumUs: 400, RTTMinUs: 150, RTTMaxUs: 250}
			b := a
			b.ConnectLatencyMaxUs = 300
			b.RTTSamples, b.RTTSumUs, b.RTTMinUs, b.RTTMaxUs = 0, 0, 0, 0 // no sample: the minimum stays
			c := a
			c.ConnectLatencyMaxUs = 900
			c.RTTMinUs, c.RTTMaxUs = 90, 700
			c.Bucket = a.Bucket.Add(time.Minute) // another bucket: summed at query time
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{a}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{b, c}}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Observations(ctx, store.Range{})
			if err != nil || len(got) != 1 {
				t.Fatalf("%v %+v", err, got)
			}
			want := a.Counters
			want.Add(b.Counters)
			want.Add(c.Counters)
			if got[0].Counters != want || want.ConnectLatencyMaxUs != 900 || want.Retransmits != 48 ||
				want.RTTMinUs != 90 || want.RTTMaxUs != 700 || want.RTTSamples != 4 || want.RTTAvgUs() != 200 {
				t.Errorf("counters\n got %+v\nwant %+v", got[0].Counters, want)
			}
			if got[0].PeerPID != 77 || got[0].PeerComm != "gunicorn" || got[0].RemoteAddr != "/run/app.sock" || got[0].Proto != "unix" {
				t.Errorf("peer or address lost: %+v", got[0])
			}
		})
	}
}

// A row write names only the counter columns its rows fill (SQLite: a
// statement per set of columns, prepared once two writes wanted it). Rows written through such statements, into rows
// that exist (an omitted column keeps its value) and as new rows (an
// omitted column is 0), must read as every column written.
func TestRowWritesOfSomeColumnsKeepTheOthers(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			full := obs("web", "outbound", "10.0.0.1", "10.0.0.2", 80, "nginx", t0, 0, 0)
			full.Counters = tracer.Counters{Connections: 1, FailedConnections: 2, FailedRefused: 3, FailedTimeout: 4, FailedReset: 5, FailedUnreachable: 6,
				BytesSent: 7, BytesReceived: 8, DatagramsSent: 9, DatagramsReceived: 10, ConnectLatencyCount: 11, ConnectLatencySumUs: 12,
				ConnectLatencyMaxUs: 500, ResetsSent: 14, ResetsReceived: 15, Retransmits: 16,
				RTTSamples: 2, RTTSumUs: 400, RTTMinUs: 150, RTTMaxUs: 250}
			// Two sets of columns, the second holding the first, so that
			// port 80's merged row fills the second's: two sets per table,
			// within the store's bound, each written more often than once.
			some := []tracer.Counters{
				{Connections: 3, BytesSent: 30, BytesReceived: 60},
				{Connections: 1, BytesSent: 1, BytesReceived: 2, ConnectLatencyCount: 1, ConnectLatencySumUs: 40, ConnectLatencyMaxUs: 40,
					RTTSamples: 1, RTTSumUs: 90, RTTMinUs: 90, RTTMaxUs: 90, FailedConnections: 1, FailedTimeout: 1, Retransmits: 4},
			}
			fresh := 0 // new keys written through the statements of fewer columns
			want := map[uint16]tracer.Counters{80: full.Counters}
			if err := s.Write(ctx, store.Batch{Observations: []store.Observation{full}}); err != nil {
				t.Fatal(err)
			}
			// A set's statements are prepared once writes wanted it twice:
			// the last two rounds write through them.
			for round := 0; round < 4; round++ {
				var batch []store.Observation
				for _, c := range some {
					o := full
					o.Counters = c
					batch = append(batch, o)
					n := o
					fresh++
					n.Port = uint16(1000 + fresh)
					batch = append(batch, n)
					w := want[80]
					w.Add(c)
					want[80], want[n.Port] = w, c
				}
				if err := s.Write(ctx, store.Batch{Observations: batch}); err != nil {
					t.Fatal(err)
				}
				if n := s.RowShapesFellBack(); round == 3 && n > 0 {
					t.Errorf("the last round wrote %d row shapes with the statement of every column", n)
				}
			}
			got, err := s.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d flows, want %d", len(got), len(want))
			}
			for _, o := range got {
				if o.Counters != want[o.Port] {
					t.Errorf("port %d:\n got %+v\nwant %+v", o.Port, o.Counters, want[o.Port])
				}
			}
			if w := want[80]; w.ConnectLatencyMaxUs != 500 || w.RTTMinUs != 90 || w.RTTMaxUs != 250 || w.Retransmits != 32 {
				t.Errorf("the test's own sums are off: %+v", w)
			}
		})
	}
}

// A store written by the first release keeps its history on upgrade.
func TestUpgradeFromSchemaV1(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			db, err := sql.Open(map[string]string{"sqlite": "sqlite", "postgres": "pgx"}[name], spec)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			for _, stmt := range strings.Split(store.MigrationV1, ";") {
				if _, err := db.Exec(stmt); err != nil {
					t.Fatal(err)
				}
			}
			ph := func(q string) string {
				if name == "sqlite" {
					return q
				}
				n := 0
				return regexp.MustCompile(`\?`).ReplaceAllStringFunc(q, func(string) string { n++; return fmt.Sprintf("$%d", n) })
			}
			stmts := []struct {
				q    string
				args []any
			}{
				{`CREATE TABLE schema_version (version INTEGER NOT NULL)`, nil},
				{`INSERT INTO schema_version (version) VALUES (1)`, nil},
				{`INSERT INTO observations VALUES (?, 'web', 'outbound', 'tcp', '198.51.100.2', '198.51.100.3', 5432, 'nginx', 42, 3, 1, 100, 200, ?, ?)`,
					[]any{t0.UnixNano(), t0.UnixNano(), t0.Add(time.Second).UnixNano()}},
				{`INSERT INTO observations VALUES (?, 'web', 'outbound', 'tcp', '198.51.100.2', '198.51.100.3', 5432, 'nginx', 42, 2, 0, 10, 20, ?, ?)`,
					[]any{t0.Add(time.Minute).UnixNano(), t0.Add(time.Minute).UnixNano(), t0.Add(time.Minute + time.Second).UnixNano()}},
			}
			for _, st := range stmts {
				if _, err := db.Exec(ph(st.q), st.args...); err != nil {
					t.Fatal(err)
				}
			}
			s := open(t, spec)
			got, err := s.Observations(ctx, store.Range{})
			if err != nil || len(got) != 1 {
				t.Fatalf("%v %+v", err, got)
			}
			o := got[0]
			if o.Connections != 5 || o.FailedConnections != 1 || o.BytesSent != 110 || o.BytesReceived != 220 || o.PID != 42 ||
				!o.FirstSeen.Equal(t0) || !o.LastSeen.Equal(t0.Add(time.Minute+time.Second)) {
				t.Errorf("after upgrade: %+v", o)
			}
		})
	}
}

// Listener state accumulates per bucket like the counters: deepest queue,
// summed drops, the latest backlog; a range merges buckets the same way.
func TestListenersAccumulate(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			l := func(at time.Time, backlog, queue uint32, drops uint64) store.Listener {
				return store.Listener{Bucket: at.Truncate(time.Minute), HostID: "web", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 80, PID: 7, Comm: "nginx",
					BacklogLimit: backlog, QueueMax: queue, Drops: drops, FirstSeen: at, LastSeen: at}
			}
			batches := []store.Batch{
				{Listeners: []store.Listener{l(t0.Add(10*time.Second), 128, 3, 0)}},
				{Listeners: []store.Listener{l(t0.Add(20*time.Second), 511, 9, 4), l(t0.Add(5*time.Second), 64, 1, 1)}},
				{Listeners: []store.Listener{l(t0.Add(70*time.Second), 511, 2, 10)}},
			}
			for _, b := range batches {
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Listeners(ctx, store.Range{})
			if err != nil || len(got) != 1 {
				t.Fatalf("%v %+v", err, got)
			}
			if g := got[0]; g.BacklogLimit != 511 || g.QueueMax != 9 || g.Drops != 15 || g.Comm != "nginx" ||
				!g.FirstSeen.Equal(t0.Add(5*time.Second)) || !g.LastSeen.Equal(t0.Add(70*time.Second)) {
				t.Errorf("merged listener %+v", g)
			}
			// Only the first minute: the 10:00:05 record's backlog (64) is
			// older than 10:00:20's (511), whatever the write order.
			got, _ = s.Listeners(ctx, store.Range{Since: t0, Until: t0.Add(time.Minute)})
			if len(got) != 1 || got[0].BacklogLimit != 511 || got[0].QueueMax != 9 || got[0].Drops != 5 {
				t.Errorf("first minute %+v", got)
			}
		})
	}
}

// A batch with an id is applied once: writing it again (a spool replayed
// after a crash) changes nothing; another id with the same content counts.
func TestBatchIDsMakeWritesIdempotent(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			b := fleet(t0)
			b.ID = "agent-a-1"
			b.Listeners = []store.Listener{{Bucket: t0, HostID: "db", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 5432, Comm: "postgres", Drops: 3, FirstSeen: t0, LastSeen: t0}}
			total := func() (conns, drops uint64) {
				obs, err := s.Observations(ctx, store.Range{})
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range obs {
					conns += o.Connections
				}
				ls, err := s.Listeners(ctx, store.Range{})
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range ls {
					drops += l.Drops
				}
				return conns, drops
			}
			for i := 0; i < 3; i++ {
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			if c, d := total(); c != 14 || d != 3 {
				t.Errorf("one batch written three times: %d connections, %d drops; want 14 and 3", c, d)
			}
			// A second store handle (another process) sees the same ids.
			if err := open(t, spec).Write(ctx, b); err != nil {
				t.Fatal(err)
			}
			b.ID = "agent-a-2"
			if err := s.Write(ctx, b); err != nil {
				t.Fatal(err)
			}
			if c, d := total(); c != 28 || d != 6 {
				t.Errorf("two batches: %d connections, %d drops; want 28 and 6", c, d)
			}
		})
	}
}
