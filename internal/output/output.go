// Package output renders bundled flows for people (table) and for programs
// (JSON lines), and filters them.
package output

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// Formats accepted by --output.
var Formats = []string{"table", "jsonl"}

// Writer prints one interval: its flows and its listeners.
type Writer interface {
	Write(flows []tracer.Flow, listeners []tracer.Listener) error
}

// NetnsNames gives the names the NETNS column shows, by namespace inode
// (netns.DisplayNames). A table calls it once per interval, so that a
// namespace named after deptrace started shows by its name, and one
// deleted since no longer lends its name to an inode the kernel reused.
// nil: inodes only.
type NetnsNames func() map[uint32]string

func (n NetnsNames) read() map[uint32]string {
	if n == nil {
		return nil
	}
	return n()
}

// New returns the writer for format, or an error naming the allowed ones.
func New(format string, w io.Writer, netnsNames NetnsNames, interval time.Duration) (Writer, error) {
	switch format {
	case "table":
		return &Table{w: w, names: netnsNames, clock: Clock(interval)}, nil
	case "jsonl":
		return &JSONL{w: w}, nil
	}
	return nil, fmt.Errorf("invalid --output %q: allowed %s", format, strings.Join(Formats, ", "))
}

// Table is the compact, netstat-like view: the local end on the left, the
// ephemeral client port shown as "many", an arrow pointing at the server.
// Column widths only grow, so columns do not jump between intervals; the
// header is printed again when one grew.
//
//	TIME      PROTO  LOCAL          DIR  PEER            PROCESS   CONNS  FAILED  SENT  RECV   LATENCY  HEALTH  NETNS
//	12:00:01  tcp    10.0.1.9:many  -->  10.0.1.10:3306  php/812   22     0       1840  96000  310us    ok      host
type Table struct {
	w     io.Writer
	names NetnsNames
	clock string // the TIME column's layout (Clock)
	cols  columns
}

// Clock is the TIME column's layout for an interval: to the second, or to
// the millisecond when the interval is not a whole number of seconds, so
// that every interval's rows carry a time of their own.
func Clock(interval time.Duration) string {
	if interval%time.Second != 0 {
		return "15:04:05.000"
	}
	return "15:04:05"
}

// TableHeader is the first line of table output.
var TableHeader = []string{"TIME", "PROTO", "LOCAL", "DIR", "PEER", "PROCESS", "CONNS", "FAILED", "SENT", "RECV", "LATENCY", "HEALTH", "NETNS"}

func (t *Table) Write(flows []tracer.Flow, listeners []tracer.Listener) error {
	if len(flows) == 0 && !slices.ContainsFunc(listeners, troubled) {
		return nil
	}
	names := t.names.read()
	var rows [][]string
	for _, f := range Sorted(flows) {
		rows = append(rows, stamped(TableRow(*f, names), f.Time, t.clock))
	}
	for _, l := range listeners {
		if troubled(l) {
			rows = append(rows, stamped(ListenerRow(l, names), l.Time, t.clock))
		}
	}
	_, err := io.WriteString(t.w, t.cols.render(TableHeader, rows))
	return err
}

// columns lays out a table's rows in columns whose widths only grow, so
// that columns do not jump between intervals, under a header printed
// first and again whenever a column widened since (it would no longer
// stand over its column). Every header line starts with TIME: grep -v
// drops them all.
type columns struct {
	widths       []int
	headerWidths []int // the widths (the last column's aside) the header was last printed at
	printed      bool  // the header was printed once
}

func (c *columns) render(header []string, rows [][]string) string {
	for _, r := range append([][]string{header}, rows...) {
		for i, cell := range r {
			if i >= len(c.widths) {
				c.widths = append(c.widths, 0)
			}
			c.widths[i] = max(c.widths[i], len(cell))
		}
	}
	// The last column is never padded: its growth moves nothing.
	if last := len(c.widths) - 1; !c.printed || !slices.Equal(c.widths[:last], c.headerWidths) {
		rows = append([][]string{header}, rows...)
		c.headerWidths, c.printed = slices.Clone(c.widths[:last]), true
	}
	var b strings.Builder
	for _, r := range rows {
		for i, cell := range r {
			if i == len(r)-1 {
				b.WriteString(cell)
				break
			}
			fmt.Fprintf(&b, "%-*s  ", c.widths[i], cell)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// stamped sets a row's TIME cell, which the row functions give to the
// second, at a table's clock.
func stamped(row []string, at time.Time, clock string) []string {
	row[0] = at.Format(clock)
	return row
}

// troubled: a listener shows up in the table only when it dropped
// connections.
func troubled(l tracer.Listener) bool { return l.Drops > 0 }

// TableRow renders one flow as table cells, its time to the second.
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
// server port, direction, addresses. It points into flows, which it
// leaves as they are: with thousands of flows per interval (1,000 client
// hosts), copying each flow (over 500 bytes) into a sorted slice, and
// from it, was a tenth of a jsonl consumer's CPU.
func Sorted(flows []tracer.Flow) []*tracer.Flow {
	// Each flow's sort fields go into a key without pointers, addresses
	// parsed once: a comparison then reads two keys side by side, not two
	// flows scattered in memory (parsing in the comparison was a tenth of
	// the agent's CPU).
	keys := make([]sortKey, len(flows))
	order := make([]int32, len(flows))
	for i := range flows {
		f := &flows[i]
		keys[i] = sortKey{
			head: uint64(f.NetNS)<<32 | rankOf(string(f.Proto), protoOrder)<<24 | uint64(f.Port)<<8 | rankOf(string(f.Direction), dirOrder),
		}
		keys[i].local.set(f.LocalAddr)
		keys[i].remote.set(f.RemoteAddr)
		order[i] = int32(i)
	}
	// The sort moves indices, not keys: a key is 72 bytes, and pdqsort
	// swaps and passes by value what it sorts.
	slices.SortFunc(order, func(i, j int32) int {
		x, y := &keys[i], &keys[j]
		a, b := &flows[i], &flows[j]
		if x.head != y.head {
			if x.head>>24 == y.head>>24 && x.head>>24&0xff == unknownRank {
				// One namespace, two protocols the tracer never writes:
				// their text before the port.
				if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
					return c
				}
			}
			return cmp.Compare(x.head, y.head)
		}
		if x.head>>24&0xff == unknownRank {
			if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
				return c
			}
		}
		if x.head&0xff == unknownRank {
			if c := cmp.Compare(a.Direction, b.Direction); c != 0 {
				return c
			}
		}
		if c := x.local.compare(&y.local); c != 0 {
			return c
		}
		if x.local.zoned || y.local.zoned {
			if c := cmp.Compare(zoneOf(a.LocalAddr), zoneOf(b.LocalAddr)); c != 0 {
				return c
			}
		}
		if c := x.remote.compare(&y.remote); c != 0 {
			return c
		}
		if x.remote.zoned || y.remote.zoned {
			if c := cmp.Compare(zoneOf(a.RemoteAddr), zoneOf(b.RemoteAddr)); c != 0 {
				return c
			}
		}
		// Unix paths.
		if c := cmp.Compare(a.LocalAddr, b.LocalAddr); c != 0 {
			return c
		}
		return cmp.Compare(a.RemoteAddr, b.RemoteAddr)
	})
	out := make([]*tracer.Flow, len(flows))
	for i, k := range order {
		out[i] = &flows[k]
	}
	return out
}

// sortKey is a flow's place in Sorted's order. head holds, from the top:
// namespace, protocol rank, server port, direction rank.
type sortKey struct {
	head          uint64
	local, remote addrKey
}

// The protocols and directions the tracer writes, in string order;
// anything else ranks after them, by its text.
var (
	protoOrder = []string{string(tracer.ProtoTCP), string(tracer.ProtoUDP), string(tracer.ProtoUnix)}
	dirOrder   = []string{string(tracer.Inbound), string(tracer.Outbound)}
)

const unknownRank = 0xff

func rankOf(v string, order []string) uint64 {
	if i := slices.Index(order, v); i >= 0 {
		return uint64(i)
	}
	return unknownRank
}

// addrKey orders addresses as netip.Addr.Compare does, but for zones,
// which Sorted compares from the text (zoneOf): invalid (a unix path),
// then IPv4, then IPv6, each by value.
type addrKey struct {
	bits   uint64 // 0, 32 or 128
	hi, lo uint64
	zoned  bool
}

func (k *addrKey) set(addr string) {
	a, _ := netip.ParseAddr(addr) // the zero Addr for a unix path
	b := a.As16()
	k.bits, k.hi, k.lo, k.zoned = uint64(a.BitLen()), binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]), a.Zone() != ""
}

// zoneOf is the zone of an IPv6 address's text, as netip.ParseAddr
// reads it: everything after the first '%'.
func zoneOf(addr string) string {
	_, zone, _ := strings.Cut(addr, "%")
	return zone
}

func (k *addrKey) compare(y *addrKey) int {
	switch {
	case k.bits != y.bits:
		return cmp.Compare(k.bits, y.bits)
	case k.hi != y.hi:
		return cmp.Compare(k.hi, y.hi)
	}
	return cmp.Compare(k.lo, y.lo)
}

// Filter keeps flows of the given protocols and server ports; empty
// fields keep everything.
type Filter struct {
	Protos []string
	Ports  []uint16
}

// ParseProtos validates a --proto value: a comma list of tcp, udp, or all.
func ParseProtos(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil // unset: all
	}
	var out []string
	for _, p := range strings.Split(v, ",") {
		switch p = strings.ToLower(strings.TrimSpace(p)); p {
		case "":
			// "tcp," is a typo, not a request for every protocol.
			return nil, fmt.Errorf("invalid --proto %q: an empty name in the list; allowed tcp, udp, unix, all", v)
		case "all":
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
	if len(vals) == 1 && strings.TrimSpace(vals[0]) == "" {
		return nil, nil // unset (an empty environment variable)
	}
	var out []uint16
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				// The flag splits "80,,443" into 80, "" and 443.
				return nil, fmt.Errorf("invalid --port %q: an empty port in the list; allowed ports 1 to 65535, comma-separated", strings.Join(vals, ","))
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
