// Package output renders bundled flows for people (table) and for programs
// (JSON lines), and filters them.
package output

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/deptrace/deptrace/tracer"
)

// Formats accepted by --output.
var Formats = []string{"table", "jsonl"}

// Writer prints one interval of flows.
type Writer interface {
	Write(flows []tracer.Flow) error
}

// New returns the writer for format, or an error naming the allowed ones.
func New(format string, w io.Writer, netnsNames map[uint32]string) (Writer, error) {
	switch format {
	case "table":
		return &Table{w: w, names: netnsNames}, nil
	case "jsonl":
		return &JSONL{enc: json.NewEncoder(w)}, nil
	}
	return nil, fmt.Errorf("invalid --output %q: allowed %s", format, strings.Join(Formats, ", "))
}

// JSONL writes one JSON object per flow per line.
type JSONL struct{ enc *json.Encoder }

func (j *JSONL) Write(flows []tracer.Flow) error {
	for _, f := range Sorted(flows) {
		if err := j.enc.Encode(f); err != nil {
			return err
		}
	}
	return nil
}

// Table is the compact, netstat-like view: the local end on the left, the
// ephemeral client port shown as "many", an arrow pointing at the server.
//
//	TIME      PROTO  LOCAL            DIR  PEER             PROCESS       CONNS  FAILED  SENT  RECV  NETNS
//	12:00:01  tcp    10.0.1.9:many    -->  10.0.1.10:3306   php/812       22     0       1840  96K   host
type Table struct {
	w      io.Writer
	names  map[uint32]string
	header bool
}

// TableHeader is the first line of table output.
var TableHeader = []string{"TIME", "PROTO", "LOCAL", "DIR", "PEER", "PROCESS", "CONNS", "FAILED", "SENT", "RECV", "NETNS"}

func (t *Table) Write(flows []tracer.Flow) error {
	if len(flows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	if !t.header {
		fmt.Fprintln(tw, strings.Join(TableHeader, "\t"))
		t.header = true
	}
	for _, f := range Sorted(flows) {
		fmt.Fprintln(tw, strings.Join(TableRow(f, t.names), "\t"))
	}
	return tw.Flush()
}

// TableRow renders one flow as table cells.
func TableRow(f tracer.Flow, names map[uint32]string) []string {
	local, peer, arrow := Endpoint(f.LocalAddr, "many"), Endpoint(f.RemoteAddr, strconv.Itoa(int(f.Port))), "-->"
	if f.Direction == tracer.Inbound {
		local, peer, arrow = Endpoint(f.LocalAddr, strconv.Itoa(int(f.Port))), Endpoint(f.RemoteAddr, "many"), "<--"
	}
	process := "-"
	if f.PID != 0 {
		process = fmt.Sprintf("%s/%d", f.Comm, f.PID)
	}
	ns := strconv.FormatUint(uint64(f.NetNS), 10)
	if name, ok := names[f.NetNS]; ok && name != "" {
		ns = name
	}
	return []string{
		f.Time.Format("15:04:05"), f.Proto, local, arrow, peer, process,
		strconv.FormatUint(f.Connections, 10), strconv.FormatUint(f.FailedConnections, 10),
		strconv.FormatUint(f.BytesSent, 10), strconv.FormatUint(f.BytesReceived, 10), ns,
	}
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
	out := slices.Clone(flows)
	slices.SortFunc(out, func(a, b tracer.Flow) int {
		return cmp.Or(
			cmp.Compare(a.NetNS, b.NetNS),
			cmp.Compare(a.Proto, b.Proto),
			cmp.Compare(a.Port, b.Port),
			cmp.Compare(a.Direction, b.Direction),
			a.LocalIP().Compare(b.LocalIP()),
			a.RemoteIP().Compare(b.RemoteIP()),
			cmp.Compare(a.LocalAddr, b.LocalAddr),
			cmp.Compare(a.RemoteAddr, b.RemoteAddr),
		)
	})
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
		case tracer.ProtoTCP, tracer.ProtoUDP:
			out = append(out, p)
		default:
			return nil, fmt.Errorf("invalid --proto %q: allowed tcp, udp, all", p)
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
	if len(fl.Protos) > 0 && !slices.Contains(fl.Protos, f.Proto) {
		return false
	}
	if len(fl.Ports) > 0 && !slices.Contains(fl.Ports, f.Port) {
		return false
	}
	return true
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
