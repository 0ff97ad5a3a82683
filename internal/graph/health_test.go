package graph

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/tracer"
)

// Each rule on both sides of its thresholds, with the default thresholds
// (3 events; 1 % of attempts failed; 1 % of connections reset; 0.2
// retransmits per connection; degraded from half of each).
func TestHealthThresholds(t *testing.T) {
	cases := []struct {
		name   string
		c      tracer.Counters
		health string
		reason string
	}{
		{"nothing wrong", tracer.Counters{Connections: 90}, "ok", ""},
		{"one retransmit in 90 connections", tracer.Counters{Connections: 90, Retransmits: 1}, "ok", ""},
		{"one retransmit on one connection: never anything", tracer.Counters{Connections: 1, Retransmits: 1}, "ok", ""},
		{"retransmits under half the rate", tracer.Counters{Connections: 90, Retransmits: 8}, "ok", ""},
		{"retransmits at half the rate", tracer.Counters{Connections: 90, Retransmits: 9}, "degraded", "9 retransmitted segments in 90 connections (0.10 per connection)"},
		{"retransmits at the rate", tracer.Counters{Connections: 90, Retransmits: 18}, "degraded", "18 retransmitted segments in 90 connections (0.20 per connection)"},
		{"retransmits over the rate", tracer.Counters{Connections: 90, Retransmits: 19}, "unhealthy", "19 retransmitted segments in 90 connections (0.21 per connection)"},
		{"two retransmits on one connection: too few", tracer.Counters{Connections: 1, Retransmits: 2}, "degraded", "2 retransmitted segments in 1 connections (2.00 per connection)"},
		{"three retransmits on one connection", tracer.Counters{Connections: 1, Retransmits: 3}, "unhealthy", "3 retransmitted segments in 1 connections (3.00 per connection)"},
		{"SYN retries of attempts that all timed out", tracer.Counters{FailedConnections: 10, FailedTimeout: 10, Retransmits: 20}, "unhealthy",
			"10 of 10 connection attempts failed (100.0 %): 10 timed out; 20 retransmitted segments in 10 connection attempts, none connected (2.00 per attempt)"},
		{"two failures: too few", tracer.Counters{Connections: 10, FailedConnections: 2, FailedTimeout: 2}, "degraded", "2 of 12 connection attempts failed (16.7 %): 2 timed out"},
		{"one failure in 1,000: under half the rate", tracer.Counters{Connections: 999, FailedConnections: 1, FailedRefused: 1}, "ok", ""},
		{"three failures in 1,000 attempts: under 1 %", tracer.Counters{Connections: 997, FailedConnections: 3, FailedRefused: 3}, "ok", ""},
		{"five failures in 1,000 attempts: half of 1 %", tracer.Counters{Connections: 995, FailedConnections: 5, FailedRefused: 5}, "degraded", "5 of 1000 connection attempts failed (0.5 %): 5 refused"},
		{"three failures in 300 attempts: 1 %", tracer.Counters{Connections: 297, FailedConnections: 3, FailedRefused: 3}, "unhealthy", "3 of 300 connection attempts failed (1.0 %): 3 refused"},
		{"a refused port: every attempt failed", tracer.Counters{FailedConnections: 1, FailedRefused: 1}, "unhealthy", "1 of 1 connection attempts failed (100.0 %): 1 refused"},
		{"two resets: too few", tracer.Counters{Connections: 10, ResetsReceived: 2}, "degraded", "2 resets in 10 connections (0 sent by the client, 2 received)"},
		{"three resets in 700 connections: under half of 1 %", tracer.Counters{Connections: 700, ResetsReceived: 3}, "ok", ""},
		{"three resets in 301 connections: under 1 %", tracer.Counters{Connections: 301, ResetsReceived: 3}, "degraded", "3 resets in 301 connections (0 sent by the client, 3 received)"},
		{"three resets in 300 connections", tracer.Counters{Connections: 300, ResetsSent: 1, ResetsReceived: 2}, "unhealthy", "3 resets in 300 connections (1 sent by the client, 2 received)"},
		{"unhealthy and degraded: the worst wins, both reasons", tracer.Counters{Connections: 300, ResetsReceived: 3, Retransmits: 40},
			"unhealthy", "3 resets in 300 connections (0 sent by the client, 3 received); 40 retransmitted segments in 300 connections (0.13 per connection)"},
	}
	for _, c := range cases {
		e := Edge{Proto: "tcp", Counters: c.c}
		e.judge(DefaultHealth)
		got := strings.Join(e.Reasons, "; ")
		if e.Health != c.health || e.Unhealthy != (c.health == "unhealthy") || got != c.reason {
			t.Errorf("%s: health %s (unhealthy %v), reasons %q; want %s, %q", c.name, e.Health, e.Unhealthy, got, c.health, c.reason)
		}
	}

	// Thresholds are the caller's: stricter ones turn the same edge red.
	g := Graph{Edges: []Edge{{Proto: "tcp", Counters: tracer.Counters{Connections: 90, Retransmits: 1}}}}
	strict := DefaultHealth
	strict.MinEvents, strict.RetransmitsPerConn = 1, 0
	g.Judge(strict)
	if !g.Edges[0].Unhealthy || g.Edges[0].Health != HealthUnhealthy {
		t.Errorf("strict thresholds: %+v", g.Edges[0])
	}
	g.Judge(DefaultHealth)
	if g.Edges[0].Unhealthy || g.Edges[0].Health != HealthOK {
		t.Errorf("default thresholds: %+v", g.Edges[0])
	}
	// A degraded factor of 1: degraded only for rates over a threshold on
	// too few events.
	one := DefaultHealth
	one.DegradedFactor = 1
	for _, c := range []struct {
		c    tracer.Counters
		want string
	}{
		{tracer.Counters{Connections: 90, Retransmits: 9}, HealthOK},
		{tracer.Counters{Connections: 10, FailedConnections: 2}, HealthDegraded},
	} {
		e := Edge{Proto: "tcp", Counters: c.c}
		e.judge(one)
		if e.Health != c.want {
			t.Errorf("degraded factor 1, %+v: %s, want %s", c.c, e.Health, c.want)
		}
	}
}

// Listen drops are a rate of the connections that reached the service:
// accepted (its edges' connections) + dropped.
func TestHealthListenDrops(t *testing.T) {
	cases := []struct {
		name     string
		drops    uint64
		accepted uint64
		health   string
		reason   string
	}{
		{"no drops", 0, 100, "ok", ""},
		{"one drop in 1,000: under half of 1 %", 1, 999, "ok", ""},
		{"one drop in 100: too few", 1, 99, "degraded", "accept queue full: 1 handshake packets dropped (SYNs and ACKs, a retry counted again) beside 99 connections established, 1.0 % of 100 arrivals (backlog 128, deepest queue 129)"},
		{"three drops in 300", 3, 297, "unhealthy", "accept queue full: 3 handshake packets dropped (SYNs and ACKs, a retry counted again) beside 297 connections established, 1.0 % of 300 arrivals (backlog 128, deepest queue 129)"},
		{"three drops in 500: degraded", 3, 497, "degraded", "accept queue full: 3 handshake packets dropped (SYNs and ACKs, a retry counted again) beside 497 connections established, 0.6 % of 500 arrivals (backlog 128, deepest queue 129)"},
		{"drops and nothing accepted", 15, 0, "unhealthy", "accept queue full: 15 handshake packets dropped (SYNs and ACKs, a retry counted again) beside 0 connections established, 100.0 % of 15 arrivals (backlog 128, deepest queue 129)"},
	}
	for _, c := range cases {
		l := &ListenerState{BacklogLimit: 128, QueueMax: 129, Drops: c.drops}
		// Format 1: a service node.
		g1 := Graph{
			Nodes: []Node{{ID: "process:a/curl", Kind: KindProcess}, {ID: "service:b/tcp/80", Kind: KindService, Proto: "tcp", Port: 80, Listener: l}},
			Edges: []Edge{{From: "process:a/curl", To: "service:b/tcp/80", Proto: "tcp", Port: 80, Counters: tracer.Counters{Connections: c.accepted}}},
		}
		g1.Judge(DefaultHealth)
		n := g1.Nodes[1]
		if got := strings.Join(n.Reasons, "; "); n.Health != c.health || n.Unhealthy != (c.health == "unhealthy") || got != c.reason {
			t.Errorf("%s, service node: %s (unhealthy %v) %q; want %s %q", c.name, n.Health, n.Unhealthy, got, c.health, c.reason)
		}
		if g1.Nodes[0].Health != HealthOK {
			t.Errorf("%s: client node %s", c.name, g1.Nodes[0].Health)
		}
		// Format 2: a workload's service, its edges counted per port.
		g2 := Graph{Format: 2,
			Nodes: []Node{{ID: "workload:a/curl", Kind: KindWorkload}, {ID: "workload:b/nginx", Kind: KindWorkload,
				Services: []Service{{Proto: "tcp", Port: 80, Listener: l}, {Proto: "tcp", Port: 443}}}},
			Edges: []Edge{
				{From: "workload:a/curl", To: "workload:b/nginx", Proto: "tcp", Port: 80, Counters: tracer.Counters{Connections: c.accepted}},
				{From: "workload:a/curl", To: "workload:b/nginx", Proto: "tcp", Port: 443, Counters: tracer.Counters{Connections: 1_000_000}},
			},
		}
		g2.Judge(DefaultHealth)
		w := g2.Nodes[1]
		want := ""
		if c.reason != "" {
			want = "tcp/80: " + c.reason
		}
		if got := strings.Join(w.Reasons, "; "); w.Health != c.health || w.Unhealthy != (c.health == "unhealthy") || got != want ||
			w.Services[0].Health != c.health || w.Services[1].Health != HealthOK {
			t.Errorf("%s, workload: %s (unhealthy %v) %q, services %+v; want %s %q", c.name, w.Health, w.Unhealthy, got, w.Services, c.health, want)
		}
	}
	// The ratio is the caller's.
	h := DefaultHealth
	h.ListenDropRatio = 0.5
	g := Graph{Nodes: []Node{{ID: "s", Kind: KindService, Proto: "tcp", Port: 80, Listener: &ListenerState{Drops: 3}}},
		Edges: []Edge{{From: "c", To: "s", Proto: "tcp", Port: 80, Counters: tracer.Counters{Connections: 97}}}}
	if g.Judge(h); g.Nodes[0].Health != HealthOK {
		t.Errorf("3 drops of 100 at ratio 0.5: %s", g.Nodes[0].Health)
	}
}

// The states reach the JSON as encoding/json writes them.
func TestHealthInJSON(t *testing.T) {
	g := Graph{Format: 2,
		Nodes: []Node{{ID: "workload:a/curl", Kind: KindWorkload}, {ID: "workload:b/nginx", Kind: KindWorkload,
			Services: []Service{{Proto: "tcp", Port: 80, Listener: &ListenerState{Drops: 1}}}}},
		Edges: []Edge{{From: "workload:a/curl", To: "workload:b/nginx", Proto: "tcp", Port: 80, Counters: tracer.Counters{Connections: 10, FailedConnections: 2}}},
	}
	g.Judge(DefaultHealth)
	var want, got bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetIndent("", "  ")
	if err := enc.Encode(g); err != nil {
		t.Fatal(err)
	}
	if err := Write(&got, g, "json"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Errorf("got\n%s\nwant\n%s", got.Bytes(), want.Bytes())
	}
	for _, s := range []string{`"health": "degraded"`, `"health": "ok"`} {
		if !strings.Contains(got.String(), s) {
			t.Errorf("no %s in\n%s", s, got.Bytes())
		}
	}
}

func TestHealthValidate(t *testing.T) {
	if err := DefaultHealth.Validate(); err != nil {
		t.Error(err)
	}
	with := func(f func(*Health)) Health { h := DefaultHealth; f(&h); return h }
	for _, c := range []struct {
		h    Health
		want string
	}{
		{with(func(h *Health) { h.MinEvents = 0 }), "invalid --health-min-events 0: allowed 1 to 1000000"},
		{with(func(h *Health) { h.FailedRatio = 1.5 }), "invalid --health-failed-ratio 1.5: allowed 0 to 1"},
		{with(func(h *Health) { h.ResetRatio = -1 }), "invalid --health-reset-ratio -1: allowed 0 to 1"},
		{with(func(h *Health) { h.ListenDropRatio = math.NaN() }), "invalid --health-listen-drop-ratio NaN: allowed 0 to 1"},
		{with(func(h *Health) { h.RetransmitsPerConn = -0.1 }), "invalid --health-retransmits-per-conn -0.1: allowed 0 to 1000"},
		{with(func(h *Health) { h.DegradedFactor = 0 }), "invalid --health-degraded-factor 0: allowed more than 0, up to 1"},
		{with(func(h *Health) { h.DegradedFactor = 2 }), "invalid --health-degraded-factor 2: allowed more than 0, up to 1"},
	} {
		if err := c.h.Validate(); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %q", c.h, err, c.want)
		}
	}
}

// look, DOT and Mermaid mark degraded edges and services apart from
// unhealthy ones, the way the page draws them (orange dashed, red).
func TestHealthRendered(t *testing.T) {
	g := Graph{
		Nodes: []Node{
			{ID: ProcessID("h", "curl"), Kind: KindProcess, Host: "h", Process: "curl"},
			{ID: ServiceID("h", "tcp", 80), Kind: KindService, Host: "h", Proto: "tcp", Port: 80, Process: "nginx",
				Listener: &ListenerState{BacklogLimit: 16, QueueMax: 16, Drops: 2}},
			{ID: ServiceID("h", "tcp", 81), Kind: KindService, Host: "h", Proto: "tcp", Port: 81, Process: "bad"},
			{ID: ServiceID("h", "tcp", 82), Kind: KindService, Host: "h", Proto: "tcp", Port: 82, Process: "fine"},
		},
		Edges: []Edge{
			// 2 of 302 failed, 2 of 302 dropped: 0.66 %, over half of 1 %: degraded.
			{From: ProcessID("h", "curl"), To: ServiceID("h", "tcp", 80), Proto: "tcp", Port: 80, Counters: tracer.Counters{Connections: 300, FailedConnections: 2}},
			{From: ProcessID("h", "curl"), To: ServiceID("h", "tcp", 81), Proto: "tcp", Port: 81, Counters: tracer.Counters{Connections: 10, FailedConnections: 5}},
			{From: ProcessID("h", "curl"), To: ServiceID("h", "tcp", 82), Proto: "tcp", Port: 82, Counters: tracer.Counters{Connections: 10}},
		},
	}
	g.Judge(DefaultHealth)
	if g.Edges[0].Health != HealthDegraded || g.Edges[1].Health != HealthUnhealthy || g.Edges[2].Health != HealthOK {
		t.Fatalf("edges judged %s %s %s, want degraded unhealthy ok", g.Edges[0].Health, g.Edges[1].Health, g.Edges[2].Health)
	}
	if n := g.Nodes[1]; n.Health != HealthDegraded {
		t.Fatalf("nginx judged %s %v, want degraded", n.Health, n.Reasons)
	}

	var buf bytes.Buffer
	WriteTrees(&buf, Look(g, []string{g.Nodes[0].ID}, 1, true, false, 0), true, false)
	out := buf.String()
	for _, want := range []string{
		"-> tcp :80 nginx on h  [listen backlog=16 queue_max=16 drops=2 DEGRADED]  DEGRADED  conns=300 failed=2",
		"bad on h  UNHEALTHY  conns=10 failed=5",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("look: no %q in\n%s", want, out)
		}
	}
	if strings.Count(out, "DEGRADED") != 2 || strings.Count(out, "UNHEALTHY") != 1 {
		t.Errorf("look marks:\n%s", out)
	}
	// Each marked edge's line ends with the rule that fired; the healthy
	// one's has no reason.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.Contains(line, "bad on h"):
			if !strings.HasSuffix(line, "  why: 5 of 15 connection attempts failed (33.3 %)") {
				t.Errorf("look: the unhealthy edge's line gives no reason: %q", line)
			}
		case strings.Contains(line, "nginx on h"):
			if !strings.HasSuffix(line, "  why: 2 of 302 connection attempts failed (0.7 %)") {
				t.Errorf("look: the degraded edge's line gives no reason: %q", line)
			}
		case strings.Contains(line, "why:"):
			t.Errorf("look: a reason on a line without a mark: %q", line)
		}
	}

	buf.Reset()
	if err := Write(&buf, g, "dot"); err != nil {
		t.Fatal(err)
	}
	dot := buf.String()
	if strings.Count(dot, "color=orange style=dashed") != 2 || strings.Count(dot, "color=red") != 1 {
		t.Errorf("dot: want 2 orange dashed (nginx, its edge) and 1 red:\n%s", dot)
	}

	buf.Reset()
	if err := Write(&buf, g, "mermaid"); err != nil {
		t.Fatal(err)
	}
	mm := buf.String()
	for _, want := range []string{"  linkStyle 0 stroke:orange,stroke-dasharray:5 5\n", "  linkStyle 1 stroke:red\n",
		"  classDef degraded stroke:orange,stroke-dasharray:5 5\n  class n1 degraded\n"} {
		if !strings.Contains(mm, want) {
			t.Errorf("mermaid: no %q in\n%s", want, mm)
		}
	}
	if strings.Contains(mm, "class n3") || strings.Contains(mm, "linkStyle 2") {
		t.Errorf("mermaid marks the healthy service or edge:\n%s", mm)
	}
}

// Latencies read to three significant digits, not to the nearest 10 µs
// (23 µs was 20µs).
func TestLatencyText(t *testing.T) {
	for v, want := range map[uint64]string{0: "0s", 23: "23µs", 94: "94µs", 999: "999µs", 1234: "1.23ms", 1500: "1.5ms", 99949: "99.9ms", 2345678: "2.35s"} {
		if got := us(v); got != want {
			t.Errorf("us(%d) = %q, want %q", v, got, want)
		}
	}
}
