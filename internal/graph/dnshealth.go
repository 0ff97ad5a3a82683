package graph

import (
	"fmt"
	"strings"
)

// DNSHealth holds the thresholds that make a client's lookups through a
// resolver unhealthy or degraded: rates over the range with a minimum
// count, like the edge rules of Health.
//
//   - Errors (SERVFAIL, other error codes and queries that got no answer
//     in time) over the queries: unhealthy at ErrorRatio with at least
//     MinEvents errors; degraded at DegradedFactor of ErrorRatio, or over
//     it on fewer errors.
//   - NXDOMAIN is judged only when no query got an answer with NOERROR:
//     at least MinEvents NXDOMAIN and no NOERROR is unhealthy (a client
//     asking for a name that does not exist). Otherwise NXDOMAIN is
//     normal: a resolver's search list (Kubernetes' ndots:5) makes
//     several NXDOMAIN answers for every lookup that succeeds.
type DNSHealth struct {
	MinEvents      uint64
	ErrorRatio     float64
	DegradedFactor float64
}

// DefaultDNSHealth: 3 errors and 5 % of the queries make a client's
// lookups through a resolver unhealthy, 2.5 % degraded. look, graph, diff
// and serve use it unless told otherwise (--health-dns-error-ratio,
// --health-dns-min-events, --health-degraded-factor).
var DefaultDNSHealth = DNSHealth{MinEvents: 3, ErrorRatio: 0.05, DegradedFactor: 0.5}

// Validate names the flag of a threshold out of range (the degraded
// factor is the edges' --health-degraded-factor).
func (h DNSHealth) Validate() error {
	if h.ErrorRatio < 0 || h.ErrorRatio > 1 || h.ErrorRatio != h.ErrorRatio {
		return fmt.Errorf("invalid --health-dns-error-ratio %g: allowed 0 to 1", h.ErrorRatio)
	}
	if h.DegradedFactor <= 0 || h.DegradedFactor > 1 || h.DegradedFactor != h.DegradedFactor {
		return fmt.Errorf("invalid --health-degraded-factor %g: allowed more than 0, up to 1", h.DegradedFactor)
	}
	if h.MinEvents < 1 || h.MinEvents > 1_000_000 {
		return fmt.Errorf("invalid --health-dns-min-events %d: allowed 1 to 1000000", h.MinEvents)
	}
	return nil
}

// Judge sets d's Health and Reasons by h (and its derived values).
func (d *DNSStats) Judge(h DNSHealth) {
	d.derive()
	d.Health, d.Reasons = HealthOK, nil
	rules := Health{MinEvents: h.MinEvents, DegradedFactor: h.DegradedFactor}
	add := func(st, r string) {
		d.Health = worse(d.Health, st)
		d.Reasons = append(d.Reasons, r)
	}
	if errs := d.ServFail + d.OtherErrors + d.Timeouts; errs > 0 {
		q := max(d.Queries, errs)
		if st := rules.level(errs, float64(errs)/float64(q), h.ErrorRatio, false, 1); st != HealthOK {
			var causes []string
			for _, x := range []struct {
				n    uint64
				name string
			}{{d.ServFail, "SERVFAIL"}, {d.OtherErrors, "other errors"}, {d.Timeouts, "timed out"}} {
				if x.n > 0 {
					causes = append(causes, fmt.Sprintf("%d %s", x.n, x.name))
				}
			}
			add(st, fmt.Sprintf("%d of %d lookups failed (%s): %s", errs, q, pct(errs, q), strings.Join(causes, ", ")))
		}
	}
	if d.NXDomain >= h.MinEvents && d.NoError == 0 {
		add(HealthUnhealthy, fmt.Sprintf("%d lookups answered NXDOMAIN and none with an address", d.NXDomain))
	}
}

// JudgeDNS sets the health of every client's DNS stats by h and makes
// each node with DNS stats as unhealthy (or degraded) as its worst
// resolver, with the reasons prefixed "DNS via RESOLVER/PROTO: ". Run it
// after Judge, which sets a node's health from its services alone.
func (g *Graph) JudgeDNS(h DNSHealth) {
	for i := range g.Nodes {
		n := &g.Nodes[i]
		for j := range n.DNS {
			d := &n.DNS[j]
			d.Judge(h)
			if d.Health == HealthOK {
				continue
			}
			n.Health = worse(cmp0(n.Health), d.Health)
			for _, r := range d.Reasons {
				n.Reasons = append(n.Reasons, "DNS via "+d.Resolver+"/"+d.Proto+": "+r)
			}
		}
		if len(n.DNS) > 0 {
			n.Health = cmp0(n.Health)
			n.Unhealthy = n.Health == HealthUnhealthy
		}
	}
}

// cmp0 is a health state, ok when none was set.
func cmp0(s string) string {
	if s == "" {
		return HealthOK
	}
	return s
}

// dnsMark is what look adds after the label of a node whose lookups
// through some resolver are unhealthy or degraded, wherever the node
// shows (the root of a tree or a peer in it): "  [DNS UNHEALTHY]" or
// "  [DNS DEGRADED]", like the edges' marks; the DNS lines under the
// node as a root give the numbers and reasons.
func dnsMark(n Node) string {
	h := HealthOK
	for _, d := range n.DNS {
		h = worse(h, d.Health)
	}
	switch h {
	case HealthUnhealthy:
		return "  [DNS UNHEALTHY]"
	case HealthDegraded:
		return "  [DNS DEGRADED]"
	}
	return ""
}
