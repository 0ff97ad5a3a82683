package web

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
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
	// At most 120 points, however long the range.
	code, body, _ := get(t, srv.URL, "/api/series?since=2000-01-01T00:00:00Z&points=120&node=workload:a")
	var ans nodeSeriesAnswer
	if err := json.Unmarshal(body, &ans); code != http.StatusOK || err != nil || len(ans.Points) > 121 || len(ans.Points) < 120 {
		t.Errorf("26 years in 120 points: %d, %d points, %v", code, len(ans.Points), err)
	}
}
