package web

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// The seeded store, relative to now:
//
//	90 min ago: nginx on web-1 -> postgres on db-1:5432 (tcp)
//	            python3 on worker-1 -> postgres on db-1:5432 (gone since;
//	            2 resets in 3 connections: degraded, too few to be unhealthy)
//	10 min ago: nginx on web-1 -> postgres on db-1:5432 again (one
//	            retransmitted segment: healthy)
//	            nginx on web-1 -> redis-server on cache-1:6379 (new; 3 failed
//	            connects of 8 attempts: unhealthy)
//	            nginx on web-1 -> 192.0.2.53:53 udp (external: no agent there)
//
// So the last hour has 4 nodes and 3 edges, against the hour before it
// 2 edges appeared and 1 disappeared; all history has 5 nodes and 4 edges.
const (
	idNginx    = "workload:web-1/nginx"
	idPython   = "workload:worker-1/python3"
	idPostgres = "workload:db-1/postgres"
	idRedis    = "workload:cache-1/redis-server"
	idDNS      = "external:192.0.2.53:53"
)

func seed(t testing.TB) (path string, now time.Time) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "deptrace.db")
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now = time.Now()
	old, recent := now.Add(-90*time.Minute), now.Add(-10*time.Minute)
	o := func(host, dir, proto, local, remote string, port uint16, comm string, at time.Time, conns, failed uint64) store.Observation {
		return store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: proto,
			LocalAddr: local, RemoteAddr: remote, Port: port, Comm: comm,
			Counters: tracer.Counters{Connections: conns, FailedConnections: failed, BytesSent: 100 * conns, BytesReceived: 1000 * conns}, FirstSeen: at, LastSeen: at.Add(time.Second)}
	}
	retransmitted := func(x store.Observation, n uint64) store.Observation { x.Retransmits = n; return x }
	reset := func(x store.Observation, n uint64) store.Observation { x.ResetsReceived = n; return x }
	b := store.Batch{
		Hosts: []store.Host{
			{ID: "web-1", Name: "web-1", Addrs: []string{"198.51.100.1"}, LastSeen: now},
			{ID: "db-1", Name: "db-1", Addrs: []string{"198.51.100.2"}, LastSeen: now},
			{ID: "cache-1", Name: "cache-1", Addrs: []string{"198.51.100.3"}, LastSeen: now},
			{ID: "worker-1", Name: "worker-1", Addrs: []string{"198.51.100.4"}, LastSeen: now},
		},
		Observations: []store.Observation{
			o("web-1", "outbound", "tcp", "198.51.100.1", "198.51.100.2", 5432, "nginx", old, 7, 0),
			o("db-1", "inbound", "tcp", "198.51.100.2", "198.51.100.1", 5432, "postgres", old, 7, 0),
			reset(o("worker-1", "outbound", "tcp", "198.51.100.4", "198.51.100.2", 5432, "python3", old, 3, 0), 2),
			o("db-1", "inbound", "tcp", "198.51.100.2", "198.51.100.4", 5432, "postgres", old, 3, 0),
			retransmitted(o("web-1", "outbound", "tcp", "198.51.100.1", "198.51.100.2", 5432, "nginx", recent, 10, 0), 1),
			o("db-1", "inbound", "tcp", "198.51.100.2", "198.51.100.1", 5432, "postgres", recent, 10, 0),
			o("web-1", "outbound", "tcp", "198.51.100.1", "198.51.100.3", 6379, "nginx", recent, 5, 3),
			o("cache-1", "inbound", "tcp", "198.51.100.3", "198.51.100.1", 6379, "redis-server", recent, 5, 0),
			o("web-1", "outbound", "udp", "198.51.100.1", "192.0.2.53", 53, "nginx", recent, 0, 0),
		},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path, now
}

// serve starts deptrace serve's handler on a real loopback listener over
// the store at path, with the store's cache of past hours and days on, as
// deptrace serve has it.
func serve(t testing.TB, path string, opt Options) (*httptest.Server, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	st.EnableCache(store.CacheConfig{Now: opt.Now})
	srv := httptest.NewServer(New(st, opt))
	t.Cleanup(func() { srv.Close(); st.Close() })
	return srv, st
}
