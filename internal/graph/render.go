package graph

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// Formats accepted by `deptrace graph --format`.
// "json" is format 2 when given a grouped graph (Group); "json-v1" is the
// process/service graph of format 1, deprecated.
var Formats = []string{"json", "json-v1", "dot", "mermaid"}

// Write renders g in format. The caller chooses the graph: grouped for
// json, dot and mermaid, ungrouped for json-v1.
func Write(w io.Writer, g Graph, format string) error {
	switch format {
	case "json", "json-v1":
		return writeJSON(w, g, indented)
	case "dot":
		return writeDOT(w, g)
	case "mermaid":
		return writeMermaid(w, g)
	}
	return fmt.Errorf("invalid --format %q: allowed %s", format, strings.Join(Formats, ", "))
}

// Label is how a node reads in a tree or a picture.
func Label(n Node) string {
	switch n.Kind {
	case KindHost:
		if n.Addr != "" {
			return fmt.Sprintf("host %s (%s)", n.Host, n.Addr)
		}
		return "host " + n.Host
	case KindWorkload:
		name := n.Name
		if name == "" {
			name = "?"
		}
		if n.Process != "" && n.Process != name {
			name += " (" + n.Process + ")"
		} else if n.Identity.Workload == "" {
			name += Who(n.Identity)
		}
		if n.Addr != "" {
			return fmt.Sprintf("%s on %s (%s)", name, n.Host, n.Addr)
		}
		return fmt.Sprintf("%s on %s", name, n.Host)
	case KindExternal:
		if n.RemoteName != "" {
			// By name, the address kept: "tcp api.example.com:443
			// (external 203.0.113.7)".
			if n.Port != 0 {
				return fmt.Sprintf("%s %s:%d (external %s)", n.Proto, n.RemoteName, n.Port, n.Addr)
			}
			return fmt.Sprintf("%s (external %s)", n.RemoteName, n.Addr)
		}
		if n.Port != 0 {
			return fmt.Sprintf("%s %s (external)", n.Proto, endpoint(n.Addr, n.Port))
		}
		if n.Proto != "" { // a fold of further servers: "udp _other (external)"
			return fmt.Sprintf("%s %s (external)", n.Proto, n.Addr)
		}
		return n.Addr + " (external)"
	case KindService:
		proc := n.Process
		if proc == "" {
			proc = "?"
		}
		proc += Who(n.Identity)
		if n.Proto == "unix" {
			return fmt.Sprintf("unix %s %s on %s", n.Addr, proc, n.Host)
		}
		return fmt.Sprintf("%s %s %s on %s", n.Proto, endpoint(n.Addr, n.Port), proc, n.Host)
	default:
		proc := n.Process
		if proc == "" {
			proc = "?"
		}
		proc += Who(n.Identity)
		if n.Addr != "" {
			return fmt.Sprintf("%s on %s (%s)", proc, n.Host, n.Addr)
		}
		return fmt.Sprintf("%s on %s", proc, n.Host)
	}
}

// Who is how a label names a process's identity, after the process:
// " [Deployment/checkout checkout-7d4b9-x2x4k:app]", " [web-1]",
// " [nginx.service]"; "" for a plain host process.
func Who(id tracer.Identity) string {
	name := id.Label()
	switch {
	case id.Workload != "" && name != "" && name != id.Workload:
		return " [" + id.Workload + " " + name + "]"
	case id.Workload != "":
		return " [" + id.Workload + "]"
	case name != "":
		return " [" + name + "]"
	}
	return ""
}

func endpoint(addr string, port uint16) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return addr + ":" + strconv.Itoa(int(port))
	}
	return netip.AddrPortFrom(a, port).String()
}

// volume is how much an edge carried: connections for connection
// protocols, datagrams (sent/received by the client) for UDP, which has no
// connections.
func volume(e Edge) string {
	if e.Proto == "udp" {
		return fmt.Sprintf("dgrams=%d/%d", e.DatagramsSent, e.DatagramsReceived)
	}
	s := fmt.Sprintf("conns=%d failed=%d", e.Connections, e.FailedConnections)
	if e.DatagramsSent+e.DatagramsReceived > 0 { // unix datagram sockets
		s += fmt.Sprintf(" dgrams=%d/%d", e.DatagramsSent, e.DatagramsReceived)
	}
	return s
}

// edgeService names the service end of an edge: proto/port, or the socket
// path for unix.
func edgeService(e Edge, to Node) string {
	if e.Proto == "unix" {
		if len(e.Addrs) > 0 {
			return "unix " + strings.Join(e.Addrs, ", ")
		}
		if to.Kind == KindWorkload || to.Kind == KindHost {
			for _, sv := range to.Services {
				if sv.Proto == "unix" {
					return "unix " + sv.Addr
				}
			}
			return "unix"
		}
		return "unix " + to.Addr
	}
	return fmt.Sprintf("%s/%d", e.Proto, e.Port)
}

// serverLabel is an edge's server end as look's outbound lines and diff
// name it: the service the edge enters, then the workload behind it
// ("tcp/5432 postgres on db (198.51.100.3)", "unix /run/app.sock gunicorn
// on web"), so that edges between the same two workloads read apart; a
// service or external node's own label names its protocol and port.
func serverLabel(e Edge, to Node) string {
	if to.Kind == KindWorkload || to.Kind == KindHost {
		return edgeService(e, to) + " " + Label(to)
	}
	return Label(to)
}

// shortVolume labels an edge in a picture.
func edgeProto(e Edge) string {
	if e.Proto == "unix" {
		return "unix"
	}
	return fmt.Sprintf("%s/%d", e.Proto, e.Port)
}

func shortVolume(e Edge) string {
	dgrams := e.DatagramsSent + e.DatagramsReceived
	switch {
	case e.Proto == "udp" || (dgrams > 0 && e.Connections == 0):
		return fmt.Sprintf("%d datagrams", dgrams)
	case dgrams > 0: // a unix workload's stream and datagram sockets
		return fmt.Sprintf("%d conns, %d datagrams", e.Connections, dgrams)
	}
	return fmt.Sprintf("%d conns", e.Connections)
}

func counters(e Edge) string {
	var sb strings.Builder
	sb.WriteString(volume(e))
	c := e.Counters
	if c.FailedConnections > 0 {
		var causes []string
		for _, x := range []struct {
			n    uint64
			name string
		}{{c.FailedRefused, "refused"}, {c.FailedTimeout, "timeout"}, {c.FailedReset, "reset"}, {c.FailedUnreachable, "unreachable"}} {
			if x.n > 0 {
				causes = append(causes, fmt.Sprintf("%s=%d", x.name, x.n))
			}
		}
		if len(causes) > 0 {
			sb.WriteString(" (" + strings.Join(causes, " ") + ")")
		}
	}
	fmt.Fprintf(&sb, " sent=%d recv=%d", e.BytesSent, e.BytesReceived)
	if c.ConnectLatencyCount > 0 {
		fmt.Fprintf(&sb, " connect=%s/%s", us(e.ConnectLatencyAvgUs), us(c.ConnectLatencyMaxUs))
	}
	if c.ResetsSent+c.ResetsReceived > 0 {
		fmt.Fprintf(&sb, " resets=%d/%d", c.ResetsSent, c.ResetsReceived)
	}
	if c.Retransmits > 0 {
		fmt.Fprintf(&sb, " retrans=%d", c.Retransmits)
	}
	if c.RTTSamples > 0 {
		fmt.Fprintf(&sb, " rtt=%s/%s", us(c.RTTAvgUs()), us(c.RTTMaxUs))
	}
	fmt.Fprintf(&sb, " last=%s", e.LastSeen.Local().Format(time.DateTime))
	return sb.String()
}

// us prints a latency in microseconds the way people read it.
// us writes microseconds to three significant digits: 23µs, 1.23ms, 2.35s.
func us(v uint64) string {
	unit := uint64(1)
	for v/unit >= 1000 {
		unit *= 10
	}
	return time.Duration((v + unit/2) / unit * unit * uint64(time.Microsecond)).String()
}

// nodeHealth is what look adds after a service's label: its accept queue
// and whether it drops.
func nodeHealth(n Node) string {
	if len(n.Services) > 0 {
		var parts, asked []string
		for _, sv := range n.Services {
			if sv.Unanswered {
				asked = append(asked, sv.String())
			} else {
				parts = append(parts, serviceHealth(sv))
			}
		}
		var s string
		if len(parts) > 0 {
			s = "  [serves " + strings.Join(parts, ", ") + "]"
		}
		if len(asked) > 0 {
			s += "  [nothing answers " + strings.Join(asked, ", ") + "]"
		}
		return s
	}
	if n.Unanswered {
		return "  [NOT ANSWERING]"
	}
	if n.Listener == nil {
		return ""
	}
	s := fmt.Sprintf("  [listen backlog=%d queue_max=%d drops=%d", n.Listener.BacklogLimit, n.Listener.QueueMax, n.Listener.Drops)
	if n.Unhealthy {
		s += " DROPPING"
	} else if n.Health == HealthDegraded {
		s += " DEGRADED"
	}
	return s + "]"
}

// serviceHealth is one service of a workload as look lists it:
// "tcp/5432 backlog=128 queue_max=128 drops=15 DROPPING".
func serviceHealth(sv Service) string {
	s := sv.String()
	if l := sv.Listener; l != nil {
		s += fmt.Sprintf(" backlog=%d queue_max=%d drops=%d", l.BacklogLimit, l.QueueMax, l.Drops)
	}
	if sv.Unhealthy {
		s += " DROPPING"
	} else if sv.Health == HealthDegraded {
		s += " DEGRADED"
	}
	return s
}

// viaHealth is the service of workload n that edge e enters, as look's
// inbound lines show it after "via".
func viaHealth(e Edge, n Node) string {
	for _, sv := range n.Services {
		if sv.Proto == e.Proto && sv.Port == e.Port && (e.Proto != "unix" || len(n.Services) == 1 || sv.Addr != "") {
			if sv.Listener == nil {
				return nodeHealth(Node{Unanswered: sv.Unanswered})
			}
			return nodeHealth(Node{Listener: sv.Listener, Unhealthy: sv.Unhealthy, Health: sv.Health})
		}
	}
	return nodeHealth(n)
}

// edgeMark is UNHEALTHY or DEGRADED after an edge's peer, as the page
// colours it (red, orange dashed).
func edgeMark(e Edge) string {
	if e.Unhealthy {
		return "  UNHEALTHY"
	}
	if e.Health == HealthDegraded {
		return "  DEGRADED"
	}
	return ""
}

// edgeWhy ends the line of an unhealthy or degraded edge with the rules
// that fired, with their numbers, so that grepping for UNHEALTHY gives the
// reason too: "  why: 4 of 4 connection attempts failed (100.0 %): 4 refused".
func edgeWhy(e Edge) string {
	if edgeMark(e) == "" || len(e.Reasons) == 0 {
		return ""
	}
	return "  why: " + strings.Join(e.Reasons, "; ")
}

// WriteTrees renders look's trees the way operators read ss output: one
// edge per line, counters at the end, children indented under their parent.
func WriteTrees(w io.Writer, trees []Tree, outbound, inbound bool) {
	for i, t := range trees {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, Label(t.Root)+nodeHealth(t.Root)+dnsMark(t.Root))
		writeDNS(w, t.Root)
		if outbound {
			fmt.Fprintln(w, "  depends on (outbound):")
			writeBranches(w, t.Outbound, "    ", true)
		}
		if inbound {
			fmt.Fprintln(w, "  depended on by (inbound):")
			writeBranches(w, t.Inbound, "    ", false)
		}
	}
}

// writeDNS lists a client's lookups per resolver under its label:
// "127.0.0.53:53/udp queries=20 nxdomain=2 servfail=0 other=0
// timeouts=2 latency=100µs/5ms UNHEALTHY: ...".
func writeDNS(w io.Writer, n Node) {
	if len(n.DNS) == 0 {
		return
	}
	fmt.Fprintln(w, "  DNS lookups (per resolver):")
	for _, d := range n.DNS {
		fmt.Fprintf(w, "    %s/%s queries=%d answers=%d nxdomain=%d servfail=%d other=%d timeouts=%d", d.Resolver, d.Proto,
			d.Queries, d.Answers, d.NXDomain, d.ServFail, d.OtherErrors, d.Timeouts)
		if d.LatencyCount > 0 {
			fmt.Fprintf(w, " latency=%s/%s", us(d.LatencySumUs/d.LatencyCount), us(d.LatencyMaxUs))
		}
		if d.Unparsed > 0 {
			fmt.Fprintf(w, " unparsed=%d", d.Unparsed)
		}
		switch d.Health {
		case HealthUnhealthy:
			fmt.Fprint(w, "  UNHEALTHY")
		case HealthDegraded:
			fmt.Fprint(w, "  DEGRADED")
		}
		if len(d.Reasons) > 0 {
			fmt.Fprint(w, ": "+strings.Join(d.Reasons, "; "))
		}
		fmt.Fprintln(w)
	}
}

func writeBranches(w io.Writer, bs []*Branch, indent string, outbound bool) {
	if len(bs) == 0 {
		fmt.Fprintln(w, indent+"(none)")
		return
	}
	for i, b := range bs {
		branch, next := "├─ ", "│  "
		if i == len(bs)-1 {
			branch, next = "└─ ", "   "
		}
		arrow, peer, via := "-> ", serverLabel(b.Edge, b.Peer), ""
		peerHealth := nodeHealth(b.Peer)
		if !outbound {
			h := nodeHealth(b.Via)
			if b.Via.Kind == KindWorkload || b.Via.Kind == KindHost {
				h = viaHealth(b.Edge, b.Via)
			}
			arrow, peer, via = "<- ", Label(b.Peer), "  via "+edgeService(b.Edge, b.Via)+h
		} else if b.Peer.Kind == KindWorkload || b.Peer.Kind == KindHost {
			peerHealth = viaHealth(b.Edge, b.Peer)
		}
		if len(b.Peer.Services) > 0 && !outbound {
			peerHealth = ""
		}
		repeat := ""
		if b.Repeat {
			repeat = "  (shown above)"
		}
		fmt.Fprintf(w, "%s%s%s%s%s%s%s  %s%s%s\n", indent, branch, arrow, peer, peerHealth+dnsMark(b.Peer), via, edgeMark(b.Edge), counters(b.Edge), edgeWhy(b.Edge), repeat)
		writeChildren(w, b.Children, indent+next, outbound)
	}
}

func writeChildren(w io.Writer, bs []*Branch, indent string, outbound bool) {
	if len(bs) == 0 {
		return
	}
	writeBranches(w, bs, indent, outbound)
}

// WriteDiff renders appeared and disappeared edges, one per line, each
// naming its server end as look does: "+ nginx on web (198.51.100.2) ->
// tcp/5432 postgres on db (198.51.100.3)  conns=…".
func WriteDiff(w io.Writer, g Graph, appeared, disappeared []Edge, before Graph) {
	nodes := map[string]Node{}
	for _, n := range before.Nodes {
		nodes[n.ID] = n
	}
	for _, n := range g.Nodes {
		nodes[n.ID] = n
	}
	for _, e := range appeared {
		fmt.Fprintf(w, "+ %s -> %s%s  %s\n", Label(nodes[e.From]), serverLabel(e, nodes[e.To]), edgeMark(e), counters(e))
	}
	for _, e := range disappeared {
		fmt.Fprintf(w, "- %s -> %s%s  %s\n", Label(nodes[e.From]), serverLabel(e, nodes[e.To]), edgeMark(e), counters(e))
	}
	if len(appeared)+len(disappeared) == 0 {
		fmt.Fprintln(w, "no edge appeared or disappeared")
	}
}

// pictureLabel is a node's label in DOT and Mermaid: a workload's
// services on a second line ("listens tcp/5432, unix /run/a.sock").
func pictureLabel(n Node, br string) string {
	l := Label(n)
	if len(n.Services) > 0 {
		// A service nothing answered is not one the workload listens on.
		var ss, asked []string
		for _, sv := range n.Services {
			if sv.Unanswered {
				asked = append(asked, sv.String())
			} else {
				ss = append(ss, sv.String())
			}
		}
		if len(ss) > 0 {
			l += br + "listens " + strings.Join(ss, ", ")
		}
		if len(asked) > 0 {
			l += br + "nothing answers " + strings.Join(asked, ", ")
		}
	}
	// As JudgeDNS sees lookups: NXDOMAIN beside answers is a search list
	// at work, not a failure; NXDOMAIN with no answer at all is told apart.
	var q, failed, unresolved uint64
	for _, d := range n.DNS {
		q += d.Queries
		failed += d.ServFail + d.OtherErrors + d.Timeouts
		if d.NoError == 0 {
			unresolved += d.NXDomain
		}
	}
	var dns []string
	if failed > 0 {
		dns = append(dns, fmt.Sprintf("%d of %d lookups failed", failed, q))
	}
	if unresolved > 0 {
		dns = append(dns, fmt.Sprintf("%d NXDOMAIN and no address", unresolved))
	}
	if len(dns) > 0 {
		l += br + "DNS: " + strings.Join(dns, ", ")
	}
	return l
}

func dotQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func writeDOT(w io.Writer, g Graph) error {
	var sb strings.Builder
	sb.WriteString("digraph deptrace {\n  rankdir=LR;\n  node [fontname=\"sans-serif\"];\n")
	for _, n := range g.Nodes {
		shape := "box"
		switch n.Kind {
		case KindService:
			shape = "ellipse"
		case KindExternal:
			shape = "diamond"
		}
		extra := ""
		if n.Unhealthy {
			extra = " color=red"
		} else if n.Health == HealthDegraded {
			extra = " color=orange style=dashed"
		}
		fmt.Fprintf(&sb, "  %s [label=%s shape=%s%s];\n", dotQuote(n.ID), strings.ReplaceAll(dotQuote(pictureLabel(n, "\x00")), "\x00", `\n`), shape, extra)
	}
	for _, e := range g.Edges {
		extra := ""
		if e.Unhealthy {
			extra = " color=red"
		} else if e.Health == HealthDegraded {
			extra = " color=orange style=dashed"
		}
		fmt.Fprintf(&sb, "  %s -> %s [label=%s%s];\n", dotQuote(e.From), dotQuote(e.To),
			dotQuote(edgeProto(e)+" "+shortVolume(e)), extra)
	}
	sb.WriteString("}\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

func writeMermaid(w io.Writer, g Graph) error {
	ids := map[string]string{}
	for i, n := range g.Nodes {
		ids[n.ID] = "n" + strconv.Itoa(i)
	}
	esc := func(s string) string { return strings.NewReplacer(`"`, "#quot;").Replace(s) }
	var sb strings.Builder
	sb.WriteString("flowchart LR\n")
	for _, n := range g.Nodes {
		open, close := "[", "]"
		switch n.Kind {
		case KindService:
			open, close = "([", "])"
		case KindExternal:
			open, close = "{{", "}}"
		}
		fmt.Fprintf(&sb, "  %s%s\"%s\"%s\n", ids[n.ID], open, esc(pictureLabel(n, "<br/>")), close)
	}
	var bad, degraded []string
	for i, e := range g.Edges {
		fmt.Fprintf(&sb, "  %s -->|\"%s %s\"| %s\n", ids[e.From], esc(edgeProto(e)), shortVolume(e), ids[e.To])
		if e.Unhealthy {
			bad = append(bad, strconv.Itoa(i))
		} else if e.Health == HealthDegraded {
			degraded = append(degraded, strconv.Itoa(i))
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(&sb, "  linkStyle %s stroke:red\n", strings.Join(bad, ","))
	}
	if len(degraded) > 0 {
		fmt.Fprintf(&sb, "  linkStyle %s stroke:orange,stroke-dasharray:5 5\n", strings.Join(degraded, ","))
	}
	var badNodes, degradedNodes []string
	for _, n := range g.Nodes {
		if n.Unhealthy {
			badNodes = append(badNodes, ids[n.ID])
		} else if n.Health == HealthDegraded {
			degradedNodes = append(degradedNodes, ids[n.ID])
		}
	}
	if len(badNodes) > 0 {
		fmt.Fprintf(&sb, "  classDef unhealthy stroke:red\n  class %s unhealthy\n", strings.Join(badNodes, ","))
	}
	if len(degradedNodes) > 0 {
		fmt.Fprintf(&sb, "  classDef degraded stroke:orange,stroke-dasharray:5 5\n  class %s degraded\n", strings.Join(degradedNodes, ","))
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
