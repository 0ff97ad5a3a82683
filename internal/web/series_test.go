package web

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// /api/series?node=: a node's traffic in and out per step, summing to the
// totals of its edges over the range.
func TestNodeSeries(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ask := func(q string) nodeSeriesAnswer {
		t.Helper()
		code, body, _ := get(t, srv.URL, "/api/series?"+q)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", q, code, body)
		}
		var ans nodeSeriesAnswer
		if err := json.Unmarshal(body, &ans); err != nil {
			t.Fatal(err)
		}
		return ans
	}
	// nginx over the last 2 hours: out to postgres (7 + 10), redis (5,
	// 3 failed) and DNS; nothing in.
	ans := ask("since=2h&points=24&node=" + url.QueryEscape(idNginx))
	step := time.Duration(ans.StepS) * time.Second
	if step != 5*time.Minute || len(ans.Points) < 24 || len(ans.Points) > 25 || ans.Node != idNginx {
		t.Fatalf("step %s, %d points: want 24 (or 25) of 5 minutes", step, len(ans.Points))
	}
	var in, out nodeTraffic
	steps := 0
	for i, p := range ans.Points {
		if !p.T.Equal(ans.Since.Add(time.Duration(i) * step)) {
			t.Errorf("point %d at %s", i, p.T)
		}
		in.Counters.Add(p.In.Counters)
		out.Counters.Add(p.Out.Counters)
		out.Edges += p.Out.Edges
		out.Unhealthy += p.Out.Unhealthy
		if p.Out.Edges > 0 {
			steps++
		}
	}
	if in.Connections != 0 || out.Connections != 22 || out.FailedConnections != 3 || out.BytesSent != 2200 || out.Edges != 4 || out.Unhealthy != 1 || steps != 2 {
		t.Errorf("nginx: in %+v, out %+v in %d steps; want 22 connections out, 3 failed, 2,200 bytes sent, 4 edge-steps (1 unhealthy) in 2 steps", in, out, steps)
	}
	// postgres, all history in 4 points: 20 connections in from two
	// clients, nothing out; nginx's one retransmit stays ok, python3's 2
	// resets in 3 connections are degraded.
	ans = ask("points=4&since=3h&node=" + url.QueryEscape(idPostgres))
	var pin nodeTraffic
	for _, p := range ans.Points {
		pin.Counters.Add(p.In.Counters)
		pin.Edges += p.In.Edges
		pin.Unhealthy += p.In.Unhealthy
		pin.Degraded += p.In.Degraded
		if p.Out.Edges != 0 {
			t.Errorf("postgres sends: %+v", p.Out)
		}
	}
	if pin.Connections != 20 || pin.Retransmits != 1 || pin.ResetsReceived != 2 || pin.Edges != 3 || pin.Unhealthy != 0 || pin.Degraded != 1 {
		t.Errorf("postgres in: %+v, want 20 connections, 1 retransmit, 2 resets, 3 edge-steps, 1 degraded", pin)
	}
	// group_by as on /api/graph: the host node of db-1.
	ans = ask("since=2h&group_by=host&node=" + url.QueryEscape("host:db-1"))
	var hin uint64
	for _, p := range ans.Points {
		hin += p.In.Connections
	}
	if hin != 20 {
		t.Errorf("host:db-1 in: %d connections, want 20", hin)
	}
}

// Garbage in: a clear 400 naming the parameter, never a 500 or an
// unbounded answer.
func TestSeriesRejectsGarbage(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	long := strings.Repeat("x", 2000)
	for q, want := range map[string]string{
		"node=": "missing node",
		"node=" + url.QueryEscape(idNginx) + "&from=a": "node given with from, to, proto or port",
		"node=" + url.QueryEscape(idNginx) + "&port=1": "node given with from, to, proto or port",
		"node=workload:" + long:                        "invalid node: 2009 bytes, allowed a node id of at most 1024",
		"node=workload:a%00b":                          "without control characters",
		"node=workload:%ff":                            "without control characters",
		"node=workload:a&points=121":                   "invalid points \"121\": allowed 1 to 120",
		"node=workload:a&points=-1":                    "invalid points \"-1\": allowed 1 to 120",
		"node=workload:a&points=1e3":                   "invalid points \"1e3\": allowed 1 to 120",
		"node=workload:a&since=yesterday":              "invalid since \"yesterday\"",
		"node=workload:a&since=1h&until=2h":            "invalid range",
		"node=workload:a&group_by=pod":                 "invalid group_by \"pod\"",
		"node=workload:a&node=workload:b":              "parameter node given 2 times: give it once",
		"node=workload:a&edge=1":                       "unknown parameter \"edge\"",
		"from=" + long + "&to=b:c&proto=tcp&port=1":    "invalid from: 2000 bytes",
		"from=a:b&to=c:d&proto=sctp&port=1":            "invalid proto \"sctp\": allowed tcp, udp, unix",
		"from=a:b&to=c:d&proto=tcp&port=65536":         "invalid port \"65536\": allowed 0 to 65535",
		"from=a:b&to=c:d&proto=tcp&port=http":          "invalid port \"http\"",
		"":                                             "missing from or to",
	} {
		code, body, _ := get(t, srv.URL, "/api/series?"+q)
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e)
		if code != http.StatusBadRequest || !strings.Contains(e.Error, want) || strings.Contains(e.Error, "\n") {
			t.Errorf("%.80s: %d %q, want 400 with %q", q, code, body, want)
		}
	}
	// At most 120 points, however long the range, even longer than a
	// time.Duration holds (292 years).
	for since, what := range map[string]string{"2000-01-01T00:00:00Z": "26 years", "1700-01-01T00:00:00Z": "over 300 years"} {
		code, body, _ := get(t, srv.URL, "/api/series?since="+since+"&points=120&node="+url.QueryEscape(idNginx))
		var ans nodeSeriesAnswer
		if err := json.Unmarshal(body, &ans); code != http.StatusOK || err != nil || len(ans.Points) > 121 || len(ans.Points) < 120 {
			t.Errorf("%s in 120 points: %d, %d points, %v", what, code, len(ans.Points), err)
		}
	}
}

// seedDNSHistory adds nginx's lookups on web-1 to seed's store in two
// minutes: 5 clean ones 40 minutes ago, and 10 failing ones 10 minutes
// ago (1 NXDOMAIN, 2 SERVFAIL, 3 timeouts); and dig's, in container
// toolbox on web-1, 4 NXDOMAIN 10 minutes ago.
func seedDNSHistory(t *testing.T) (string, time.Time) {
	t.Helper()
	path, now := seed(t)
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := func(at time.Time, c tracer.DNSCounters) store.DNSObservation {
		return store.DNSObservation{Bucket: at.Truncate(time.Minute), HostID: "web-1", Comm: "nginx", PID: 9, Proto: "udp", Resolver: "192.0.2.53:53",
			DNSCounters: c, FirstSeen: at, LastSeen: at}
	}
	// dig in container toolbox, which connects nowhere: its workload node
	// exists for its lookups alone.
	dig := d(now.Add(-10*time.Minute), tracer.DNSCounters{Queries: 4, Answers: 4, NXDomain: 4})
	dig.Comm, dig.Identity = "dig", tracer.Identity{ContainerID: "7001b0c5deadbeef", ContainerName: "toolbox"}
	err = s.Write(context.Background(), store.Batch{DNS: []store.DNSObservation{
		d(now.Add(-40*time.Minute), tracer.DNSCounters{Queries: 5, Answers: 5, NoError: 5, LatencyCount: 5, LatencySumUs: 500, LatencyMaxUs: 200}),
		d(now.Add(-10*time.Minute), tracer.DNSCounters{Queries: 10, Answers: 7, NoError: 4, NXDomain: 1, ServFail: 2, Timeouts: 3,
			LatencyCount: 7, LatencySumUs: 14000, LatencyMaxUs: 9000}),
		dig,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return path, now
}

// /api/series?node= carries the node's DNS lookups per step, from the
// store's per-minute DNS rows: each in the step of its minute, judged by
// the server's DNS thresholds; no dns in a step without lookups, nor on
// an edge's series.
func TestNodeSeriesDNS(t *testing.T) {
	path, now := seedDNSHistory(t)
	for _, c := range []struct {
		opt    Options
		recent string
	}{
		{Options{}, graph.HealthUnhealthy},
		{Options{DNSHealth: graph.DNSHealth{MinEvents: 3, ErrorRatio: 0.9, DegradedFactor: 0.5}}, graph.HealthDegraded}, // 5 of 10 is over half of 90 %
	} {
		srv, _ := serve(t, path, c.opt)
		since := now.Add(-time.Hour).Truncate(time.Minute).UTC().Format(time.RFC3339)
		code, body, _ := get(t, srv.URL, "/api/series?points=6&since="+since+"&node="+url.QueryEscape(idNginx))
		var ans nodeSeriesAnswer
		if code != http.StatusOK || json.Unmarshal(body, &ans) != nil {
			t.Fatalf("%d %s", code, body)
		}
		var got []string
		for _, p := range ans.Points {
			if p.DNS == nil {
				continue
			}
			// The step holding the minute of each row the store has.
			ago := "none"
			for _, m := range []time.Duration{40 * time.Minute, 10 * time.Minute} {
				if at := now.Add(-m).Truncate(time.Minute); !at.Before(p.T) && at.Before(p.T.Add(time.Duration(ans.StepS)*time.Second)) {
					ago = m.String()
				}
			}
			got = append(got, fmt.Sprintf("%s: %d queries, %d answers, %d noerror, %d nxdomain, %d servfail, %d timeouts, %d failed, latency %d/%d us, %d resolvers, %s",
				ago, p.DNS.Queries, p.DNS.Answers, p.DNS.NoError, p.DNS.NXDomain, p.DNS.ServFail, p.DNS.Timeouts, p.DNS.FailedLookups,
				p.DNS.LatencyAvgUs, p.DNS.LatencyMaxUs, p.DNS.Resolvers, p.DNS.Health))
		}
		want := []string{
			"40m0s: 5 queries, 5 answers, 5 noerror, 0 nxdomain, 0 servfail, 0 timeouts, 0 failed, latency 100/200 us, 1 resolvers, ok",
			"10m0s: 10 queries, 7 answers, 4 noerror, 1 nxdomain, 2 servfail, 3 timeouts, 6 failed, latency 2000/9000 us, 1 resolvers, " + c.recent,
		}
		if len(ans.Points) != 6 || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%+v: %d points, DNS per step:\n%s\nwant\n%s", c.opt.DNSHealth, len(ans.Points), strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// The host's node sums its workloads' lookups.
		code, body, _ = get(t, srv.URL, "/api/series?since=1h&group_by=host&node=host:web-1")
		var host nodeSeriesAnswer
		var q uint64
		if code != http.StatusOK || json.Unmarshal(body, &host) != nil {
			t.Fatalf("%d %s", code, body)
		}
		for _, p := range host.Points {
			if p.DNS != nil {
				q += p.DNS.Queries
			}
		}
		if q != 19 {
			t.Errorf("host:web-1: %d queries, want 19 (nginx's 15, dig's 4)", q)
		}
		// A workload known by its lookups alone, by its container.
		code, body, _ = get(t, srv.URL, "/api/series?since=1h&node="+url.QueryEscape("workload:web-1/container:7001b0c5deadbeef"))
		var box nodeSeriesAnswer
		var nx uint64
		var bad int
		if code != http.StatusOK || json.Unmarshal(body, &box) != nil {
			t.Fatalf("%d %s", code, body)
		}
		for _, p := range box.Points {
			if p.DNS != nil {
				nx += p.DNS.NXDomain
				if p.DNS.Health == graph.HealthUnhealthy {
					bad++
				}
			}
		}
		if nx != 4 || bad != 1 {
			t.Errorf("toolbox: %d NXDOMAIN in %d unhealthy steps, want 4 in 1", nx, bad)
		}
		// No lookups, no dns: postgres, and an edge's series.
		for _, q := range []string{"since=1h&node=" + url.QueryEscape(idPostgres),
			"since=1h&" + url.Values{"from": {idNginx}, "to": {idRedis}, "proto": {"tcp"}, "port": {"6379"}}.Encode()} {
			code, body, _ := get(t, srv.URL, "/api/series?"+q)
			if code != http.StatusOK || strings.Contains(string(body), `"dns"`) || strings.Contains(string(body), `"queries"`) {
				t.Errorf("%s: %d, with DNS: %.300s", q, code, body)
			}
		}
	}
}

// The two ends of a dependency are drained apart and can land in
// different minutes: an edge's and a node's history still sum to the
// edge's totals, with the ends named in every step as the range's graph
// names them (the step with only the client's record must not lose the
// server's process; the one with only the server's record must not turn
// the client into an unknown process).
func TestSeriesEndsInDifferentMinutes(t *testing.T) {
	now := time.Now()
	a := now.Add(-10 * time.Minute).Truncate(time.Minute)
	b := a.Add(time.Minute)
	o := func(host, dir, local, remote, comm string, at time.Time, conns uint64) store.Observation {
		return store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp",
			LocalAddr: local, RemoteAddr: remote, Port: 6379, Comm: comm,
			Counters: tracer.Counters{Connections: conns}, FirstSeen: at.Add(50 * time.Second), LastSeen: at.Add(59 * time.Second)}
	}
	srv := serveBatch(t, store.Batch{
		Hosts: []store.Host{
			{ID: "app-1", Name: "app-1", Addrs: []string{"198.51.100.5"}, LastSeen: now},
			{ID: "cache-1", Name: "cache-1", Addrs: []string{"198.51.100.3"}, LastSeen: now},
		},
		Observations: []store.Observation{
			// Minute a: the client's record of 19 connections, the
			// server's of 18 (its last one drained a minute later).
			o("app-1", "outbound", "198.51.100.5", "198.51.100.3", "gunicorn", a, 19),
			o("cache-1", "inbound", "198.51.100.3", "198.51.100.5", "redis-server", a, 18),
			// Minute b: one more connection on the client, and the server's
			// records of two (the one of minute a and this one).
			o("app-1", "outbound", "198.51.100.5", "198.51.100.3", "gunicorn", b.Add(time.Minute), 1),
			o("cache-1", "inbound", "198.51.100.3", "198.51.100.5", "redis-server", b, 2),
		},
	})
	const from, to = "workload:app-1/gunicorn", "workload:cache-1/redis-server"
	// One point per minute, from the minute before a.
	since := a.Add(-time.Minute).UTC().Format(time.RFC3339)
	until := a.Add(4 * time.Minute).UTC().Format(time.RFC3339)
	ans := askJSON[seriesAnswer](t, srv, "/api/series?points=5&since="+since+"&until="+until+"&proto=tcp&port=6379&from="+url.QueryEscape(from)+"&to="+url.QueryEscape(to))
	var got []string
	for _, p := range ans.Points {
		if p.Connections > 0 {
			got = append(got, fmt.Sprintf("%s: %d", p.T.Sub(a), p.Connections))
		}
	}
	// The client's view is the edge's: 19 in minute a, none in b (only
	// the server's record), 1 in the minute after.
	if want := []string{"0s: 19", "2m0s: 1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("history of %s -> %s: %q, want %q", from, to, got, want)
	}
	node := askJSON[nodeSeriesAnswer](t, srv, "/api/series?points=5&since="+since+"&until="+until+"&node="+url.QueryEscape(to))
	got = nil
	for _, p := range node.Points {
		if p.In.Edges > 0 {
			got = append(got, fmt.Sprintf("%s: %d in %d edges", p.T.Sub(a), p.In.Connections, p.In.Edges))
		}
	}
	// Minute b holds only the server's record of connections the
	// client's records count: no traffic of its own.
	if want := []string{"0s: 19 in 1 edges", "2m0s: 1 in 1 edges"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("history of %s in: %q, want %q", to, got, want)
	}
}

// Docker's embedded DNS: a client asks 127.0.0.11:53, a NAT rule hands
// the query to dockerd on another port, where the server's record has
// it. The edge's history holds what /api/graph holds for it, its server
// named dockerd in every step.
func TestSeriesOfARedirectedLoopbackService(t *testing.T) {
	now := time.Now()
	a := now.Add(-10 * time.Minute).Truncate(time.Minute)
	udp := func(dir, local, remote string, port uint16, comm string, at time.Time) store.Observation {
		return store.Observation{Bucket: at, HostID: "web-1", Direction: dir, Proto: "udp", LocalAddr: local, RemoteAddr: remote, Port: port, Comm: comm,
			Counters: tracer.Counters{DatagramsSent: 3, DatagramsReceived: 3}, FirstSeen: at.Add(10 * time.Second), LastSeen: at.Add(20 * time.Second)}
	}
	srv := serveBatch(t, store.Batch{
		Hosts: []store.Host{{ID: "web-1", Name: "web-1", Addrs: []string{"198.51.100.1"}, LastSeen: now}},
		Observations: []store.Observation{
			udp("outbound", "127.0.0.1", "127.0.0.11", 53, "nslookup", a),
			udp("inbound", "127.0.0.11", "127.0.0.1", 43868, "dockerd", a.Add(time.Minute)),
		},
	})
	const from, to = "workload:web-1/nslookup", "workload:web-1/dockerd"
	since, until := a.Add(-time.Minute).UTC().Format(time.RFC3339), a.Add(4*time.Minute).UTC().Format(time.RFC3339)
	code, body, _ := get(t, srv, "/api/graph?since="+since+"&until="+until)
	if code != http.StatusOK || !strings.Contains(string(body), `"from":"`+from+`","to":"`+to+`"`) {
		t.Fatalf("/api/graph lacks the edge %s -> %s: %d %s", from, to, code, body)
	}
	ans := askJSON[seriesAnswer](t, srv, "/api/series?points=5&since="+since+"&until="+until+"&proto=udp&port=53&from="+url.QueryEscape(from)+"&to="+url.QueryEscape(to))
	var sent uint64
	for _, p := range ans.Points {
		sent += p.DatagramsSent
	}
	if sent != 3 {
		t.Errorf("history of %s -> %s: %d datagrams sent, want the 3 of /api/graph", from, to, sent)
	}
}

// serveBatch writes b to a new SQLite store and serves it as deptrace
// serve does (serve); it returns the server's URL.
func serveBatch(t *testing.T, b store.Batch) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "deptrace.db")
	st, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Write(context.Background(), b)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := serve(t, path, Options{})
	return srv.URL
}

// askJSON gets path from the server at base and decodes its 200 answer.
func askJSON[T any](t *testing.T, base, path string) T {
	t.Helper()
	var ans T
	code, body, _ := get(t, base, path)
	if code != http.StatusOK || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return ans
}

// A series of a node or an edge the store never held is a 404 naming
// the parameter, as /api/look answers a target that matches nothing (it
// was 31 points of zeros: a typo looked like no traffic); one the store
// holds that had no traffic in the range is a history of zeros.
func TestSeriesOfWhatTheStoreNeverHeld(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	edge := func(from, to, proto, port string) string {
		return "from=" + url.QueryEscape(from) + "&to=" + url.QueryEscape(to) + "&proto=" + proto + "&port=" + port
	}
	for q, want := range map[string]string{
		"node=nosuch": `unknown node "nosuch": no such node in the store (group_by workload); allowed a node id as /api/graph gives it`,
		"node=" + url.QueryEscape(idNginx) + "&group_by=host":     `unknown node "workload:web-1/nginx": no such node in the store (group_by host)`,
		"since=3h&node=" + url.QueryEscape("workload:web-1/ngin"): `unknown node "workload:web-1/ngin"`,
		edge(idNginx, "nosuch", "tcp", "8080"):                    `unknown to "nosuch": no such node in the store`,
		edge("nosuch", idRedis, "tcp", "6379"):                    `unknown from "nosuch": no such node in the store`,
		edge(idNginx, idRedis, "tcp", "8080"):                     `unknown edge: the store has no edge from "workload:web-1/nginx" to "workload:cache-1/redis-server" over tcp port 8080 (group_by workload); allowed from, to, proto and port of an edge as /api/graph gives it`,
		edge(idNginx, idRedis, "udp", "6379"):                     `unknown edge: the store has no edge from "workload:web-1/nginx" to "workload:cache-1/redis-server" over udp port 6379`,
		edge(idPostgres, idNginx, "tcp", "5432"):                  `unknown edge`,
	} {
		code, body, hdr := get(t, srv.URL, "/api/series?"+q)
		var e struct{ Error string }
		if err := json.Unmarshal(body, &e); err != nil || code != http.StatusNotFound || !strings.Contains(e.Error, want) || strings.Contains(e.Error, "\n") || hdr.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s, want 404 with %q", q, code, body, want)
		}
	}
	// In the store, but no traffic in the last hour (python3's edge is 90
	// minutes old): zeros, and so in any range, with group_by too.
	for _, q := range []string{
		"since=1h&node=" + url.QueryEscape(idPython),
		"since=1h&" + edge(idPython, idPostgres, "tcp", "5432"),
		"since=1h&group_by=host&node=host:worker-1",
		"since=1h&group_by=host&" + edge("host:worker-1", "host:db-1", "tcp", "5432"),
		"since=3000m&until=2000m&node=" + url.QueryEscape(idNginx),
	} {
		code, body, _ := get(t, srv.URL, "/api/series?"+q)
		if code != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", q, code, body)
			continue
		}
		var ans struct{ Points []map[string]any }
		if err := json.Unmarshal(body, &ans); err != nil || len(ans.Points) < 30 {
			t.Errorf("%s: %v, %d points, want 30 or 31", q, err, len(ans.Points))
		}
		for _, p := range ans.Points {
			for _, k := range []string{"connections", "datagrams_sent"} {
				if v, ok := p[k].(float64); ok && v != 0 {
					t.Errorf("%s: a point with %s %v, want zeros", q, k, v)
				}
			}
			for _, dir := range []string{"in", "out"} {
				if m, ok := p[dir].(map[string]any); ok && (m["connections"] != 0.0 || m["edges"] != 0.0) {
					t.Errorf("%s: %s %v, want zeros", q, dir, m)
				}
			}
		}
	}
}

// allHistoryReads counts the server's reads of all history (its debug
// line): the handler is shared by the server's goroutines.
type allHistoryReads struct {
	mu sync.Mutex
	n  int
}

func (c *allHistoryReads) Enabled(context.Context, slog.Level) bool { return true }
func (c *allHistoryReads) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *allHistoryReads) WithGroup(string) slog.Handler            { return c }
func (c *allHistoryReads) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "read all history") {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
	return nil
}

func (c *allHistoryReads) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// A series of an idle node or edge (in the store, no traffic in the
// range) reads all history once per group_by to tell it from a typo,
// not on every request (it did: a click on an idle node of the page cost
// a read of weeks of data). A miss still reads it again, so that a node
// new since is found and one never held is still a 404.
func TestSeriesOfAnIdleNodeReadsAllHistoryOnce(t *testing.T) {
	path, now := seed(t)
	reads := &allHistoryReads{}
	srv, st := serve(t, path, Options{Log: slog.New(reads)})
	ask := func(q string, code, wantReads int) {
		t.Helper()
		if got, body, _ := get(t, srv.URL, "/api/series?"+q); got != code {
			t.Errorf("%s: %d %.200s, want %d", q, got, body, code)
		}
		if n := reads.count(); n != wantReads {
			t.Errorf("after %s: %d reads of all history, want %d", q, n, wantReads)
		}
	}
	python := "since=1h&node=" + url.QueryEscape(idPython) // 90 minutes old: idle
	ask(python, http.StatusOK, 1)
	ask(python, http.StatusOK, 1)
	ask("since=1h&from="+url.QueryEscape(idPython)+"&to="+url.QueryEscape(idPostgres)+"&proto=tcp&port=5432", http.StatusOK, 1)
	ask("since=3000m&until=2000m&node="+url.QueryEscape(idNginx), http.StatusOK, 1)
	// Traffic in the range needs no check at all.
	ask("since=2h&node="+url.QueryEscape(idNginx), http.StatusOK, 1)
	// Another group_by is another set of ids.
	ask("since=1h&group_by=host&node=host:worker-1", http.StatusOK, 2)
	ask("since=1h&group_by=host&node=host:worker-1", http.StatusOK, 2)
	// Misses read again: a typo stays a 404 with its wording, an edge
	// between two known nodes that the store never held too.
	if code, e := apiError(t, srv.URL, "/api/series?node=nosuch"); code != http.StatusNotFound ||
		e != `unknown node "nosuch": no such node in the store (group_by workload); allowed a node id as /api/graph gives it` {
		t.Errorf("node=nosuch: %d %q", code, e)
	}
	ask("since=1h&from="+url.QueryEscape(idPython)+"&to="+url.QueryEscape(idPostgres)+"&proto=tcp&port=6432", http.StatusNotFound, 4)
	// A node written after the set was read, and idle now, is found.
	at := now.Add(-2 * time.Hour)
	if err := st.Write(context.Background(), store.Batch{Observations: []store.Observation{{Bucket: at.Truncate(store.DefaultBucket),
		HostID: "worker-1", Direction: "outbound", Proto: "tcp", LocalAddr: "198.51.100.4", RemoteAddr: "198.51.100.3", Port: 6379,
		Comm: "celery", Counters: tracer.Counters{Connections: 1}, FirstSeen: at, LastSeen: at}}}); err != nil {
		t.Fatal(err)
	}
	ask("since=1h&node="+url.QueryEscape("workload:worker-1/celery"), http.StatusOK, 5)
	ask("since=1h&node="+url.QueryEscape("workload:worker-1/celery"), http.StatusOK, 5)
	// A set older than seenMaxAge is read again.
	seen := &srv.Config.Handler.(*Server).seen
	seen.mu.Lock()
	old := *seen.sets[graph.ByWorkload]
	old.at = time.Now().Add(-seenMaxAge)
	seen.sets[graph.ByWorkload] = &old
	seen.mu.Unlock()
	ask(python, http.StatusOK, 6)
}

// Of two reads of all history that overlap, the one read later stays,
// whichever finishes last.
func TestEverSeenKeepsTheLaterRead(t *testing.T) {
	var c everSeenCache
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	newer := &seenSet{at: t0.Add(time.Second), nodes: map[string]bool{"workload:h/new": true}}
	older := &seenSet{at: t0, nodes: map[string]bool{"workload:h/old": true}}
	c.put(graph.ByWorkload, newer)
	c.put(graph.ByWorkload, older)
	if !c.has(graph.ByWorkload, []string{"workload:h/new"}, graph.EdgeKey{}, t0.Add(2*time.Second)) {
		t.Errorf("the older read, put last, replaced the newer")
	}
}
