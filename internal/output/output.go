// Package output renders bundled flows for people (table) and for programs
// (JSON lines), and filters them.
package output

import (
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/deptrace/deptrace/tracer"
)

// Formats accepted by --output.
var Formats = []string{"table", "jsonl"}

// Writer prints one interval: its flows and its listeners.
type Writer interface {
	Write(flows []tracer.Flow, listeners []tracer.Listener) error
}

// New returns the writer for format, or an error naming the allowed ones.
func New(format string, w io.Writer, netnsNames map[uint32]string) (Writer, error) {
	switch format {
	case "table":
		return &Table{w: w, names: netnsNames}, nil
	case "jsonl":
		return &JSONL{w: w}, nil
	}
	return nil, fmt.Errorf("invalid --output %q: allowed %s", format, strings.Join(Formats, ", "))
}

// Table is the compact, netstat-like view: the local end on the left, the
// ephemeral client port shown as "many", an arrow pointing at the server.
// Column widths only grow, so columns do not jump between intervals.
//
//	TIME      PROTO  LOCAL          DIR  PEER            PROCESS   CONNS  FAILED  SENT  RECV   LATENCY  HEALTH  NETNS
//	12:00:01  tcp    10.0.1.9:many  -->  10.0.1.10:3306  php/812   22     0       1840  96000  310us    ok      host
type Table struct {
	w      io.Writer
	names  map[uint32]string
	header bool
	widths []int
}

// TableHeader is the first line of table output.
var TableHeader = []string{"TIME", "PROTO", "LOCAL", "DIR", "PEER", "PROCESS", "CONNS", "FAILED", "SENT", "RECV", "LATENCY", "HEALTH", "NETNS"}

func (t *Table) Write(flows []tracer.Flow, listeners []tracer.Listener) error {
	var rows [][]string
	for _, f := range Sorted(flows) {
		rows = append(rows, TableRow(f, t.names))
	}
	for _, l := range listeners {
		if l.Drops > 0 { // a listener shows up only when it is in trouble
			rows = append(rows, ListenerRow(l, t.names))
		}
	}
	if len(rows) == 0 {
		return nil
	}
	if !t.header {
		rows = append([][]string{TableHeader}, rows...)
		t.header = true
	}
	for _, r := range rows {
		for i, c := range r {
			if i >= len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			if i == len(r)-1 {
				b.WriteString(c)
				break
			}
			fmt.Fprintf(&b, "%-*s  ", t.widths[i], c)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(t.w, b.String())
	return err
}

// TableRow renders one flow as table cells.
func TableRow(f tracer.Flow, names map[uint32]string) []string {
	local, peer, arrow := Endpoint(f.LocalAddr, "many"), Endpoint(f.RemoteAddr, strconv.Itoa(int(f.Port))), "-->"
	if f.Direction == tracer.Inbound {
		local, peer, arrow = Endpoint(f.LocalAddr, strconv.Itoa(int(f.Port))), Endpoint(f.RemoteAddr, "many"), "<--"
	}
	if f.Proto == tracer.ProtoUnix {
		// The socket path is the service; the other end is a process.
		other := "-"
		if f.PeerPID != 0 {
			other = fmt.Sprintf("%s/%d", f.PeerComm, f.PeerPID)
		}
		local, peer = "-", f.RemoteAddr+" ("+other+")"
		if f.Direction == tracer.Inbound {
			local, peer = f.LocalAddr, other
		}
	}
	peer = NamedPeer(f, peer)
	process := Process(f)
	conns := strconv.FormatUint(f.Connections, 10)
	if f.Proto == tracer.ProtoUDP || (f.Proto == tracer.ProtoUnix && f.Connections == 0 && f.DatagramsSent+f.DatagramsReceived > 0) {
		// Datagrams have no connections: count datagrams.
		conns = strconv.FormatUint(f.DatagramsSent+f.DatagramsReceived, 10) + "dg"
	}
	return []string{
		f.Time.Format("15:04:05"), string(f.Proto), local, arrow, peer, process,
		conns, strconv.FormatUint(f.FailedConnections, 10),
		strconv.FormatUint(f.BytesSent, 10), strconv.FormatUint(f.BytesReceived, 10),
		Latency(f.Counters), Health(f.Counters), netnsName(f.NetNS, names),
	}
}

// Process names the local end in the table: "comm/pid" for a host
// process, the container, pod or unit first where there is one, e.g.
// "web(nginx)/880", "checkout-7d4b9-x2x4k:app(java)/4411",
// "nginx.service(nginx)/880"; "-" when nothing is known.
func Process(f tracer.Flow) string {
	label := f.Identity.Label()
	switch {
	case f.PID != 0 && label != "":
		return fmt.Sprintf("%s(%s)/%d", label, f.Comm, f.PID)
	case f.PID != 0:
		return fmt.Sprintf("%s/%d", f.Comm, f.PID)
	case label != "":
		return label
	}
	return "-"
}

// ListenerRow renders a listener that dropped connections.
func ListenerRow(l tracer.Listener, names map[uint32]string) []string {
	process := "-"
	if l.PID != 0 {
		process = fmt.Sprintf("%s/%d", l.Comm, l.PID)
	}
	return []string{l.Time.Format("15:04:05"), string(l.Proto), Endpoint(l.LocalAddr, strconv.Itoa(int(l.Port))), "LSN", "-", process,
		"-", "-", "-", "-", "-", fmt.Sprintf("drops=%d queue=%d/%d", l.Drops, l.QueueMax, l.BacklogLimit), netnsName(l.NetNS, names)}
}

func netnsName(ino uint32, names map[uint32]string) string {
	if name, ok := names[ino]; ok && name != "" {
		return name
	}
	return strconv.FormatUint(uint64(ino), 10)
}

// Latency is the mean connect latency, or "-" when nothing connected.
func Latency(c tracer.Counters) string {
	if c.ConnectLatencyCount == 0 {
		return "-"
	}
	us := c.ConnectLatencySumUs / c.ConnectLatencyCount
	switch {
	case us >= 1_000_000:
		return fmt.Sprintf("%.1fs", float64(us)/1e6)
	case us >= 1000:
		return fmt.Sprintf("%.1fms", float64(us)/1e3)
	}
	return fmt.Sprintf("%dus", us)
}

// Health is "ok", or what went wrong: failure causes, resets sent/received,
// retransmitted segments.
func Health(c tracer.Counters) string {
	var parts []string
	for _, p := range []struct {
		name string
		n    uint64
	}{
		{"refused", c.FailedRefused}, {"timeout", c.FailedTimeout}, {"reset", c.FailedReset},
		{"unreach", c.FailedUnreachable}, {"rst_out", c.ResetsSent}, {"rst_in", c.ResetsReceived}, {"retrans", c.Retransmits},
	} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", p.name, p.n))
		}
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, ",")
}

// Endpoint formats addr:port with IPv6 in brackets; port may be a word.
func Endpoint(addr string, port string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil { // a unix socket path
		return addr
	}
	if a.Is6() && !a.Is4In6() {
		return "[" + a.String() + "]:" + port
	}
	return a.String() + ":" + port
}

// Sorted returns flows in a stable, readable order: namespace, protocol,
// server port, direction, addresses.
func Sorted(flows []tracer.Flow) []tracer.Flow {
	// Addresses are parsed once per flow, not once per comparison: with
	// thousands of flows per interval (1,000 client hosts), parsing in the
	// comparison was a tenth of the agent's CPU.
	type sortKey struct {
		local, remote netip.Addr
		f             *tracer.Flow
	}
	keys := make([]sortKey, len(flows))
	for i := range flows {
		keys[i] = sortKey{flows[i].LocalIP(), flows[i].RemoteIP(), &flows[i]}
	}
	// One comparison after another, not cmp.Or, which would make all
	// eight (string ones included) for every pair.
	slices.SortFunc(keys, func(x, y sortKey) int {
		a, b := x.f, y.f
		if c := cmp.Compare(a.NetNS, b.NetNS); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Port, b.Port); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Direction, b.Direction); c != 0 {
			return c
		}
		if c := x.local.Compare(y.local); c != 0 {
			return c
		}
		if c := x.remote.Compare(y.remote); c != 0 {
			return c
		}
		if c := cmp.Compare(a.LocalAddr, b.LocalAddr); c != 0 {
			return c
		}
		return cmp.Compare(a.RemoteAddr, b.RemoteAddr)
	})
	out := make([]tracer.Flow, len(flows))
	for i, k := range keys {
		out[i] = *k.f
	}
	return out
}

// Filter keeps flows of the given protocols and server ports; empty
// fields keep everything.
type Filter struct {
	Protos []string
	Ports  []uint16
}

// ParseProtos validates a --proto value: a comma list of tcp, udp, or all.
func ParseProtos(v string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(v, ",") {
		switch p = strings.ToLower(strings.TrimSpace(p)); p {
		case "", "all":
			return nil, nil
		case string(tracer.ProtoTCP), string(tracer.ProtoUDP), string(tracer.ProtoUnix):
			out = append(out, p)
		default:
			return nil, fmt.Errorf("invalid --proto %q: allowed tcp, udp, unix, all", p)
		}
	}
	return out, nil
}

// ParsePorts validates a --port value: a comma list of ports 1-65535.
func ParsePorts(vals []string) ([]uint16, error) {
	var out []uint16
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("invalid --port %q: allowed 1 to 65535", p)
			}
			out = append(out, uint16(n))
		}
	}
	return out, nil
}

// Match reports whether f passes the filter.
func (fl Filter) Match(f tracer.Flow) bool {
	if len(fl.Protos) > 0 && !slices.Contains(fl.Protos, string(f.Proto)) {
		return false
	}
	if len(fl.Ports) > 0 && !slices.Contains(fl.Ports, f.Port) {
		return false
	}
	return true
}

// MatchListener reports whether l passes the filter.
func (fl Filter) MatchListener(l tracer.Listener) bool {
	return (len(fl.Protos) == 0 || slices.Contains(fl.Protos, string(l.Proto))) && (len(fl.Ports) == 0 || slices.Contains(fl.Ports, l.Port))
}

// ApplyListeners returns the listeners that match.
func (fl Filter) ApplyListeners(ls []tracer.Listener) []tracer.Listener {
	var out []tracer.Listener
	for _, l := range ls {
		if fl.MatchListener(l) {
			out = append(out, l)
		}
	}
	return out
}

// Apply returns the flows that match.
func (fl Filter) Apply(flows []tracer.Flow) []tracer.Flow {
	if len(fl.Protos) == 0 && len(fl.Ports) == 0 {
		return flows
	}
	out := flows[:0:0]
	for _, f := range flows {
		if fl.Match(f) {
			out = append(out, f)
		}
	}
	return out
}
