package graph

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// namedExternal is chain() with app's external call named by DNS, and a second
// client (curl on client) reaching the same address under a later name.
func namedExternal() []store.Observation {
	obs := chain()
	obs[6].RemoteName = "api.example.com"
	obs[6].RTTSamples, obs[6].RTTSumUs, obs[6].RTTMinUs, obs[6].RTTMaxUs = 2, 3000, 1000, 2000
	later := o("client", "outbound", "198.51.100.1", "203.0.113.7", 443, "curl", 1, 1, 1)
	later.RemoteName, later.LastSeen = "api-v2.example.com", at.Add(time.Hour)
	return append(obs, later)
}

// An external server is named by the latest name any client got for it,
// its address kept; the edge's RTT average is the samples' average; look
// finds it by name (any case, a trailing dot, name:port) and labels use
// the name.
func TestExternalNodesByName(t *testing.T) {
	g := Build(namedExternal(), hosts, nil)
	n := node(t, g, "external:203.0.113.7:443")
	if n.RemoteName != "api-v2.example.com" || n.Name != n.RemoteName || n.Addr != "203.0.113.7" {
		t.Errorf("external node %+v", n)
	}
	if e := edge(t, g, ProcessID("app", "app"), n.ID); e.RTTAvgUs != 1500 || e.RTTMaxUs != 2000 || e.RTTMinUs != 1000 {
		t.Errorf("edge %+v", e)
	}
	if l := Label(n); l != "tcp api-v2.example.com:443 (external 203.0.113.7)" {
		t.Errorf("label %q", l)
	}
	for _, target := range []string{"api-v2.example.com", "API-V2.Example.com.", "api-v2.example.com:443", "203.0.113.7", "203.0.113.7:443"} {
		ids, err := Resolve(g, hosts, target)
		if err != nil || len(ids) != 1 || ids[0] != n.ID {
			t.Errorf("resolve %s: %v %v", target, ids, err)
		}
	}
	if ids, err := Resolve(g, hosts, "api.example.com"); err == nil {
		t.Errorf("an older name found %v", ids)
	}
	if ids, err := Resolve(g, hosts, "api-v2.example.com:80"); err == nil {
		t.Errorf("another port found %v", ids)
	}
	gg := Group(g, ByWorkload)
	if n := node(t, gg, "external:203.0.113.7:443"); n.RemoteName != "api-v2.example.com" {
		t.Errorf("grouped: %+v", n)
	}
	if e := edge(t, gg, "workload:app/app", "external:203.0.113.7:443"); e.RTTAvgUs != 1500 {
		t.Errorf("grouped edge %+v", e)
	}
	for _, f := range []string{"dot", "mermaid"} {
		var b bytes.Buffer
		if err := Write(&b, gg, f); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), "api-v2.example.com:443 (external 203.0.113.7)") {
			t.Errorf("%s without the name:\n%s", f, b.String())
		}
	}
	var b bytes.Buffer
	WriteTrees(&b, Look(gg, []string{"workload:app/app"}, 1, true, false, 0), true, false)
	if !strings.Contains(b.String(), "-> tcp api-v2.example.com:443 (external 203.0.113.7)") || !strings.Contains(b.String(), " rtt=1.5ms/2ms ") {
		t.Errorf("look:\n%s", b.String())
	}
}

func dnsObs(host, comm, resolver string, c tracer.DNSCounters) store.DNSObservation {
	return store.DNSObservation{HostID: host, Comm: comm, Proto: "udp", Resolver: resolver, DNSCounters: c}
}

// DNS stats go on the client's node (a new node for a client without
// flows), merge per resolver when grouped, and JudgeDNS flags failing
// lookups by rate with a minimum count, after Judge.
func TestDNSOnClientsAndItsHealth(t *testing.T) {
	g := Build(chain(), hosts, nil)
	AddDNS(&g, []store.DNSObservation{
		dnsObs("web", "nginx", "127.0.0.53:53", tracer.DNSCounters{Queries: 100, Answers: 100, NoError: 100, LatencyCount: 100, LatencySumUs: 5000, LatencyMaxUs: 900}),
		dnsObs("client", "wget", "10.96.0.10:53", tracer.DNSCounters{Queries: 4, Answers: 4, NXDomain: 4}),
		dnsObs("client", "curl", "10.96.0.10:53", tracer.DNSCounters{Queries: 10, Answers: 7, NoError: 7, ServFail: 1, Timeouts: 2}),
		dnsObs("client", "curl", "10.96.0.11:53", tracer.DNSCounters{Queries: 100, Answers: 98, NoError: 97, OtherErrors: 1, Timeouts: 2}),
	}, hosts)
	if n := node(t, g, ProcessID("client", "wget")); n.Kind != KindProcess || n.Addr != "198.51.100.1" || len(n.DNS) != 1 {
		t.Errorf("wget, a client without flows: %+v", n)
	}
	for _, by := range []string{"", ByWorkload, ByHost} {
		gg := g
		if by != "" {
			gg = Group(g, by)
		}
		gg.Judge(DefaultHealth)
		gg.JudgeDNS(DefaultDNSHealth)
		id := func(host, comm string) string {
			switch by {
			case "":
				return ProcessID(host, comm)
			case ByHost:
				return "host:" + host
			}
			return "workload:" + host + "/" + comm
		}
		nginx := node(t, gg, id("web", "nginx"))
		if nginx.Health != HealthOK || len(nginx.DNS) != 1 || nginx.DNS[0].LatencyAvgUs != 50 || nginx.DNS[0].Health != HealthOK {
			t.Errorf("%s: nginx %+v", by, nginx)
		}
		if by == ByHost {
			h := node(t, gg, "host:client")
			if h.Health != HealthUnhealthy || len(h.DNS) != 2 || h.DNS[0].Queries != 14 || h.DNS[0].NXDomain != 4 {
				t.Errorf("host: %+v", h)
			}
			continue
		}
		curl := node(t, gg, id("client", "curl"))
		want := []string{
			"DNS via 10.96.0.10:53/udp: 3 of 10 lookups failed (30.0 %): 1 SERVFAIL, 2 timed out",
			"DNS via 10.96.0.11:53/udp: 3 of 100 lookups failed (3.0 %): 1 other errors, 2 timed out",
		}
		if curl.Health != HealthUnhealthy || !curl.Unhealthy || strings.Join(curl.Reasons, "|") != strings.Join(want, "|") ||
			curl.DNS[0].Health != HealthUnhealthy || curl.DNS[1].Health != HealthDegraded {
			t.Errorf("%s: curl %+v", by, curl)
		}
		wget := node(t, gg, id("client", "wget"))
		if wget.Health != HealthUnhealthy || len(wget.Reasons) != 1 || wget.Reasons[0] != "DNS via 10.96.0.10:53/udp: 4 lookups answered NXDOMAIN and none with an address" {
			t.Errorf("%s: wget %+v", by, wget)
		}
	}
	gg := Group(g, ByWorkload)
	gg.Judge(DefaultHealth)
	gg.JudgeDNS(DefaultDNSHealth)
	var b bytes.Buffer
	WriteTrees(&b, Look(gg, []string{"workload:client/curl"}, 1, true, true, 0), true, true)
	for _, line := range []string{
		"  DNS lookups (per resolver):",
		"    10.96.0.10:53/udp queries=10 answers=7 nxdomain=0 servfail=1 other=0 timeouts=2  UNHEALTHY: 3 of 10 lookups failed (30.0 %): 1 SERVFAIL, 2 timed out",
		"    10.96.0.11:53/udp queries=100 answers=98 nxdomain=0 servfail=0 other=1 timeouts=2  DEGRADED: 3 of 100 lookups failed (3.0 %): 1 other errors, 2 timed out",
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("look without %q:\n%s", line, b.String())
		}
	}
	b.Reset()
	if err := Write(&b, gg, "dot"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `curl on client (198.51.100.1)\nDNS: 6 of 110 lookups failed" shape=box color=red`) {
		t.Errorf("dot:\n%s", b.String())
	}
}

// Few failures are not unhealthy; few NXDOMAIN beside answers are not
// judged; thresholds out of range are refused by name.
func TestDNSHealthRules(t *testing.T) {
	for _, c := range []struct {
		c    tracer.DNSCounters
		want string
	}{
		{tracer.DNSCounters{Queries: 1000, NoError: 1000}, HealthOK},
		{tracer.DNSCounters{Queries: 10, NoError: 9, Timeouts: 1}, HealthDegraded},   // 10 %, 1 event: under MinEvents
		{tracer.DNSCounters{Queries: 1000, NoError: 998, ServFail: 2}, HealthOK},     // 0.2 %
		{tracer.DNSCounters{Queries: 100, NoError: 95, ServFail: 3}, HealthDegraded}, // 3 %: at half of 5 %
		{tracer.DNSCounters{Queries: 100, NoError: 95, ServFail: 5}, HealthUnhealthy},
		{tracer.DNSCounters{Queries: 100, NoError: 20, NXDomain: 80}, HealthOK}, // a search list's NXDOMAIN
		{tracer.DNSCounters{Queries: 2, NXDomain: 2}, HealthOK},
		{tracer.DNSCounters{Queries: 3, NXDomain: 3}, HealthUnhealthy},
		{tracer.DNSCounters{Timeouts: 5}, HealthUnhealthy}, // no query seen (the watcher started late)
	} {
		d := DNSStats{DNSCounters: c.c}
		d.Judge(DefaultDNSHealth)
		if d.Health != c.want {
			t.Errorf("%+v: %s %v, want %s", c.c, d.Health, d.Reasons, c.want)
		}
	}
	if err := DefaultDNSHealth.Validate(); err != nil {
		t.Error(err)
	}
	for h, want := range map[DNSHealth]string{
		{MinEvents: 3, ErrorRatio: 1.5, DegradedFactor: 0.5}:         "invalid --health-dns-error-ratio 1.5: allowed 0 to 1",
		{MinEvents: 3, ErrorRatio: -0.1, DegradedFactor: 0.5}:        "invalid --health-dns-error-ratio -0.1: allowed 0 to 1",
		{MinEvents: 3, ErrorRatio: math.NaN(), DegradedFactor: 0.5}:  "invalid --health-dns-error-ratio NaN: allowed 0 to 1",
		{MinEvents: 0, ErrorRatio: 0.1, DegradedFactor: 0.5}:         "invalid --health-dns-min-events 0: allowed 1 to 1000000",
		{MinEvents: 1_000_001, ErrorRatio: 0.1, DegradedFactor: 0.5}: "invalid --health-dns-min-events 1000001: allowed 1 to 1000000",
		{MinEvents: 3, ErrorRatio: 0.1, DegradedFactor: 0}:           "invalid --health-degraded-factor 0: allowed more than 0, up to 1",
	} {
		if err := h.Validate(); err == nil || err.Error() != want {
			t.Errorf("%+v: %v, want %s", h, err, want)
		}
	}
	for _, h := range []DNSHealth{{MinEvents: 1, ErrorRatio: 0, DegradedFactor: 1}, {MinEvents: 1_000_000, ErrorRatio: 1, DegradedFactor: 0.01}} {
		if err := h.Validate(); err != nil {
			t.Errorf("%+v at the ends of the allowed ranges: %v", h, err)
		}
	}
}

// Thresholds other than the defaults move each side: 2 timeouts in 100
// queries are ok by default (under 3 errors and 2.5 %), unhealthy at 1 %
// on 2 errors, degraded at 4 % with the default factor (2 % is half of
// it), ok again when the factor is 0.9.
func TestDNSHealthThresholdsMove(t *testing.T) {
	c := tracer.DNSCounters{Queries: 100, Answers: 98, NoError: 98, Timeouts: 2}
	for _, x := range []struct {
		h    DNSHealth
		want string
	}{
		{DefaultDNSHealth, HealthOK},
		{DNSHealth{MinEvents: 2, ErrorRatio: 0.01, DegradedFactor: 0.5}, HealthUnhealthy},
		{DNSHealth{MinEvents: 3, ErrorRatio: 0.01, DegradedFactor: 0.5}, HealthDegraded}, // over the ratio on too few errors
		{DNSHealth{MinEvents: 2, ErrorRatio: 0.04, DegradedFactor: 0.5}, HealthDegraded},
		{DNSHealth{MinEvents: 2, ErrorRatio: 0.04, DegradedFactor: 0.9}, HealthOK},
	} {
		d := DNSStats{DNSCounters: c}
		d.Judge(x.h)
		if d.Health != x.want {
			t.Errorf("%+v: %s %v, want %s", x.h, d.Health, d.Reasons, x.want)
		}
	}
	// NXDOMAIN without an address: the minimum count moves it too.
	d := DNSStats{DNSCounters: tracer.DNSCounters{Queries: 2, Answers: 2, NXDomain: 2}}
	if d.Judge(DNSHealth{MinEvents: 2, ErrorRatio: 0.05, DegradedFactor: 0.5}); d.Health != HealthUnhealthy {
		t.Errorf("2 NXDOMAIN, minimum 2: %s", d.Health)
	}
}

// look flags a node whose lookups fail wherever it shows, by the
// thresholds given: the root's line and a peer's line (curl as nginx's
// client) end their label with [DNS UNHEALTHY] or [DNS DEGRADED]; a
// client whose lookups are ok has no mark.
func TestLookMarksClientsWithFailingLookups(t *testing.T) {
	g := Build(chain(), hosts, nil)
	AddDNS(&g, []store.DNSObservation{
		dnsObs("web", "nginx", "127.0.0.53:53", tracer.DNSCounters{Queries: 100, Answers: 100, NoError: 100}),
		dnsObs("client", "curl", "10.96.0.10:53", tracer.DNSCounters{Queries: 10, Answers: 7, NoError: 7, ServFail: 1, Timeouts: 2}),
	}, hosts)
	g = Group(g, ByWorkload)
	for _, c := range []struct {
		h    DNSHealth
		mark string
	}{
		{DefaultDNSHealth, "  [DNS UNHEALTHY]"},
		{DNSHealth{MinEvents: 3, ErrorRatio: 0.5, DegradedFactor: 0.5}, "  [DNS DEGRADED]"}, // 30 % is over half of 50 %
		{DNSHealth{MinEvents: 3, ErrorRatio: 1, DegradedFactor: 0.5}, ""},
	} {
		gg := g
		gg.Nodes = slices.Clone(g.Nodes)
		gg.Judge(DefaultHealth)
		gg.JudgeDNS(c.h)
		var b bytes.Buffer
		WriteTrees(&b, Look(gg, []string{"workload:client/curl"}, 1, true, true, 0), true, true)
		if first, _, _ := strings.Cut(b.String(), "\n"); first != "curl on client (198.51.100.1)"+c.mark {
			t.Errorf("%+v: look curl's first line %q, want the mark %q", c.h, first, c.mark)
		}
		b.Reset()
		WriteTrees(&b, Look(gg, []string{"workload:web/nginx"}, 1, true, true, 0), true, true)
		want := "    └─ <- curl on client (198.51.100.1)" + c.mark + "  via tcp/80  conns=5 "
		if !strings.Contains(b.String(), want) || strings.Count(b.String(), "[DNS ") != strings.Count(want, "[DNS ") {
			t.Errorf("%+v: look nginx without %q (or with another mark):\n%s", c.h, want, b.String())
		}
	}
}

// The DOT and Mermaid label counts as failed what JudgeDNS does: NXDOMAIN
// beside answers (a search list at work) is no failure; NXDOMAIN with no
// answer at all is named as such.
func TestPictureLabelCountsDNSFailuresAsJudged(t *testing.T) {
	stats := func(c tracer.DNSCounters) Node {
		return Node{ID: "process:client/curl", Kind: KindProcess, Host: "client", DNS: []DNSStats{{Proto: "udp", Resolver: "10.96.0.10:53", DNSCounters: c}}}
	}
	for _, c := range []struct {
		counters tracer.DNSCounters
		want     string // the label's DNS line; "" for none
	}{
		{tracer.DNSCounters{Queries: 50, Answers: 50, NoError: 10, NXDomain: 40}, ""},
		{tracer.DNSCounters{Queries: 50, Answers: 47, NoError: 7, NXDomain: 40, ServFail: 1, Timeouts: 2}, "DNS: 3 of 50 lookups failed"},
		{tracer.DNSCounters{Queries: 4, Answers: 4, NXDomain: 4}, "DNS: 4 NXDOMAIN and no address"},
		{tracer.DNSCounters{Queries: 6, Answers: 4, NXDomain: 4, Timeouts: 2}, "DNS: 2 of 6 lookups failed, 4 NXDOMAIN and no address"},
	} {
		label := pictureLabel(stats(c.counters), "\n")
		_, dns, _ := strings.Cut(label, "\n")
		if dns != c.want {
			t.Errorf("%+v: label %q, want the DNS line %q", c.counters, label, c.want)
		}
	}
}
