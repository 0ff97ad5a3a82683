package perevent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/bundler"
)

func comm(s string) (c [16]int8) {
	for i := 0; i < len(s) && i < 15; i++ {
		c[i] = int8(s[i])
	}
	return
}

func TestMergeSumsCPUsAndUnmapsIPv4(t *testing.T) {
	var k pereventFlowKey
	k.Netns, k.Port, k.Proto, k.Direction = 7, 5432, 6, DirOutbound
	k.LocalAddr = netip.MustParseAddr("::ffff:192.0.2.1").As16()
	k.RemoteAddr = netip.MustParseAddr("2001:db8::2").As16()
	cpus := []pereventFlowValue{
		{Connections: 2, BytesSent: 10, FirstSeenNs: 500, LastSeenNs: 900, Pid: 11, Comm: comm("old"), CgroupId: 1},
		{}, // a CPU that saw nothing
		{Connections: 3, FailedConnections: 1, BytesReceived: 7, FirstSeenNs: 300, LastSeenNs: 1000, Pid: 12, Comm: comm("psql"), CgroupId: 2},
		{BytesSent: 5, FirstSeenNs: 700, LastSeenNs: 1200}, // softirq: no process
	}
	e := merge(k, cpus)
	if e.Connections != 5 || e.FailedConnections != 1 || e.BytesSent != 15 || e.BytesReceived != 7 {
		t.Errorf("counters: %+v", e)
	}
	if e.FirstSeenBootNs != 300 || e.LastSeenBootNs != 1200 {
		t.Errorf("first/last: %d %d", e.FirstSeenBootNs, e.LastSeenBootNs)
	}
	if e.PID != 12 || e.Comm != "psql" || e.CgroupID != 2 {
		t.Errorf("process should come from the latest slot that named one: %d %q %d", e.PID, e.Comm, e.CgroupID)
	}
	if e.Local.String() != "192.0.2.1" || !e.Local.Is4() {
		t.Errorf("v4-mapped local not unmapped: %s", e.Local)
	}
	if e.Remote.String() != "2001:db8::2" {
		t.Errorf("remote: %s", e.Remote)
	}
}

func TestCommStringStopsAtNUL(t *testing.T) {
	if got := commString(comm("nginx")); got != "nginx" {
		t.Errorf("%q", got)
	}
	var full [16]int8
	for i := range full {
		full[i] = 'x'
	}
	if got := commString(full); len(got) != 16 {
		t.Errorf("unterminated comm: %q", got)
	}
}

func TestConfigValidateNamesTheRange(t *testing.T) {
	ok := Config{FlowMapSize: 1024, PortMapSize: 1024}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		{FlowMapSize: 1, PortMapSize: 1024},
		{FlowMapSize: bundler.MaxFlowMapSize + 1, PortMapSize: 1024},
		{FlowMapSize: 1024, PortMapSize: 0},
	} {
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "allowed") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// The key layout is part of the kernel contract: no implicit padding.
func TestKeyLayoutHasNoHoles(t *testing.T) {
	var k pereventFlowKey
	if got := sizeOf(k); got != 4+2+1+1+16+16+2+2 {
		t.Errorf("flow key is %d bytes", got)
	}
	var p pereventPortKey
	if got := sizeOf(p); got != 8 {
		t.Errorf("port key is %d bytes", got)
	}
}
