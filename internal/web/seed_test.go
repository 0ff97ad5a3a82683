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
	idDNS      = "external:192.0.2.53:53/udp"
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

// seedChain writes a small real chain, 10 minutes ago, for the map in
// docs/web.md: curl on client-1 -> nginx on web-1:80 -> gunicorn on
// app-1:8080 -> postgres on db-1:5432 (3 resets in 400 connections:
// degraded) and -> redis-server on cache-1:6379 (4 failed connects of
// 30: unhealthy); nginx and gunicorn look names up through 192.0.2.53:53
// (external), and curl's lookups time out (DNS: unhealthy).
func seedChain(t testing.TB) (path string, now time.Time) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "chain.db")
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now = time.Now()
	at := now.Add(-10 * time.Minute)
	addr := map[string]string{"client-1": "198.51.100.10", "web-1": "198.51.100.1", "app-1": "198.51.100.5", "db-1": "198.51.100.2", "cache-1": "198.51.100.3"}
	b := store.Batch{}
	for _, h := range []string{"client-1", "web-1", "app-1", "db-1", "cache-1"} {
		b.Hosts = append(b.Hosts, store.Host{ID: h, Name: h, Addrs: []string{addr[h]}, LastSeen: now})
	}
	obs := func(host, dir, proto, remote string, port uint16, comm string, c tracer.Counters) {
		b.Observations = append(b.Observations, store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: proto,
			LocalAddr: addr[host], RemoteAddr: remote, Port: port, Comm: comm, Counters: c, FirstSeen: at, LastSeen: at.Add(time.Second)})
	}
	// call is one TCP dependency seen from both ends.
	call := func(client, ccomm, server, scomm string, port uint16, c tracer.Counters) {
		c.BytesSent, c.BytesReceived = 200*c.Connections, 2000*c.Connections
		obs(client, "outbound", "tcp", addr[server], port, ccomm, c)
		in := c
		in.FailedConnections, in.FailedTimeout, in.FailedRefused = 0, 0, 0
		obs(server, "inbound", "tcp", addr[client], port, scomm, in)
	}
	call("client-1", "curl", "web-1", "nginx", 80, tracer.Counters{Connections: 20})
	call("web-1", "nginx", "app-1", "gunicorn", 8080, tracer.Counters{Connections: 60})
	call("app-1", "gunicorn", "db-1", "postgres", 5432, tracer.Counters{Connections: 400, ResetsReceived: 3})
	call("app-1", "gunicorn", "cache-1", "redis-server", 6379, tracer.Counters{Connections: 26, FailedConnections: 4, FailedTimeout: 4})
	obs("web-1", "outbound", "udp", "192.0.2.53", 53, "nginx", tracer.Counters{DatagramsSent: 10, DatagramsReceived: 10})
	obs("app-1", "outbound", "udp", "192.0.2.53", 53, "gunicorn", tracer.Counters{DatagramsSent: 30, DatagramsReceived: 30})
	b.DNS = []store.DNSObservation{{Bucket: at.Truncate(store.DefaultBucket), HostID: "client-1", Comm: "curl", Proto: "udp", Resolver: "192.0.2.53:53",
		DNSCounters: tracer.DNSCounters{Queries: 12, Answers: 8, NoError: 8, Timeouts: 4, LatencyCount: 8, LatencySumUs: 8000, LatencyMaxUs: 3000},
		FirstSeen:   at, LastSeen: at.Add(time.Second)}}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path, now
}
