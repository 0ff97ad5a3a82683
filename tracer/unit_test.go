package tracer

import (
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Interval = 10 * time.Millisecond
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "allowed 100ms to 1h0m0s") {
		t.Errorf("short interval: %v", err)
	}
	c = DefaultConfig()
	c.FlowMapSize = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "flow map size") {
		t.Errorf("zero map: %v", err)
	}
}

// An address's text is made once and shared by the intervals that name
// it (IPv4-mapped addresses arrive unmapped from the bundler), and the
// cache stays bounded.
func TestAddrNamesShareOneStringPerAddress(t *testing.T) {
	c := addrNames{}
	for _, text := range []string{"192.0.2.1", "2001:db8::1", "fe80::1%eth0", "::"} {
		a := netip.MustParseAddr(text)
		first, again := c.name(a), c.name(netip.MustParseAddr(text))
		if first != text || again != text {
			t.Fatalf("%s named %q then %q", text, first, again)
		}
		if unsafe.StringData(first) != unsafe.StringData(again) {
			t.Errorf("%s: two strings for one address", text)
		}
	}
	for i := range addrNamesMax + 10 {
		c.name(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	if len(c) > addrNamesMax {
		t.Errorf("%d addresses cached, at most %d", len(c), addrNamesMax)
	}
	if got := c.name(netip.MustParseAddr("198.51.100.7")); got != "198.51.100.7" {
		t.Errorf("after a clear: %q", got)
	}
}

func TestProcCacheNamesSoftirqOnlyFlows(t *testing.T) {
	c := procCache{}
	f := Flow{NetNS: 1, Proto: ProtoTCP, Direction: Outbound, LocalAddr: "192.0.2.1",
		RemoteAddr: "192.0.2.2", Port: 80, PID: 42, Comm: "curl", CgroupID: 9}
	first := f
	c.fill(&first)
	later := f
	later.PID, later.Comm, later.CgroupID = 0, "", 0
	c.fill(&later)
	if later.PID != 42 || later.Comm != "curl" || later.CgroupID != 9 {
		t.Errorf("not filled: %+v", later)
	}
	other := later
	other.PID, other.Comm, other.Port = 0, "", 443
	c.fill(&other)
	if other.PID != 0 {
		t.Errorf("filled from another flow: %+v", other)
	}
}

// A listener from before the start can name its inbound flows by cgroup
// alone (no process in /proc to read): a later interval keeps that cgroup,
// and a flow of another process never takes it.
func TestProcCacheKeepsACgroupWithoutAProcess(t *testing.T) {
	c := procCache{}
	f := Flow{NetNS: 1, Proto: ProtoTCP, Direction: Inbound, LocalAddr: "192.0.2.1",
		RemoteAddr: "192.0.2.2", Port: 80, CgroupID: 7}
	c.fill(&f)
	later := f
	later.CgroupID = 0
	c.fill(&later)
	if later.CgroupID != 7 || later.PID != 0 {
		t.Errorf("cgroup not kept: %+v", later)
	}
	another := f
	another.PID, another.Comm, another.CgroupID = 99, "other", 0
	c.fill(&another)
	if another.CgroupID != 0 {
		t.Errorf("a flow of process 99 took the cached cgroup of no process: %+v", another)
	}
}

func TestLossesArithmetic(t *testing.T) {
	a := Losses{FlowMapFull: 5, PortMapFull: 1, UDPPeerUnknown: 2, SockStorageFailed: 3, RecursionMisses: 4}
	b := Losses{FlowMapFull: 2, RecursionMisses: 1}
	d := a.minus(b)
	if d.FlowMapFull != 3 || d.RecursionMisses != 3 || d.Total() != 3+1+2+3+3 {
		t.Errorf("%+v total %d", d, d.Total())
	}
}

func TestFlowEnds(t *testing.T) {
	f := Flow{Direction: Inbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.9", Port: 80}
	if f.ServerAddr().String() != "192.0.2.1:80" || f.ClientAddr() != "192.0.2.9" {
		t.Errorf("inbound ends: %s %s", f.ServerAddr(), f.ClientAddr())
	}
	f.Direction = Outbound
	if f.ServerAddr().String() != "192.0.2.9:80" || f.ClientAddr() != "192.0.2.1" {
		t.Errorf("outbound ends: %s %s", f.ServerAddr(), f.ClientAddr())
	}
}
