package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// seedNames writes nginx on web reaching api.example.com (203.0.113.7)
// with RTT measured, and two clients' DNS lookups: nginx's clean, curl's
// mostly failing.
func seedNames(t *testing.T, path string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "deptrace.db")
	}
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Now().Add(-5 * time.Minute)
	dns := func(comm, resolver string, c tracer.DNSCounters) store.DNSObservation {
		return store.DNSObservation{Bucket: at.Truncate(store.DefaultBucket), HostID: "web", Comm: comm, Proto: "udp", Resolver: resolver,
			DNSCounters: c, FirstSeen: at, LastSeen: at}
	}
	b := store.Batch{
		Hosts: []store.Host{{ID: "web", Name: "web", Addrs: []string{"198.51.100.2"}, LastSeen: at}},
		Observations: []store.Observation{{Bucket: at.Truncate(store.DefaultBucket), HostID: "web", Direction: "outbound", Proto: "tcp",
			LocalAddr: "198.51.100.2", RemoteAddr: "203.0.113.7", Port: 443, Comm: "nginx", RemoteName: "api.example.com",
			Counters:  tracer.Counters{Connections: 4, BytesSent: 10, BytesReceived: 20, RTTSamples: 4, RTTSumUs: 6000, RTTMinUs: 1000, RTTMaxUs: 2600},
			FirstSeen: at, LastSeen: at}},
		DNS: []store.DNSObservation{
			dns("nginx", "127.0.0.53:53", tracer.DNSCounters{Queries: 8, Answers: 8, NoError: 8, LatencyCount: 8, LatencySumUs: 800, LatencyMaxUs: 300}),
			dns("curl", "127.0.0.53:53", tracer.DNSCounters{Queries: 10, Answers: 6, NoError: 4, ServFail: 2, Timeouts: 4, LatencyCount: 6, LatencySumUs: 6000, LatencyMaxUs: 4000}),
		},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path
}

// look, graph and diff show external servers by name with their address,
// the RTT on edges and each client's DNS, failing lookups flagged; look
// finds a server by its name.
func TestNamesRTTAndDNSOnAStore(t *testing.T) {
	for name, spec := range map[string]string{"sqlite": "", "postgres": pgtest.Start(t)} {
		t.Run(name, func(t *testing.T) {
			db := seedNames(t, spec)
			out, errOut, code := run(t, nil, "look", "nginx", "--store", db)
			if code != 0 {
				t.Fatal(errOut)
			}
			for _, want := range []string{
				"  DNS lookups (per resolver):\n    127.0.0.53:53/udp queries=8 answers=8 nxdomain=0 servfail=0 other=0 timeouts=0 latency=100µs/300µs\n",
				"-> tcp api.example.com:443 (external 203.0.113.7)  conns=4 failed=0 sent=10 recv=20 rtt=1.5ms/2.6ms ",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("look nginx lacks %q:\n%s", want, out)
				}
			}
			out, _, code = run(t, nil, "look", "api.example.com", "--store", db)
			if code != 0 || !strings.HasPrefix(out, "tcp api.example.com:443 (external 203.0.113.7)\n") || !strings.Contains(out, "<- nginx on web") {
				t.Errorf("look api.example.com:\n%s", out)
			}
			out, _, _ = run(t, nil, "look", "curl", "--store", db)
			if !strings.Contains(out, "127.0.0.53:53/udp queries=10 answers=6 nxdomain=0 servfail=2 other=0 timeouts=4 latency=1ms/4ms  UNHEALTHY: 6 of 10 lookups failed (60.0 %): 2 SERVFAIL, 4 timed out") {
				t.Errorf("look curl:\n%s", out)
			}
			out, _, _ = run(t, nil, "graph", "--format", "json", "--store", db)
			for _, want := range []string{`"remote_name": "api.example.com"`, `"rtt_avg_us": 1500`, `"resolver": "127.0.0.53:53"`, `"DNS via 127.0.0.53:53/udp: 6 of 10 lookups failed`} {
				if !strings.Contains(out, want) {
					t.Errorf("graph json lacks %q:\n%s", want, out)
				}
			}
			out, _, _ = run(t, nil, "graph", "--format", "dot", "--store", db)
			if !strings.Contains(out, `tcp api.example.com:443 (external 203.0.113.7)`) || !strings.Contains(out, `curl on web (198.51.100.2)\nDNS: 6 of 10 lookups failed" shape=box color=red`) {
				t.Errorf("dot:\n%s", out)
			}
		})
	}
}
