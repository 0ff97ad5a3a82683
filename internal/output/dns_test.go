package output

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

func dnsRecord() tracer.DNS {
	return tracer.DNS{
		Kind: tracer.KindDNS, Time: time.Date(2026, 1, 2, 12, 0, 1, 0, time.UTC), NetNS: 4026531840, PID: 812, Comm: "curl",
		CgroupID: 9, Identity: tracer.Identity{ContainerName: "web"}, Proto: tracer.ProtoUDP, Resolver: "127.0.0.11:53",
		DNSCounters: tracer.DNSCounters{Queries: 4, Answers: 3, NoError: 2, NXDomain: 1, Timeouts: 1, LatencyCount: 3, LatencySumUs: 900, LatencyMaxUs: 12000},
	}
}

func TestDNSTable(t *testing.T) {
	var b bytes.Buffer
	w, err := NewDNS("table", &b, func() map[uint32]string { return map[uint32]string{4026531840: "host"} }, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteDNS(nil); err != nil || b.Len() != 0 {
		t.Fatalf("an empty interval wrote %q, %v", b.String(), err)
	}
	if err := w.WriteDNS([]tracer.DNS{dnsRecord()}); err != nil {
		t.Fatal(err)
	}
	_ = w.WriteDNS([]tracer.DNS{dnsRecord()})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("want a header once and two rows:\n%s", b.String())
	}
	fields := strings.Fields(lines[1])
	want := []string{"12:00:01", "udp", "web(curl)/812", "127.0.0.11:53", "4", "3", "1", "0", "0", "1", "300us", "12ms", "nxdomain=1,timeouts=1", "host"}
	if strings.Join(fields, " ") != strings.Join(want, " ") {
		t.Errorf("row\n got  %v\n want %v", fields, want)
	}
	if _, err := NewDNS("yaml", &b, nil, time.Second); err == nil || !strings.Contains(err.Error(), "allowed table, jsonl") {
		t.Errorf("bad format: %v", err)
	}
}

func TestDNSJSONLIsEncodingJSON(t *testing.T) {
	var b bytes.Buffer
	w, _ := NewDNS("jsonl", &b, nil, time.Second)
	d := dnsRecord()
	if err := w.WriteDNS([]tracer.DNS{d}); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(d)
	if got := strings.TrimSuffix(b.String(), "\n"); got != string(want) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	for _, f := range []string{`"kind":"dns"`, `"resolver":"127.0.0.11:53"`, `"nxdomain":1`, `"timeouts":1`, `"container_name":"web"`} {
		if !strings.Contains(b.String(), f) {
			t.Errorf("missing %s in %s", f, b.String())
		}
	}
}

func TestNamedPeerInTable(t *testing.T) {
	f := tracer.Flow{Time: time.Unix(0, 0), Proto: tracer.ProtoTCP, Direction: tracer.Outbound, LocalAddr: "10.0.0.1", RemoteAddr: "203.0.113.7", Port: 443, RemoteName: "api.example.com"}
	if got := TableRow(f, nil)[4]; got != "api.example.com:443 (203.0.113.7)" {
		t.Errorf("peer %q", got)
	}
	f.RemoteName = ""
	if got := TableRow(f, nil)[4]; got != "203.0.113.7:443" {
		t.Errorf("unnamed peer %q", got)
	}
}

func TestDNSShownByFilters(t *testing.T) {
	for _, c := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Ports: []uint16{5432}}, false},
		{Filter{Ports: []uint16{5432, 53}}, true},
		{Filter{Protos: []string{"unix"}}, false},
		{Filter{Protos: []string{"tcp"}}, true},
	} {
		if got := c.f.DNSShown(); got != c.want {
			t.Errorf("%+v: %v, want %v", c.f, got, c.want)
		}
	}
}
