package output

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// DNSWriter prints one interval's DNS records (tracer.DNS: each client's
// lookups per resolver).
type DNSWriter interface {
	WriteDNS(recs []tracer.DNS) error
}

// NewDNS returns the DNS writer for format (as New accepts it).
func NewDNS(format string, w io.Writer, netnsNames NetnsNames, interval time.Duration) (DNSWriter, error) {
	switch format {
	case "table":
		return &DNSTable{w: w, names: netnsNames, clock: Clock(interval)}, nil
	case "jsonl":
		return &DNSJSONL{w: w}, nil
	}
	return nil, fmt.Errorf("invalid --output %q: allowed %s", format, strings.Join(Formats, ", "))
}

// NamedPeer is a flow's peer cell in the table: the name the client asked
// for, with the address it got, when the DNS watcher named the flow
// ("api.example.com:443 (203.0.113.7)"); peer unchanged otherwise.
func NamedPeer(f tracer.Flow, peer string) string {
	if f.RemoteName == "" || f.Direction != tracer.Outbound || f.IsUnix() {
		return peer
	}
	return f.RemoteName + ":" + strconv.Itoa(int(f.Port)) + " (" + f.RemoteAddr + ")"
}

// DNSTable prints DNS records as a table of their own, under its own
// header, after the interval's flows:
//
//	TIME      DNS  CLIENT    RESOLVER        QUERIES  ANSWERS  NXDOMAIN  SERVFAIL  OTHER  TIMEOUTS  LATENCY  MAX     HEALTH  NETNS
//	12:00:01  udp  curl/812  127.0.0.53:53   4        4        0         0         0      0         310us    1200us  ok      host
type DNSTable struct {
	w     io.Writer
	names NetnsNames
	clock string // the TIME column's layout (Clock)
	cols  columns
}

// DNSHeader is the first line of the DNS table.
var DNSHeader = []string{"TIME", "DNS", "CLIENT", "RESOLVER", "QUERIES", "ANSWERS", "NXDOMAIN", "SERVFAIL", "OTHER", "TIMEOUTS", "LATENCY", "MAX", "HEALTH", "NETNS"}

// WriteDNS prints recs, sorted; nothing when there are none.
func (t *DNSTable) WriteDNS(recs []tracer.DNS) error {
	if len(recs) == 0 {
		return nil
	}
	var rows [][]string
	names := t.names.read()
	for _, d := range SortedDNS(recs) {
		rows = append(rows, stamped(DNSRow(d, names), d.Time, t.clock))
	}
	_, err := io.WriteString(t.w, t.cols.render(DNSHeader, rows))
	return err
}

// DNSRow renders one DNS record as table cells, its time to the second.
func DNSRow(d tracer.DNS, names map[uint32]string) []string {
	client := Process(tracer.Flow{PID: d.PID, Comm: d.Comm, Identity: d.Identity})
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	lat, maxLat := "-", "-"
	if d.LatencyCount > 0 {
		lat, maxLat = usText(d.LatencySumUs/d.LatencyCount), usText(d.LatencyMaxUs)
	}
	return []string{
		d.Time.Format("15:04:05"), string(d.Proto), client, d.Resolver,
		u(d.Queries), u(d.Answers), u(d.NXDomain), u(d.ServFail), u(d.OtherErrors), u(d.Timeouts),
		lat, maxLat, DNSHealth(d.DNSCounters), netnsName(d.NetNS, names),
	}
}

func usText(us uint64) string {
	if us >= 10_000 {
		return strconv.FormatUint(us/1000, 10) + "ms"
	}
	return strconv.FormatUint(us, 10) + "us"
}

// DNSHealth is "ok", or the failures seen ("nxdomain=2,timeouts=1");
// "unparsed=N" when packets could not be read.
func DNSHealth(c tracer.DNSCounters) string {
	var parts []string
	for _, p := range []struct {
		name string
		v    uint64
	}{{"nxdomain", c.NXDomain}, {"servfail", c.ServFail}, {"other", c.OtherErrors}, {"timeouts", c.Timeouts}, {"unparsed", c.Unparsed}} {
		if p.v > 0 {
			parts = append(parts, p.name+"="+strconv.FormatUint(p.v, 10))
		}
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, ",")
}

// SortedDNS returns recs ordered by namespace, client and resolver.
func SortedDNS(recs []tracer.DNS) []tracer.DNS {
	out := slices.Clone(recs)
	slices.SortFunc(out, func(a, b tracer.DNS) int {
		return cmp.Or(cmp.Compare(a.NetNS, b.NetNS), cmp.Compare(a.Comm, b.Comm), cmp.Compare(a.PID, b.PID),
			cmp.Compare(a.CgroupID, b.CgroupID), cmp.Compare(a.Resolver, b.Resolver), cmp.Compare(a.Proto, b.Proto))
	})
	return out
}

// DNSJSONL writes one JSON object per DNS record (kind "dns") per line,
// as encoding/json writes tracer.DNS.
type DNSJSONL struct {
	w io.Writer
}

// WriteDNS writes recs, sorted.
func (j *DNSJSONL) WriteDNS(recs []tracer.DNS) error {
	var buf []byte
	for _, d := range SortedDNS(recs) {
		b, err := json.Marshal(d)
		if err != nil {
			return fmt.Errorf("jsonl: dns record %s via %s: %w", d.Comm, d.Resolver, err)
		}
		buf = append(append(buf, b...), '\n')
	}
	if len(buf) == 0 {
		return nil
	}
	_, err := j.w.Write(buf)
	return err
}

// DNSShown reports whether trace's --proto and --port filters let DNS
// records through: no --port, or port 53 among them; no --proto, or udp
// or tcp among them.
func (f Filter) DNSShown() bool {
	if len(f.Ports) > 0 && !slices.Contains(f.Ports, 53) {
		return false
	}
	return len(f.Protos) == 0 || slices.Contains(f.Protos, string(tracer.ProtoUDP)) || slices.Contains(f.Protos, string(tracer.ProtoTCP))
}
