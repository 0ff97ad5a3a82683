package output

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

func flow(dir, proto, local, remote string, port uint16) tracer.Flow {
	return tracer.Flow{
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), NetNS: 4026531840,
		Proto: proto, Direction: dir,
		LocalAddr: local, RemoteAddr: remote, Port: port,
		PID: 812, Comm: "php-fpm",
		Counters: tracer.Counters{Connections: 22, FailedConnections: 1, BytesSent: 1840, BytesReceived: 96000},
	}
}

func TestTableRowArrowsPointAtTheServer(t *testing.T) {
	out := TableRow(flow(tracer.Outbound, "tcp", "10.0.1.9", "10.0.1.10", 3306), nil)
	want := []string{"03:04:05", "tcp", "10.0.1.9:many", "-->", "10.0.1.10:3306", "php-fpm/812", "22", "1", "1840", "96000", "4026531840"}
	if !slices.Equal(out, want) {
		t.Errorf("outbound row %q, want %q", out, want)
	}
	in := TableRow(flow(tracer.Inbound, "tcp", "10.0.1.9", "10.0.2.13", 80), map[uint32]string{4026531840: "web"})
	if in[2] != "10.0.1.9:80" || in[3] != "<--" || in[4] != "10.0.2.13:many" || in[10] != "web" {
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
	w, err := New("table", &buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]tracer.Flow{flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)})
	w.Write(nil)
	w.Write([]tracer.Flow{flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") || strings.HasPrefix(lines[2], "TIME") {
		t.Errorf("table output:\n%s", buf.String())
	}
}

func TestJSONLFieldsAreTheDocumentedOnes(t *testing.T) {
	var buf bytes.Buffer
	w, _ := New("jsonl", &buf, nil)
	w.Write([]tracer.Flow{
		flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432),
		flow(tracer.Inbound, "udp", "::ffff:10.0.0.3", "2001:db8::9", 53),
	})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "netns", "proto", "direction", "local_addr", "remote_addr", "port", "pid", "comm",
		"cgroup_id", "connections", "failed_connections", "bytes_sent", "bytes_received", "first_seen", "last_seen"} {
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
	_, err := New("xml", nil, nil)
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
	if _, err := ParseProtos("sctp"); err == nil || !strings.Contains(err.Error(), "tcp, udp, all") {
		t.Errorf("sctp accepted or badly reported: %v", err)
	}
	ports, err := ParsePorts([]string{"80,443", "5432"})
	if err != nil || !slices.Equal(ports, []uint16{80, 443, 5432}) {
		t.Fatalf("ParsePorts: %v %v", ports, err)
	}
	for _, bad := range []string{"0", "65536", "http", "-1"} {
		if _, err := ParsePorts([]string{bad}); err == nil || !strings.Contains(err.Error(), "1 to 65535") {
			t.Errorf("port %q: %v", bad, err)
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
	if got[0] != c && got[0] != b || got[2] != a {
		t.Errorf("order: %v", got)
	}
	if got[0].Direction != tracer.Inbound { // "inbound" < "outbound"
		t.Errorf("inbound should sort first at equal port: %v", got)
	}
}
