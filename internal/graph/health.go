package graph

import (
	"fmt"
	"strings"
)

// Health holds the thresholds that make an edge unhealthy. They are rates
// over the range with a minimum count, so that one retransmitted segment
// among 90 connections (which every busy edge of a real network has) is
// not red, while a dependency that keeps failing is.
type Health struct {
	// MinEvents is the fewest failed connections, resets or retransmitted
	// segments that can make an edge unhealthy by their rate.
	MinEvents uint64
	// FailedRatio: failed connections over attempts (connections + failed).
	FailedRatio float64
	// ResetRatio: resets, sent or received, over connections.
	ResetRatio float64
	// RetransmitsPerConn: retransmitted segments per connection.
	RetransmitsPerConn float64
}

// DefaultHealth are the thresholds look, graph, diff and serve use unless
// told otherwise (docs/graph.md, "Health").
var DefaultHealth = Health{MinEvents: 3, FailedRatio: 0.01, ResetRatio: 0.01, RetransmitsPerConn: 0.2}

// Validate names the flag of a threshold out of range.
func (h Health) Validate() error {
	for _, r := range []struct {
		flag string
		v    float64
	}{{"health-failed-ratio", h.FailedRatio}, {"health-reset-ratio", h.ResetRatio}} {
		if r.v < 0 || r.v > 1 {
			return fmt.Errorf("invalid --%s %g: allowed 0 to 1", r.flag, r.v)
		}
	}
	if h.RetransmitsPerConn < 0 || h.RetransmitsPerConn > 1000 {
		return fmt.Errorf("invalid --health-retransmits-per-conn %g: allowed 0 to 1000", h.RetransmitsPerConn)
	}
	if h.MinEvents < 1 || h.MinEvents > 1_000_000 {
		return fmt.Errorf("invalid --health-min-events %d: allowed 1 to 1000000", h.MinEvents)
	}
	return nil
}

func pct(n, of uint64) string { return fmt.Sprintf("%.1f %%", 100*float64(n)/float64(of)) }

// Judge sets Unhealthy and Reasons on every edge of g by h, and the
// derived average connect latency.
func (g *Graph) Judge(h Health) {
	for i := range g.Edges {
		g.Edges[i].judge(h)
	}
}

// judge applies h to the edge's counters over the range:
//   - failed connections: at least MinEvents and at least FailedRatio of the
//     attempts; or every attempt failed (a dependency that never worked);
//   - resets (sent and received): at least MinEvents and at least
//     ResetRatio of the connections;
//   - retransmitted segments: at least MinEvents and more than
//     RetransmitsPerConn per connection (per connection seen, at least one).
//
// Reasons says which rule fired, with the numbers.
func (e *Edge) judge(h Health) {
	c := e.Counters
	e.ConnectLatencyAvgUs = 0
	if c.ConnectLatencyCount > 0 {
		e.ConnectLatencyAvgUs = c.ConnectLatencySumUs / c.ConnectLatencyCount
	}
	e.Reasons = nil
	attempts := c.Connections + c.FailedConnections
	if f := c.FailedConnections; f > 0 && ((f >= h.MinEvents && float64(f) >= h.FailedRatio*float64(attempts)) || c.Connections == 0) {
		var causes []string
		for _, x := range []struct {
			n    uint64
			name string
		}{{c.FailedRefused, "refused"}, {c.FailedTimeout, "timed out"}, {c.FailedReset, "reset"}, {c.FailedUnreachable, "unreachable"}} {
			if x.n > 0 {
				causes = append(causes, fmt.Sprintf("%d %s", x.n, x.name))
			}
		}
		r := fmt.Sprintf("%d of %d connection attempts failed (%s)", f, attempts, pct(f, attempts))
		if len(causes) > 0 {
			r += ": " + strings.Join(causes, ", ")
		}
		e.Reasons = append(e.Reasons, r)
	}
	if rst := c.ResetsSent + c.ResetsReceived; rst > 0 && rst >= h.MinEvents && float64(rst) >= h.ResetRatio*float64(max(c.Connections, 1)) {
		e.Reasons = append(e.Reasons, fmt.Sprintf("%d resets in %d connections (%d sent by the client, %d received)", rst, c.Connections, c.ResetsSent, c.ResetsReceived))
	}
	if rt := c.Retransmits; rt > 0 && rt >= h.MinEvents && float64(rt) > h.RetransmitsPerConn*float64(max(c.Connections, 1)) {
		e.Reasons = append(e.Reasons, fmt.Sprintf("%d retransmitted segments in %d connections (%.2f per connection)", rt, c.Connections, float64(rt)/float64(max(c.Connections, 1))))
	}
	e.Unhealthy = len(e.Reasons) > 0
}
