package agent

import (
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// A named flow keeps its name in the store; DNS records become DNS
// observations on their namespace's host.
func TestBatchCarriesNamesAndDNS(t *testing.T) {
	ids, err := newHostIDs("testhost")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 12, 0, 30, 0, time.UTC)
	iv := tracer.Interval{Time: now, BatchID: "b1",
		Flows: []tracer.Flow{{Kind: tracer.KindFlow, Time: now, NetNS: ids.rootNS, Proto: tracer.ProtoTCP, Direction: tracer.Outbound,
			LocalAddr: "10.0.0.1", RemoteAddr: "203.0.113.7", Port: 443, RemoteName: "api.example.com", Comm: "curl", PID: 5}},
		DNS: []tracer.DNS{{Kind: tracer.KindDNS, Time: now, NetNS: ids.rootNS, PID: 5, Comm: "curl", Identity: tracer.Identity{Unit: "x.service"},
			Proto: tracer.ProtoUDP, Resolver: "127.0.0.53:53", DNSCounters: tracer.DNSCounters{Queries: 2, Answers: 1, NXDomain: 1, Timeouts: 1}}},
	}
	b := batchOf(iv, ids)
	if len(b.Observations) != 1 || b.Observations[0].RemoteName != "api.example.com" {
		t.Fatalf("observations %+v", b.Observations)
	}
	if len(b.DNS) != 1 {
		t.Fatalf("dns %+v", b.DNS)
	}
	d := b.DNS[0]
	if d.HostID != "testhost" || d.Comm != "curl" || d.PID != 5 || d.Unit != "x.service" || d.Proto != "udp" || d.Resolver != "127.0.0.53:53" ||
		d.Queries != 2 || d.NXDomain != 1 || d.Timeouts != 1 || !d.Bucket.Equal(now.Truncate(time.Minute)) || !d.LastSeen.Equal(now) {
		t.Errorf("dns observation %+v", d)
	}
	if len(b.Hosts) != 1 || batchBytes(b) <= batchBytes(batchOf(tracer.Interval{Flows: iv.Flows}, ids)) {
		t.Errorf("hosts %+v; the DNS records must count in the batch's size", b.Hosts)
	}
	// Only DNS: still a host for it.
	b = batchOf(tracer.Interval{Time: now, DNS: iv.DNS}, ids)
	if len(b.Hosts) != 1 || len(b.DNS) != 1 {
		t.Errorf("DNS-only batch %+v", b)
	}
}

func TestMergeDNSAddsPerClientAndResolver(t *testing.T) {
	a := []tracer.DNS{{PID: 1, Resolver: "r:53", DNSCounters: tracer.DNSCounters{Queries: 1, LatencyMaxUs: 5}}}
	b := []tracer.DNS{{PID: 1, Resolver: "r:53", DNSCounters: tracer.DNSCounters{Queries: 2, LatencyMaxUs: 3}}, {PID: 2, Resolver: "r:53", DNSCounters: tracer.DNSCounters{Queries: 7}}}
	got := mergeDNS(a, b)
	if len(got) != 2 || got[0].Queries != 3 || got[0].LatencyMaxUs != 5 || got[1].Queries != 7 || a[0].Queries != 1 {
		t.Errorf("merged %+v (a %+v)", got, a)
	}
}

// An interval collected again may have been stored already (its commit
// failed, or the process that collected it died before the commit): it
// carries only the DNS records it had the first time, and lookups taken
// with it go with the next new interval. Over a store that applies each
// batch id once, every lookup counts once.
func TestRecoveredIntervalsKeepTheirFirstDNS(t *testing.T) {
	lookups := func(n uint64) []tracer.DNS {
		return []tracer.DNS{{PID: 1, Resolver: "r:53", DNSCounters: tracer.DNSCounters{Queries: n}}}
	}
	var d dnsBatches
	applied := map[string]bool{}
	var stored uint64
	for _, step := range []struct {
		batch     string
		recovered bool
		queries   uint64 // taken from the watcher with this interval
		want      uint64 // the interval's records
	}{
		{"a", false, 1, 1},
		{"a", true, 2, 1},   // this process's, stored or not: its first records
		{"old", true, 4, 0}, // a dead process's, maybe stored
		{"", false, 8, 14},  // a failed drain's (no batch id): takes them
		{"a", true, 0, 1},   // after it, still its first records
		{"b", false, 16, 16},
		{"b", true, 0, 16},
	} {
		iv := tracer.Interval{BatchID: step.batch, Recovered: step.recovered, DNS: lookups(step.queries)}
		d.attach(&iv)
		var got uint64
		for _, r := range iv.DNS {
			got += r.Queries
		}
		if got != step.want {
			t.Errorf("batch %q recovered=%v: %d queries attached, want %d", step.batch, step.recovered, got, step.want)
		}
		if step.batch == "" || !applied[step.batch] {
			applied[step.batch] = step.batch != ""
			stored += got
		}
	}
	if stored != 31 {
		t.Errorf("the store counted %d queries, want each of the 31 taken once", stored)
	}
}

// The metrics count each batch once, however often it is collected again,
// a failed drain's interval (no batch id) in between included.
func TestObservedBatchesCountEachBatchOnce(t *testing.T) {
	var o observedBatches
	for i, step := range []struct {
		batch string
		want  bool
	}{{"a", true}, {"a", false}, {"", true}, {"a", false}, {"b", true}, {"", true}, {"", true}, {"b", false}} {
		if got := o.first(step.batch); got != step.want {
			t.Errorf("step %d: batch %q counted %v, want %v", i, step.batch, got, step.want)
		}
	}
}
