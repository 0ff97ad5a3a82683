package graph

import (
	"fmt"
	"strings"
)

// The health states of an edge, a service and a node, from best to worst.
const (
	HealthOK        = "ok"
	HealthDegraded  = "degraded"
	HealthUnhealthy = "unhealthy"
)

// Health holds the thresholds that make an edge or a service unhealthy or
// degraded. They are rates over the range with a minimum count, so that
// one retransmitted segment among 90 connections (which every busy edge
// of a real network has) is not red, while a dependency that keeps failing
// is.
type Health struct {
	// MinEvents is the fewest failed connections, resets, retransmitted
	// segments or listen drops that can make an edge or a service
	// unhealthy by their rate.
	MinEvents uint64
	// FailedRatio: failed connections over attempts (connections + failed).
	FailedRatio float64
	// ResetRatio: resets, sent or received, over connections.
	ResetRatio float64
	// RetransmitsPerConn: retransmitted segments per connection.
	RetransmitsPerConn float64
	// ListenDropRatio: handshake packets a service's full accept queue
	// dropped (the listener's sk_drops: SYNs and completing ACKs, each
	// retry again) over the arrivals (connections established + drops).
	ListenDropRatio float64
	// DegradedFactor: a rule whose rate reaches this fraction of its
	// unhealthy threshold makes the edge or service degraded (also when
	// its count is under MinEvents); 1 keeps degraded for rates over the
	// threshold on too few events.
	DegradedFactor float64
}

// DefaultHealth are the thresholds look, graph, diff and serve use unless
// told otherwise (docs/graph.md, "Health").
var DefaultHealth = Health{MinEvents: 3, FailedRatio: 0.01, ResetRatio: 0.01, RetransmitsPerConn: 0.2, ListenDropRatio: 0.01, DegradedFactor: 0.5}

// Validate names the flag of a threshold out of range.
func (h Health) Validate() error {
	for _, r := range []struct {
		flag string
		v    float64
	}{{"health-failed-ratio", h.FailedRatio}, {"health-reset-ratio", h.ResetRatio}, {"health-listen-drop-ratio", h.ListenDropRatio}} {
		if r.v < 0 || r.v > 1 || r.v != r.v {
			return fmt.Errorf("invalid --%s %g: allowed 0 to 1", r.flag, r.v)
		}
	}
	if h.DegradedFactor <= 0 || h.DegradedFactor > 1 || h.DegradedFactor != h.DegradedFactor {
		return fmt.Errorf("invalid --health-degraded-factor %g: allowed more than 0, up to 1", h.DegradedFactor)
	}
	if h.RetransmitsPerConn < 0 || h.RetransmitsPerConn > 1000 || h.RetransmitsPerConn != h.RetransmitsPerConn {
		return fmt.Errorf("invalid --health-retransmits-per-conn %g: allowed 0 to 1000", h.RetransmitsPerConn)
	}
	if h.MinEvents < 1 || h.MinEvents > 1_000_000 {
		return fmt.Errorf("invalid --health-min-events %d: allowed 1 to 1000000", h.MinEvents)
	}
	return nil
}

func pct(n, of uint64) string { return fmt.Sprintf("%.1f %%", 100*float64(n)/float64(of)) }

// worse is the worse of two health states.
func worse(a, b string) string {
	rank := func(s string) int {
		switch s {
		case HealthUnhealthy:
			return 2
		case HealthDegraded:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// level applies one rate rule: unhealthy when at least MinEvents events
// make a rate at (or, strict, over) the threshold; degraded when at least
// minDegraded events make a rate at DegradedFactor of it; ok otherwise.
func (h Health) level(events uint64, rate, threshold float64, strict bool, minDegraded uint64) string {
	f := h.DegradedFactor
	if f <= 0 { // a Health literal without it: the default
		f = DefaultHealth.DegradedFactor
	}
	over := rate >= threshold
	if strict {
		over = rate > threshold
	}
	switch {
	case events == 0:
		return HealthOK
	case events >= h.MinEvents && over:
		return HealthUnhealthy
	case events >= minDegraded && (over || rate >= f*threshold):
		return HealthDegraded
	}
	return HealthOK
}

// Judge sets Health, Unhealthy and Reasons on every edge of g by h, and
// the derived average connect latency; then judges every service's
// listen drops against the connections its edges brought (a service
// node of format 1, each service of a workload node of format 2) and sets
// each node's state to its worst service's.
func (g *Graph) Judge(h Health) {
	type svc struct {
		node, proto string
		port        uint16
	}
	in := make(map[svc]attempts)
	for i := range g.Edges {
		e := &g.Edges[i]
		e.judge(h)
		a := in[svc{e.To, e.Proto, e.Port}]
		a.worked += e.Connections
		a.failed += e.FailedConnections
		in[svc{e.To, e.Proto, e.Port}] = a
	}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		n.Health, n.Unhealthy, n.Reasons, n.Unanswered = HealthOK, false, nil, false
		if len(n.Services) > 0 {
			for j := range n.Services {
				s := &n.Services[j]
				a := in[svc{n.ID, s.Proto, s.Port}]
				s.Health, s.Reasons = h.listen(s.Listener, a.worked)
				if s.Unanswered = a.unanswered(s.Proto, s.Listener); s.Unanswered {
					s.Health, s.Reasons = HealthUnhealthy, append(s.Reasons, a.reason())
				}
				s.Unhealthy = s.Health == HealthUnhealthy
				n.Health = worse(n.Health, s.Health)
				for _, r := range s.Reasons {
					n.Reasons = append(n.Reasons, s.String()+": "+r)
				}
			}
		} else if n.Kind == KindService || n.Listener != nil {
			a := in[svc{n.ID, n.Proto, n.Port}]
			n.Health, n.Reasons = h.listen(n.Listener, a.worked)
			if n.Unanswered = a.unanswered(n.Proto, n.Listener); n.Unanswered {
				n.Health, n.Reasons = HealthUnhealthy, append(n.Reasons, a.reason())
			}
		}
		n.Unhealthy = n.Health == HealthUnhealthy
	}
}

// attempts are the connections a service's edges brought: those that
// worked and those that failed.
type attempts struct{ worked, failed uint64 }

// unanswered: asked for, and nothing answered. A service deptrace only
// knows from its clients' refused or timed-out connects (nothing listens
// there) is an attempted dependency, not a listening service.
func (a attempts) unanswered(proto string, l *ListenerState) bool {
	// Not unix: its services all have port 0 and edges carry no path, so
	// one socket's failures would mark the workload's every other.
	return proto != "unix" && l == nil && a.worked == 0 && a.failed > 0
}

func (a attempts) reason() string {
	return fmt.Sprintf("nothing answered: %d connection attempts, none worked", a.failed)
}

// listen judges a service's accept queue: drops over the arrivals
// (connections established, as its edges counted them, + drops). A drop is a
// packet, not a connection: a client whose SYN is dropped retries, and
// each retry dropped counts again.
func (h Health) listen(l *ListenerState, established uint64) (string, []string) {
	if l == nil || l.Drops == 0 {
		return HealthOK, nil
	}
	reached := established + l.Drops
	st := h.level(l.Drops, float64(l.Drops)/float64(reached), h.ListenDropRatio, false, 1)
	if st == HealthOK {
		return st, nil
	}
	return st, []string{fmt.Sprintf("accept queue full: %d handshake packets dropped (SYNs and ACKs, a retry counted again) beside %d connections established, %s of %d arrivals (backlog %d, deepest queue %d)",
		l.Drops, established, pct(l.Drops, reached), reached, l.BacklogLimit, l.QueueMax)}
}

// judge applies h to the edge's counters over the range:
//   - failed connections: at least MinEvents and at least FailedRatio of the
//     attempts; or every attempt failed (a dependency that never worked);
//   - resets (sent and received): at least MinEvents and at least
//     ResetRatio of the connections;
//   - retransmitted segments: at least MinEvents and more than
//     RetransmitsPerConn per connection (per connection seen, at least one;
//     per attempt where none connected).
//
// Each is degraded instead when its rate reaches DegradedFactor of the
// threshold, or passes it on fewer than MinEvents events; never on a single
// retransmitted segment. Health is the worst rule's state; Reasons says
// which rules fired, with the numbers.
func (e *Edge) judge(h Health) {
	c := e.Counters
	e.ConnectLatencyAvgUs = 0
	if c.ConnectLatencyCount > 0 {
		e.ConnectLatencyAvgUs = c.ConnectLatencySumUs / c.ConnectLatencyCount
	}
	e.Reasons = nil
	e.Health = HealthOK
	attempts := c.Connections + c.FailedConnections
	conns := float64(max(c.Connections, 1))
	if f := c.FailedConnections; f > 0 {
		st := h.level(f, float64(f)/float64(attempts), h.FailedRatio, false, 1)
		if c.Connections == 0 {
			st = HealthUnhealthy // every attempt failed
		}
		if st != HealthOK {
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
			e.add(st, r)
		}
	}
	if rst := c.ResetsSent + c.ResetsReceived; rst > 0 {
		if st := h.level(rst, float64(rst)/conns, h.ResetRatio, false, 1); st != HealthOK {
			e.add(st, fmt.Sprintf("%d resets in %d connections (%d sent by the client, %d received)", rst, c.Connections, c.ResetsSent, c.ResetsReceived))
		}
	}
	if rt := c.Retransmits; rt > 0 {
		// A single retransmitted segment is never a sign of anything.
		if c.Connections == 0 && attempts > 0 {
			// Every attempt failed: these are its SYN's retries, per attempt.
			per := float64(rt) / float64(attempts)
			if st := h.level(rt, per, h.RetransmitsPerConn, true, 2); st != HealthOK {
				e.add(st, fmt.Sprintf("%d retransmitted segments in %d connection attempts, none connected (%.2f per attempt)", rt, attempts, per))
			}
		} else if st := h.level(rt, float64(rt)/conns, h.RetransmitsPerConn, true, 2); st != HealthOK {
			e.add(st, fmt.Sprintf("%d retransmitted segments in %d connections (%.2f per connection)", rt, c.Connections, float64(rt)/conns))
		}
	}
	e.Unhealthy = e.Health == HealthUnhealthy
}

func (e *Edge) add(st, reason string) {
	e.Health = worse(e.Health, st)
	e.Reasons = append(e.Reasons, reason)
}
