package graph

import (
	"strings"
	"testing"

	"github.com/deptrace/deptrace/tracer"
)

// Each rule on both sides of its threshold, with the default thresholds
// (3 events; 1 % of attempts failed; 1 % of connections reset; 0.2
// retransmits per connection).
func TestHealthThresholds(t *testing.T) {
	cases := []struct {
		name   string
		c      tracer.Counters
		reason string // "" : healthy
	}{
		{"nothing wrong", tracer.Counters{Connections: 90}, ""},
		{"one retransmit in 90 connections", tracer.Counters{Connections: 90, Retransmits: 1}, ""},
		{"retransmits at the rate", tracer.Counters{Connections: 90, Retransmits: 18}, ""},
		{"retransmits over the rate", tracer.Counters{Connections: 90, Retransmits: 19}, "19 retransmitted segments in 90 connections (0.21 per connection)"},
		{"two retransmits on one connection: too few", tracer.Counters{Connections: 1, Retransmits: 2}, ""},
		{"three retransmits on one connection", tracer.Counters{Connections: 1, Retransmits: 3}, "3 retransmitted segments in 1 connections (3.00 per connection)"},
		{"two failures: too few", tracer.Counters{Connections: 10, FailedConnections: 2, FailedTimeout: 2}, ""},
		{"three failures in 1,000 attempts: under 1 %", tracer.Counters{Connections: 997, FailedConnections: 3, FailedRefused: 3}, ""},
		{"three failures in 300 attempts: 1 %", tracer.Counters{Connections: 297, FailedConnections: 3, FailedRefused: 3}, "3 of 300 connection attempts failed (1.0 %): 3 refused"},
		{"a refused port: every attempt failed", tracer.Counters{FailedConnections: 1, FailedRefused: 1}, "1 of 1 connection attempts failed (100.0 %): 1 refused"},
		{"two resets: too few", tracer.Counters{Connections: 10, ResetsReceived: 2}, ""},
		{"three resets in 301 connections: under 1 %", tracer.Counters{Connections: 301, ResetsReceived: 3}, ""},
		{"three resets in 300 connections", tracer.Counters{Connections: 300, ResetsSent: 1, ResetsReceived: 2}, "3 resets in 300 connections (1 sent by the client, 2 received)"},
	}
	for _, c := range cases {
		e := Edge{Proto: "tcp", Counters: c.c}
		e.judge(DefaultHealth)
		got := strings.Join(e.Reasons, "; ")
		if e.Unhealthy != (c.reason != "") || got != c.reason {
			t.Errorf("%s: unhealthy %v, reasons %q; want %q", c.name, e.Unhealthy, got, c.reason)
		}
	}

	// Thresholds are the caller's: stricter ones turn the same edge red.
	g := Graph{Edges: []Edge{{Proto: "tcp", Counters: tracer.Counters{Connections: 90, Retransmits: 1}}}}
	g.Judge(Health{MinEvents: 1, FailedRatio: 0.01, ResetRatio: 0.01, RetransmitsPerConn: 0})
	if !g.Edges[0].Unhealthy {
		t.Errorf("strict thresholds: %+v", g.Edges[0])
	}
	g.Judge(DefaultHealth)
	if g.Edges[0].Unhealthy {
		t.Errorf("default thresholds: %+v", g.Edges[0])
	}
}

func TestHealthValidate(t *testing.T) {
	if err := DefaultHealth.Validate(); err != nil {
		t.Error(err)
	}
	for _, c := range []struct {
		h    Health
		want string
	}{
		{Health{MinEvents: 0, RetransmitsPerConn: 1}, "invalid --health-min-events 0: allowed 1 to 1000000"},
		{Health{MinEvents: 3, FailedRatio: 1.5}, "invalid --health-failed-ratio 1.5: allowed 0 to 1"},
		{Health{MinEvents: 3, ResetRatio: -1}, "invalid --health-reset-ratio -1: allowed 0 to 1"},
		{Health{MinEvents: 3, RetransmitsPerConn: -0.1}, "invalid --health-retransmits-per-conn -0.1: allowed 0 to 1000"},
	} {
		if err := c.h.Validate(); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %q", c.h, err, c.want)
		}
	}
}
