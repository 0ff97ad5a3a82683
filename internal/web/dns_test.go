package web

import (
	"context"
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// seedNames is a store where web-1's nginx reaches api.example.com
// (203.0.113.7:443, RTT measured) and two clients resolve names: nginx
// through the local stub, cleanly; curl through 10.96.0.10, with
// SERVFAIL and timeouts on most of its lookups.
func seedNames(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "deptrace.db")
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Now().Add(-10 * time.Minute)
	ext := store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: "web-1", Direction: "outbound", Proto: "tcp",
		LocalAddr: "198.51.100.1", RemoteAddr: "203.0.113.7", Port: 443, Comm: "nginx", RemoteName: "api.example.com",
		Counters:  tracer.Counters{Connections: 4, BytesSent: 400, BytesReceived: 4000, RTTSamples: 4, RTTSumUs: 8000, RTTMinUs: 1500, RTTMaxUs: 2600},
		FirstSeen: at, LastSeen: at.Add(time.Second)}
	dns := func(comm, resolver string, c tracer.DNSCounters) store.DNSObservation {
		return store.DNSObservation{Bucket: at.Truncate(store.DefaultBucket), HostID: "web-1", Comm: comm, PID: 9, Proto: "udp", Resolver: resolver,
			DNSCounters: c, FirstSeen: at, LastSeen: at.Add(time.Second)}
	}
	b := store.Batch{
		Hosts:        []store.Host{{ID: "web-1", Name: "web-1", Addrs: []string{"198.51.100.1"}, LastSeen: at}},
		Observations: []store.Observation{ext},
		DNS: []store.DNSObservation{
			dns("nginx", "127.0.0.53:53", tracer.DNSCounters{Queries: 8, Answers: 8, NoError: 6, NXDomain: 2, LatencyCount: 8, LatencySumUs: 800, LatencyMaxUs: 300}),
			dns("curl", "10.96.0.10:53", tracer.DNSCounters{Queries: 10, Answers: 6, NoError: 4, ServFail: 2, Timeouts: 4, LatencyCount: 6, LatencySumUs: 6000, LatencyMaxUs: 4000}),
		},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path
}

// The graph names the external server by its DNS name and keeps its
// address; its edge carries the RTT; look finds it by name; a client's
// DNS stats are on its node, and failing lookups make it unhealthy.
func TestNamesRTTAndDNSInGraphAndLook(t *testing.T) {
	srv, _ := serve(t, seedNames(t), Options{})
	g := getGraph(t, srv.URL, "/api/graph?since=1h")
	nodes := map[string]graph.Node{}
	for _, n := range g.Nodes {
		nodes[n.ID] = n
	}
	ext := nodes["external:203.0.113.7:443"]
	if ext.RemoteName != "api.example.com" || ext.Name != "api.example.com" || ext.Addr != "203.0.113.7" {
		t.Errorf("external node: %+v", ext)
	}
	if len(g.Edges) != 1 || g.Edges[0].RTTAvgUs != 2000 || g.Edges[0].RTTMaxUs != 2600 || g.Edges[0].RTTMinUs != 1500 {
		t.Errorf("edges: %+v", g.Edges)
	}
	curl := nodes["workload:web-1/curl"]
	if curl.Health != graph.HealthUnhealthy || !curl.Unhealthy || len(curl.DNS) != 1 || curl.DNS[0].FailedLookups != 6 ||
		len(curl.Reasons) != 1 || !strings.HasPrefix(curl.Reasons[0], "DNS via 10.96.0.10:53/udp: 6 of 10 lookups failed (60.0 %): 2 SERVFAIL, 4 timed out") {
		t.Errorf("curl: %+v", curl)
	}
	if nginx := nodes["workload:web-1/nginx"]; nginx.Health != graph.HealthOK || len(nginx.DNS) != 1 || nginx.DNS[0].LatencyAvgUs != 100 {
		t.Errorf("nginx: %+v", nginx)
	}
	for _, target := range []string{"api.example.com", "API.example.com.", "api.example.com:443"} {
		var ans lookAnswer
		code, body, _ := get(t, srv.URL, "/api/look?"+url.Values{"target": {target}}.Encode())
		if code != 200 || json.Unmarshal(body, &ans) != nil || len(ans.Trees) != 1 || ans.Trees[0].Root.RemoteName != "api.example.com" ||
			len(ans.Trees[0].Inbound) != 1 || ans.Trees[0].Inbound[0].Edge.RTTAvgUs != 2000 {
			t.Errorf("look %s: %d %s", target, code, body)
		}
	}
	if code, body, _ := get(t, srv.URL, "/api/look?target=api.example.com:80"); code != 404 {
		t.Errorf("look at another port of the name: %d %s", code, body)
	}
}

func getDNS(t *testing.T, srv, q string) dnsAnswer {
	t.Helper()
	var ans dnsAnswer
	code, body, _ := get(t, srv, "/api/dns"+q)
	if code != 200 || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("GET /api/dns%s: %d %s", q, code, body)
	}
	return ans
}

// /api/dns lists the clients worst first, filters by host, process,
// resolver and health, and bounds the answer.
func TestDNSEndpoint(t *testing.T) {
	srv, _ := serve(t, seedNames(t), Options{})
	all := getDNS(t, srv.URL, "?since=1h")
	if all.Total != 2 || len(all.Clients) != 2 || all.Clients[0].Process != "curl" || all.Clients[0].Health != graph.HealthUnhealthy ||
		all.Clients[0].Queries != 10 || all.Clients[0].FailedLookups != 6 || all.Clients[1].Name != "nginx" || all.Clients[1].Health != graph.HealthOK ||
		len(all.Clients[0].Resolvers) != 1 || all.Clients[0].Resolvers[0].LatencyAvgUs != 1000 || all.Clients[0].Resolvers[0].Timeouts != 4 {
		t.Errorf("all: %+v", all)
	}
	if a := getDNS(t, srv.URL, "?failing=true"); a.Total != 1 || a.Clients[0].Process != "curl" {
		t.Errorf("failing: %+v", a)
	}
	if a := getDNS(t, srv.URL, "?resolver=127.0.0.53:53"); a.Total != 1 || a.Clients[0].Process != "nginx" {
		t.Errorf("resolver: %+v", a)
	}
	if a := getDNS(t, srv.URL, "?host=web-1&process=nginx"); a.Total != 1 || a.Clients[0].Process != "nginx" {
		t.Errorf("host and process: %+v", a)
	}
	if a := getDNS(t, srv.URL, "?limit=1"); a.Total != 2 || len(a.Clients) != 1 || a.Clients[0].Process != "curl" {
		t.Errorf("limit: %+v", a)
	}
	if a := getDNS(t, srv.URL, "?until=2h"); a.Total != 0 || a.Clients == nil {
		t.Errorf("before anything: %+v", a)
	}
	// Garbage in every parameter: a JSON answer, never a 5xx.
	for _, p := range append(dnsParams, "bogus") {
		for _, v := range []string{"", "\x00", "%", "-1", "1e999", "9999999999999999999999", "😀", "' OR 1=1 --", strings.Repeat("a", 10000), "[::1]:99999", "::"} {
			code, body, _ := get(t, srv.URL, "/api/dns?"+url.Values{p: {v}}.Encode())
			if code >= 500 || !json.Valid(body) {
				t.Errorf("/api/dns %s=%.40q: %d %.200s", p, v, code, body)
			}
		}
	}
}

// Options.DNSHealth (serve's --health-dns-* flags) judges the clients'
// lookups everywhere the API shows them: curl's 6 failed of 10 are
// unhealthy by default, degraded at a ratio of 0.7 (60 % is over half of
// it), ok with a degraded factor of 0.9 too.
func TestDNSHealthOptions(t *testing.T) {
	path := seedNames(t)
	for _, c := range []struct {
		h    graph.DNSHealth
		want string
	}{
		{graph.DNSHealth{}, graph.HealthUnhealthy},
		{graph.DNSHealth{MinEvents: 3, ErrorRatio: 0.7, DegradedFactor: 0.5}, graph.HealthDegraded},
		{graph.DNSHealth{MinEvents: 3, ErrorRatio: 0.7, DegradedFactor: 0.9}, graph.HealthOK},
		{graph.DNSHealth{MinEvents: 7, ErrorRatio: 0.05, DegradedFactor: 0.5}, graph.HealthDegraded}, // over the ratio on fewer errors than the minimum
	} {
		srv, _ := serve(t, path, Options{DNSHealth: c.h})
		dns := getDNS(t, srv.URL, "?process=curl")
		g := getGraph(t, srv.URL, "/api/graph?since=1h")
		var look lookAnswer
		code, body, _ := get(t, srv.URL, "/api/look?target=curl")
		if code != 200 || json.Unmarshal(body, &look) != nil || len(look.Trees) != 1 {
			t.Fatalf("look curl: %d %s", code, body)
		}
		var node graph.Node
		for _, n := range g.Nodes {
			if n.ID == "workload:web-1/curl" {
				node = n
			}
		}
		root := look.Trees[0].Root
		if len(dns.Clients) != 1 || dns.Clients[0].Health != c.want || dns.Clients[0].Resolvers[0].Health != c.want ||
			node.Health != c.want || node.Unhealthy != (c.want == graph.HealthUnhealthy) || root.Health != c.want || root.DNS[0].Health != c.want {
			t.Errorf("%+v: /api/dns %+v, /api/graph node %+v, /api/look root %+v; want %s", c.h, dns.Clients, node, root, c.want)
		}
	}
}
