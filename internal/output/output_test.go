package output

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

func flow(dir tracer.Direction, proto tracer.Proto, local, remote string, port uint16) tracer.Flow {
	return tracer.Flow{
		Kind: tracer.KindFlow, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), NetNS: 4026531840,
		Proto: proto, Direction: dir,
		LocalAddr: local, RemoteAddr: remote, Port: port,
		PID: 812, Comm: "php-fpm",
		Counters: tracer.Counters{Connections: 22, FailedConnections: 1, BytesSent: 1840, BytesReceived: 96000},
	}
}

func TestTableRowArrowsPointAtTheServer(t *testing.T) {
	out := TableRow(flow(tracer.Outbound, "tcp", "10.0.1.9", "10.0.1.10", 3306), nil)
	want := []string{"03:04:05", "tcp", "10.0.1.9:many", "-->", "10.0.1.10:3306", "php-fpm/812", "22", "1", "1840", "96000", "-", "ok", "4026531840"}
	if !slices.Equal(out, want) {
		t.Errorf("outbound row %q, want %q", out, want)
	}
	in := TableRow(flow(tracer.Inbound, "tcp", "10.0.1.9", "10.0.2.13", 80), map[uint32]string{4026531840: "web"})
	if in[2] != "10.0.1.9:80" || in[3] != "<--" || in[4] != "10.0.2.13:many" || in[12] != "web" {
		t.Errorf("inbound row %q", in)
	}
	v6 := TableRow(flow(tracer.Outbound, "udp", "2001:db8::1", "2001:db8::2", 53), nil)
	if v6[2] != "[2001:db8::1]:many" || v6[4] != "[2001:db8::2]:53" {
		t.Errorf("ipv6 row %q", v6)
	}
	anon := flow(tracer.Inbound, "tcp", "10.0.0.1", "10.0.0.2", 22)
	anon.PID, anon.Comm = 0, ""
	if got := TableRow(anon, nil)[5]; got != "-" {
		t.Errorf("unknown process shown as %q, want -", got)
	}
}

func TestTablePrintsHeaderOnceAndSkipsEmptyIntervals(t *testing.T) {
	var buf bytes.Buffer
	w, err := New("table", &buf, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, w, []tracer.Flow{flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)}, nil)
	mustWrite(t, w, nil, nil)
	mustWrite(t, w, []tracer.Flow{flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)}, nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") || strings.HasPrefix(lines[2], "TIME") {
		t.Errorf("table output:\n%s", buf.String())
	}
}

// The NETNS column takes the names as they are at each interval: a
// namespace named after the table started shows by its name, and a name
// removed since is no longer shown. An interval that prints nothing reads
// no names.
func TestTableReadsNamespaceNamesEachInterval(t *testing.T) {
	f := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)
	named := []map[uint32]string{{}, {f.NetNS: "web"}, {}}
	reads := 0
	var buf bytes.Buffer
	w, err := New("table", &buf, func() map[uint32]string { reads++; return named[min(reads, len(named))-1] }, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range named {
		mustWrite(t, w, []tracer.Flow{f}, nil)
		mustWrite(t, w, nil, nil)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 || reads != 3 {
		t.Fatalf("%d name reads, table:\n%s", reads, buf.String())
	}
	ino := strconv.FormatUint(uint64(f.NetNS), 10)
	for i, want := range []string{ino, "web", ino} {
		if fields := strings.Fields(lines[i+1]); fields[len(fields)-1] != want {
			t.Errorf("interval %d: NETNS %q, want %q:\n%s", i+1, fields[len(fields)-1], want, buf.String())
		}
	}
}

// Columns never jump back: a wide row in one interval keeps the widths
// for the next, narrower one.
func TestTableWidthsOnlyGrow(t *testing.T) {
	var buf bytes.Buffer
	w, _ := New("table", &buf, nil, time.Second)
	wide := flow(tracer.Outbound, "tcp", "2001:db8::1234:5678", "2001:db8::9abc:def0", 5432)
	mustWrite(t, w, []tracer.Flow{wide}, nil)
	mustWrite(t, w, []tracer.Flow{flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)}, nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	col := func(line string) int { return strings.Index(line, "php-fpm") }
	if len(lines) != 3 || col(lines[1]) != col(lines[2]) || col(lines[1]) != strings.Index(lines[0], "PROCESS") {
		t.Errorf("columns moved between intervals:\n%s", buf.String())
	}
}

// A column that widens after the header was printed gets the header
// printed again above the wider row, so every header stands over its
// columns; rows that fit print under the header there is.
func TestTableReprintsTheHeaderWhenAColumnWidens(t *testing.T) {
	var buf bytes.Buffer
	long := map[uint32]string{}
	w, _ := New("table", &buf, func() map[uint32]string { return long }, time.Second)
	ok := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)
	bad := ok
	bad.Counters.FailedRefused, bad.Counters.FailedTimeout = 3, 2
	mustWrite(t, w, []tracer.Flow{ok}, nil)
	mustWrite(t, w, []tracer.Flow{bad}, nil) // HEALTH "refused=3,timeout=2": wider
	mustWrite(t, w, []tracer.Flow{ok}, nil)
	// The last column (NETNS) is not padded: its growth moves nothing.
	long[ok.NetNS] = "a-namespace-name-longer-than-its-inode"
	mustWrite(t, w, []tracer.Flow{ok}, nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "TIME") || !strings.HasPrefix(lines[2], "TIME") {
		t.Fatalf("want header, row, header, row, row, row:\n%s", buf.String())
	}
	for _, i := range []int{3, 4} {
		if strings.Index(lines[i], "4026531840") != strings.Index(lines[2], "NETNS") {
			t.Errorf("row %d's NETNS is not under the header's:\n%s", i, buf.String())
		}
	}
}

func TestUDPShowsDatagramsAndHealthShowsTrouble(t *testing.T) {
	u := flow(tracer.Outbound, "udp", "10.0.0.1", "10.0.0.2", 53)
	u.Counters = tracer.Counters{DatagramsSent: 3, DatagramsReceived: 3}
	if got := TableRow(u, nil)[6]; got != "6dg" {
		t.Errorf("udp conns column %q, want 6dg", got)
	}
	c := tracer.Counters{FailedRefused: 2, ResetsReceived: 1, ConnectLatencyCount: 2, ConnectLatencySumUs: 3000}
	if h, l := Health(c), Latency(c); h != "refused=2,rst_in=1" || l != "1.5ms" {
		t.Errorf("health %q latency %q", h, l)
	}
	var buf bytes.Buffer
	w, _ := New("table", &buf, nil, time.Second)
	mustWrite(t, w, nil, []tracer.Listener{{Proto: "tcp", LocalAddr: "10.0.0.1", Port: 80, Drops: 4, QueueMax: 1, BacklogLimit: 1}, {Proto: "tcp", LocalAddr: "10.0.0.1", Port: 81}})
	if out := buf.String(); !strings.Contains(out, "drops=4 queue=1/1") || strings.Contains(out, ":81") {
		t.Errorf("only the dropping listener should show:\n%s", out)
	}
}

func TestJSONLFieldsAreTheDocumentedOnes(t *testing.T) {
	var buf bytes.Buffer
	w, _ := New("jsonl", &buf, nil, time.Second)
	mustWrite(t, w, []tracer.Flow{
		flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432),
		flow(tracer.Inbound, "udp", "::ffff:10.0.0.3", "2001:db8::9", 53),
	}, []tracer.Listener{{Kind: tracer.KindListener, Proto: "tcp", Port: 80, BacklogLimit: 511}})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], `"kind":"listener"`) || !strings.Contains(lines[2], `"backlog_limit":511`) {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"kind", "time", "netns", "proto", "direction", "local_addr", "remote_addr", "port", "pid", "comm",
		"cgroup_id", "connections", "failed_connections", "bytes_sent", "bytes_received", "first_seen", "last_seen",
		"failed_refused", "failed_timeout", "failed_reset", "failed_unreachable", "datagrams_sent", "datagrams_received",
		"connect_latency_count", "connect_latency_sum_us", "connect_latency_max_us", "resets_sent", "resets_received", "retransmits"} {
		if _, ok := m[k]; !ok {
			t.Errorf("field %q missing from %s", k, lines[0])
		}
	}
	if m["direction"] != "outbound" || m["proto"] != "tcp" || m["local_addr"] != "10.0.0.1" || m["port"] != 5432.0 {
		t.Errorf("values: %s", lines[0])
	}
	var f tracer.Flow
	if err := json.Unmarshal([]byte(lines[1]), &f); err != nil {
		t.Fatal(err)
	}
	if f.RemoteAddr != "2001:db8::9" || f.Direction != "inbound" {
		t.Errorf("round trip: %+v", f)
	}
}

func TestNewRejectsUnknownFormat(t *testing.T) {
	_, err := New("xml", nil, nil, time.Second)
	if err == nil || !strings.Contains(err.Error(), "table, jsonl") {
		t.Errorf("error %v should name the allowed formats", err)
	}
}

func TestFilters(t *testing.T) {
	protos, err := ParseProtos("TCP")
	if err != nil || !slices.Equal(protos, []string{"tcp"}) {
		t.Fatalf("ParseProtos: %v %v", protos, err)
	}
	if p, err := ParseProtos("all"); err != nil || p != nil {
		t.Errorf("all: %v %v", p, err)
	}
	if _, err := ParseProtos("sctp"); err == nil || !strings.Contains(err.Error(), "tcp, udp, unix, all") {
		t.Errorf("sctp accepted or badly reported: %v", err)
	}
	ports, err := ParsePorts([]string{"80,443", "5432"})
	if err != nil || !slices.Equal(ports, []uint16{80, 443, 5432}) {
		t.Fatalf("ParsePorts: %v %v", ports, err)
	}
	for _, bad := range []string{"0", "65536", "http", "-1", "80,,443", "80,"} {
		if _, err := ParsePorts([]string{bad}); err == nil || !strings.Contains(err.Error(), "1 to 65535") {
			t.Errorf("port %q: %v", bad, err)
		}
	}
	if _, err := ParsePorts([]string{"80", "", "443"}); err == nil || !strings.Contains(err.Error(), `"80,,443": an empty port`) {
		t.Errorf("80,,443 as the flag splits it: %v", err)
	}
	// Unset is no filter; an empty name inside a list is a typo, never
	// "every protocol".
	if p, err := ParsePorts([]string{""}); err != nil || p != nil {
		t.Errorf("unset --port: %v %v", p, err)
	}
	if p, err := ParseProtos(""); err != nil || p != nil {
		t.Errorf("unset --proto: %v %v", p, err)
	}
	for _, bad := range []string{"tcp,", "tcp,,udp", ","} {
		if p, err := ParseProtos(bad); err == nil || !strings.Contains(err.Error(), "an empty name") {
			t.Errorf("--proto %q: %v %v", bad, p, err)
		}
	}
	fl := Filter{Protos: []string{"udp"}, Ports: []uint16{53}}
	flows := []tracer.Flow{
		flow(tracer.Outbound, "udp", "10.0.0.1", "10.0.0.2", 53),
		flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 53),
		flow(tracer.Outbound, "udp", "10.0.0.1", "10.0.0.2", 123),
	}
	if got := fl.Apply(flows); len(got) != 1 || got[0].Proto != "udp" || got[0].Port != 53 {
		t.Errorf("filter kept %+v", got)
	}
	if got := (Filter{}).Apply(flows); len(got) != 3 {
		t.Errorf("empty filter dropped flows")
	}
}

func TestSortedIsStable(t *testing.T) {
	a := flow(tracer.Outbound, "udp", "10.0.0.1", "10.0.0.2", 53)
	b := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 80)
	c := flow(tracer.Inbound, "tcp", "10.0.0.1", "10.0.0.3", 80)
	got := Sorted([]tracer.Flow{a, c, b})
	if *got[0] != c && *got[0] != b || *got[2] != a {
		t.Errorf("order: %v", []tracer.Flow{*got[0], *got[1], *got[2]})
	}
	if got[0].Direction != tracer.Inbound { // "inbound" < "outbound"
		t.Errorf("inbound should sort first at equal port: %v", got)
	}
}

func TestSortedComparesAddressesAsNumbers(t *testing.T) {
	in := []tracer.Flow{
		flow(tracer.Inbound, "tcp", "10.0.0.1", "10.0.0.10", 80),
		flow(tracer.Inbound, "tcp", "10.0.0.1", "10.0.0.9", 80),
		flow(tracer.Inbound, "tcp", "10.0.0.1", "::1", 80),
		flow(tracer.Inbound, "tcp", "10.0.0.1", "10.0.0.100", 80),
	}
	got := Sorted(in)
	var remotes []string
	for _, f := range got {
		remotes = append(remotes, f.RemoteAddr)
	}
	if want := "10.0.0.9 10.0.0.10 10.0.0.100 ::1"; strings.Join(remotes, " ") != want {
		t.Errorf("sorted remotes %q, want %q", strings.Join(remotes, " "), want)
	}
	if in[0].RemoteAddr != "10.0.0.10" || in[3].RemoteAddr != "10.0.0.100" {
		t.Errorf("Sorted reordered its input: %v", in)
	}
}

// Sorted's keys order flows exactly as comparing the flows' own fields
// does (namespace, protocol, port, direction, addresses as numbers, then
// as text), over a mix of namespaces, protocols, ports, IPv4, IPv6 with
// and without zones, and unix paths; a protocol or direction the tracer
// never writes goes after the known ones.
func TestSortedOrdersAsTheFlowsFields(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	addrs := []string{"10.0.0.1", "10.0.0.10", "10.0.0.9", "192.0.2.1", "::1", "2001:db8::1", "2001:db8::10", "fe80::1%eth0", "fe80::1%eth1",
		"fe80::01%eth1", "FE80::1%eth0", "fe80::01", "fe80::1", "::ffff:10.0.0.1", "/run/app.sock", "@abstract", ""}
	pick := func(vs []string) string { return vs[rng.IntN(len(vs))] }
	flows := make([]tracer.Flow, 3000)
	for i := range flows {
		f := flow(tracer.Direction(pick([]string{"inbound", "outbound"})), tracer.Proto(pick([]string{"tcp", "udp", "unix"})),
			pick(addrs), pick(addrs), []uint16{0, 80, 443, 8080, 65535}[rng.IntN(5)])
		f.NetNS = 4026531840 + uint32(rng.IntN(3))
		flows[i] = f
	}
	fields := func(a *tracer.Flow) string {
		return fmt.Sprint(a.NetNS, a.Proto, a.Port, a.Direction, a.LocalAddr, a.RemoteAddr)
	}
	want := make([]*tracer.Flow, len(flows))
	for i := range flows {
		want[i] = &flows[i]
	}
	slices.SortFunc(want, func(a, b *tracer.Flow) int {
		return cmp.Or(cmp.Compare(a.NetNS, b.NetNS), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Direction, b.Direction),
			a.LocalIP().Compare(b.LocalIP()), a.RemoteIP().Compare(b.RemoteIP()), cmp.Compare(a.LocalAddr, b.LocalAddr), cmp.Compare(a.RemoteAddr, b.RemoteAddr))
	})
	got := Sorted(flows)
	for i := range got {
		if fields(got[i]) != fields(want[i]) {
			t.Fatalf("flow %d: %s, want %s", i, fields(got[i]), fields(want[i]))
		}
	}
	odd := []tracer.Flow{flow("sideways", "sctp", "10.0.0.1", "10.0.0.2", 1), flow(tracer.Outbound, "sctp", "10.0.0.1", "10.0.0.2", 1),
		flow(tracer.Outbound, "dccp", "10.0.0.1", "10.0.0.2", 2), flow(tracer.Outbound, "unix", "", "/run/a", 0), flow("sideways", "tcp", "10.0.0.1", "10.0.0.2", 1),
		flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 3), flow("aside", "tcp", "10.0.0.1", "10.0.0.2", 1)}
	var order []string
	for _, f := range Sorted(odd) {
		order = append(order, fmt.Sprintf("%s/%d/%s", f.Proto, f.Port, f.Direction))
	}
	wantOdd := "tcp/1/aside tcp/1/sideways tcp/3/outbound unix/0/outbound dccp/2/outbound sctp/1/outbound sctp/1/sideways"
	if got := strings.Join(order, " "); got != wantOdd {
		t.Errorf("order with unknown protocols and directions: %s, want %s", got, wantOdd)
	}
}

// Sorting one interval of 1,000 client hosts seen from both ends:
//
//	go test -run '^$' -bench Sorted -benchmem ./internal/output
func BenchmarkSorted2000Flows(b *testing.B) {
	flows := make([]tracer.Flow, 0, 2000)
	for i := 0; i < 1000; i++ {
		client := fmt.Sprintf("127.1.%d.%d", i/250, i%250+1)
		flows = append(flows, flow(tracer.Outbound, "tcp", client, "127.0.0.1", 7000), flow(tracer.Inbound, "tcp", "127.0.0.1", client, 7000))
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(flows), func(i, j int) { flows[i], flows[j] = flows[j], flows[i] })
	b.ReportAllocs()
	for b.Loop() {
		Sorted(flows)
	}
}

func TestUnixRowsNameThePathAndBothProcesses(t *testing.T) {
	f := flow(tracer.Outbound, "unix", "", "/run/app.sock", 0)
	f.Comm, f.PID, f.PeerComm, f.PeerPID = "nginx", 880, "gunicorn", 901
	row := TableRow(f, nil)
	if row[2] != "-" || row[3] != "-->" || row[4] != "/run/app.sock (gunicorn/901)" || row[5] != "nginx/880" {
		t.Errorf("outbound unix row %q", row)
	}
	in := flow(tracer.Inbound, "unix", "/run/app.sock", "", 0)
	if row := TableRow(in, nil); row[2] != "/run/app.sock" || row[3] != "<--" {
		t.Errorf("inbound unix row %q", row)
	}
}

// Writing one interval of 1,000 client hosts seen from both ends as jsonl:
//
//	go test -run '^$' -bench JSONL -benchmem ./internal/output
func BenchmarkJSONL2000Flows(b *testing.B) {
	flows := make([]tracer.Flow, 0, 2000)
	// As the kernel map gives them: in hash order, each with its own
	// first and last event within the 1 s interval.
	end := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 1000; i++ {
		client := fmt.Sprintf("127.1.%d.%d", i/250, i%250+1)
		for _, f := range []tracer.Flow{flow(tracer.Outbound, "tcp", client, "127.0.0.1", 7000), flow(tracer.Inbound, "tcp", "127.0.0.1", client, 7000)} {
			f.Time = end
			f.FirstSeen = end.Add(-time.Second + time.Duration(rng.Int64N(int64(time.Second/2))))
			f.LastSeen = end.Add(-time.Duration(rng.Int64N(int64(time.Second / 2))))
			flows = append(flows, f)
		}
	}
	rng.Shuffle(len(flows), func(i, j int) { flows[i], flows[j] = flows[j], flows[i] })
	w, err := New("jsonl", io.Discard, nil, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := w.Write(flows, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func mustWrite(t *testing.T, w Writer, flows []tracer.Flow, listeners []tracer.Listener) {
	t.Helper()
	if err := w.Write(flows, listeners); err != nil {
		t.Fatal(err)
	}
}

// At an interval of a whole number of seconds the TIME column is to the
// second; below or between seconds every interval's rows carry their own
// millisecond time, in the flow, listener and DNS tables alike.
func TestTableClockFollowsTheInterval(t *testing.T) {
	at := []time.Time{time.Date(2026, 1, 2, 3, 4, 5, 100e6, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 350e6, time.UTC)}
	for _, c := range []struct {
		interval time.Duration
		want     []string
	}{
		{time.Second, []string{"03:04:05  ", "03:04:05  "}},
		{2 * time.Second, []string{"03:04:05  ", "03:04:05  "}},
		{250 * time.Millisecond, []string{"03:04:05.100  ", "03:04:05.350  "}},
		{1500 * time.Millisecond, []string{"03:04:05.100  ", "03:04:05.350  "}},
	} {
		var flows, dns bytes.Buffer
		w, _ := New("table", &flows, nil, c.interval)
		dw, _ := NewDNS("table", &dns, nil, c.interval)
		for i, ts := range at {
			f := flow(tracer.Outbound, "tcp", "10.0.1.9", "10.0.1.10", 3306)
			f.Time = ts
			l := tracer.Listener{Time: ts, Proto: "tcp", LocalAddr: "10.0.0.1", Port: 80, Drops: 1}
			mustWrite(t, w, []tracer.Flow{f}, []tracer.Listener{l})
			d := dnsRecord()
			d.Time = ts
			if err := dw.WriteDNS([]tracer.DNS{d}); err != nil {
				t.Fatal(err)
			}
			for _, out := range []string{flows.String(), dns.String()} {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				rows := slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, "TIME") })
				if !strings.HasPrefix(rows[len(rows)-1], c.want[i]) {
					t.Errorf("interval %s, write %d: last row %q, want it to start %q", c.interval, i, rows[len(rows)-1], c.want[i])
				}
			}
		}
	}
}
