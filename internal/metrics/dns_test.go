package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/deptrace/deptrace/tracer"
)

// summaries returns "name{labels} count sum" of every summary named.
func summaries(t *testing.T, m *Metrics, name string) string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if mf.GetName() != name || mf.GetType() != dto.MetricType_SUMMARY {
			continue
		}
		for _, mm := range mf.GetMetric() {
			var ls []string
			for _, l := range mm.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			fmt.Fprintf(&b, "%s{%s} %d %g\n", name, strings.Join(ls, ","), mm.GetSummary().GetSampleCount(), mm.GetSummary().GetSampleSum())
		}
	}
	return b.String()
}

// RTT: a summary of the samples per dependency, the last interval's
// minimum and maximum; no series before the first sample.
func TestRTTPerDependency(t *testing.T) {
	m := New(Options{})
	rtt := func(n, sum, lo, hi uint64) tracer.Counters {
		return tracer.Counters{Connections: 1, RTTSamples: n, RTTSumUs: sum, RTTMinUs: lo, RTTMaxUs: hi}
	}
	m.ObserveInterval(tracer.Interval{Flows: []tracer.Flow{
		outbound(1, "10.0.1.9", "10.0.1.10", 3306, rtt(2, 3000, 1000, 2000)),
		outbound(2, "10.0.1.9", "10.0.1.10", 3306, rtt(1, 500, 500, 500)),
		outbound(3, "10.0.1.9", "10.0.1.11", 6379, tracer.Counters{Connections: 1}),
		inbound(7, "10.0.1.9", rtt(1, 700, 700, 700)),
	}}, hostOf, 0)
	m.ObserveInterval(tracer.Interval{Flows: []tracer.Flow{outbound(1, "10.0.1.9", "10.0.1.10", 3306, rtt(1, 4000, 4000, 4000))}}, hostOf, 0)
	got := summaries(t, m, "deptrace_outbound_rtt_seconds") + summaries(t, m, "deptrace_inbound_rtt_seconds") +
		scrape(t, m, "deptrace_outbound_rtt_min_seconds", "deptrace_outbound_rtt_max_seconds", "deptrace_inbound_rtt_max_seconds")
	want := `deptrace_outbound_rtt_seconds{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 4 0.0075
deptrace_inbound_rtt_seconds{host=db-1,port=3306,process=mysqld,proto=tcp} 1 0.0007
deptrace_outbound_rtt_min_seconds{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0.004
deptrace_outbound_rtt_max_seconds{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0.004
deptrace_inbound_rtt_max_seconds{host=db-1,port=3306,process=mysqld,proto=tcp} 0.0007
`
	if !sameLines(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	// One interval of two flows: the minimum and maximum over both.
	m2 := New(Options{})
	m2.ObserveInterval(tracer.Interval{Flows: []tracer.Flow{
		outbound(1, "10.0.1.9", "10.0.1.10", 3306, rtt(2, 3000, 1000, 2000)),
		outbound(2, "10.0.1.9", "10.0.1.10", 3306, rtt(1, 500, 500, 500)),
	}}, hostOf, 0)
	got = scrape(t, m2, "deptrace_outbound_rtt_min_seconds", "deptrace_outbound_rtt_max_seconds")
	want = `deptrace_outbound_rtt_min_seconds{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0.0005
deptrace_outbound_rtt_max_seconds{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0.002
`
	if !sameLines(got, want) {
		t.Errorf("one interval: got:\n%s\nwant:\n%s", got, want)
	}
}

// Remote names are no label unless asked for; then bounded, past the cap
// _other, counted.
func TestRemoteNamesOnlyWhenAsked(t *testing.T) {
	named := func(addr, name string) tracer.Flow {
		f := outbound(1, "10.0.1.9", addr, 443, tracer.Counters{Connections: 1})
		f.RemoteName = name
		return f
	}
	iv := tracer.Interval{Flows: []tracer.Flow{named("203.0.113.7", "api.example.com"), named("203.0.113.8", "cdn.example.com"),
		named("203.0.113.9", "www.example.com"), named("203.0.113.10", "")}}
	m := New(Options{})
	m.ObserveInterval(iv, hostOf, 0)
	for _, line := range strings.Split(exposition(t, m), "\n") {
		if !strings.HasPrefix(line, "#") && (strings.Contains(line, "example.com") || strings.Contains(line, "remote_name=")) {
			t.Errorf("a name in the labels without RemoteNames: %s", line)
		}
	}
	mn := New(Options{RemoteNames: true, MaxRemoteNames: 2})
	mn.ObserveInterval(iv, hostOf, 0)
	got := scrape(t, mn, "deptrace_outbound_connections_total", "deptrace_metrics_remote_names_capped_total")
	want := `deptrace_outbound_connections_total{host=web-1,port=443,process=php-fpm,proto=tcp,remote=203.0.113.7,remote_name=api.example.com} 1
deptrace_outbound_connections_total{host=web-1,port=443,process=php-fpm,proto=tcp,remote=203.0.113.8,remote_name=cdn.example.com} 1
deptrace_outbound_connections_total{host=web-1,port=443,process=php-fpm,proto=tcp,remote=203.0.113.9,remote_name=_other} 1
deptrace_outbound_connections_total{host=web-1,port=443,process=php-fpm,proto=tcp,remote=203.0.113.10,remote_name=} 1
deptrace_metrics_remote_names_capped_total{} 1
`
	if !sameLines(got, want) {
		t.Errorf("with RemoteNames got:\n%s\nwant:\n%s", got, want)
	}
}

func dnsRecord(ns uint32, comm, workload, resolver string, c tracer.DNSCounters) tracer.DNS {
	return tracer.DNS{Kind: tracer.KindDNS, NetNS: ns, Comm: comm, Identity: tracer.Identity{Workload: workload}, Proto: tracer.ProtoUDP, Resolver: resolver, DNSCounters: c}
}

// DNS counters per client and resolver, answers by rcode, latency as a
// summary and the last interval's maximum; clients and resolvers past
// their caps fold into _other and are counted; idle series expire.
func TestDNSSeries(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	m := New(Options{MaxDNSClients: 2, MaxDNSResolvers: 2, TTL: time.Minute, Now: clk.now})
	m.ObserveInterval(tracer.Interval{DNS: []tracer.DNS{
		dnsRecord(1, "php-fpm", "", "127.0.0.53:53", tracer.DNSCounters{Queries: 10, Answers: 9, NoError: 7, NXDomain: 2, Timeouts: 1, LatencyCount: 9, LatencySumUs: 900, LatencyMaxUs: 400}),
		dnsRecord(2, "checkout", "Deployment/checkout", "10.96.0.10:53", tracer.DNSCounters{Queries: 4, Answers: 4, ServFail: 3, OtherErrors: 1, Unparsed: 2}),
		dnsRecord(2, "cron", "", "10.96.0.10:53", tracer.DNSCounters{Queries: 1}),    // a third client
		dnsRecord(1, "php-fpm", "", "192.0.2.53:53", tracer.DNSCounters{Queries: 1}), // a third resolver
	}}, hostOf, 0)
	clk.advance(10 * time.Second)
	m.ObserveInterval(tracer.Interval{DNS: []tracer.DNS{
		dnsRecord(1, "php-fpm", "", "127.0.0.53:53", tracer.DNSCounters{Queries: 5, Answers: 5, NoError: 5, LatencyCount: 5, LatencySumUs: 100, LatencyMaxUs: 30}),
	}}, hostOf, 0)
	got := scrape(t, m, "deptrace_dns_queries_total", "deptrace_dns_answers_total", "deptrace_dns_timeouts_total", "deptrace_dns_unparsed_total",
		"deptrace_dns_latency_max_seconds", "deptrace_metrics_dns_capped_total") + summaries(t, m, "deptrace_dns_latency_seconds")
	l1 := "host=web-1,process=php-fpm,proto=udp,resolver=127.0.0.53:53,workload="
	l2 := "host=db-1,process=checkout,proto=udp,resolver=10.96.0.10:53,workload=Deployment/checkout"
	l3 := "host=_other,process=_other,proto=udp,resolver=10.96.0.10:53,workload=_other"
	l4 := "host=web-1,process=php-fpm,proto=udp,resolver=_other,workload="
	var want strings.Builder
	for _, l := range []struct {
		labels                                     string
		q, noerr, nx, sf, other, to, unparsed, cnt uint64
		max, sum                                   float64
	}{{l1, 15, 12, 2, 0, 0, 1, 0, 14, 0.00003, 0.001}, {l2, 4, 0, 0, 3, 1, 0, 2, 0, 0, 0}, {l3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {l4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		fmt.Fprintf(&want, "deptrace_dns_queries_total{%s} %d\n", l.labels, l.q)
		for _, rc := range []struct {
			name string
			n    uint64
		}{{"noerror", l.noerr}, {"nxdomain", l.nx}, {"other", l.other}, {"servfail", l.sf}} {
			fmt.Fprintf(&want, "deptrace_dns_answers_total{%s} %d\n", strings.Replace(l.labels, ",resolver=", ",rcode="+rc.name+",resolver=", 1), rc.n)
		}
		fmt.Fprintf(&want, "deptrace_dns_timeouts_total{%s} %d\ndeptrace_dns_unparsed_total{%s} %d\ndeptrace_dns_latency_max_seconds{%s} %g\ndeptrace_dns_latency_seconds{%s} %d %g\n",
			l.labels, l.to, l.labels, l.unparsed, l.labels, l.max, l.labels, l.cnt, l.sum)
	}
	want.WriteString("deptrace_metrics_dns_capped_total{} 2\n")
	if !sameLines(got, want.String()) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want.String())
	}
	clk.advance(55 * time.Second) // all but php-fpm's local stub idle 65 s
	if got := scrape(t, m, "deptrace_dns_queries_total"); !sameLines(got, "deptrace_dns_queries_total{"+l1+"} 15\n") {
		t.Errorf("after the TTL:\n%s", got)
	}
}
