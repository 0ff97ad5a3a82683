package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deptrace/deptrace/tracer"
)

// dnsKey is one DNS series' labels: the client (its host, process and
// workload, "" for a plain process) and the resolver as it addressed it.
// Every value is bounded: clients by MaxDNSClients, resolvers by
// MaxDNSResolvers (past either, OtherIdentity); names never are labels.
type dnsKey struct {
	host, process, workload string
	resolver, proto         string
}

type dnsSeries struct {
	c tracer.DNSCounters
	// maxUs is the answer latency's maximum over the last interval with
	// answers.
	maxUs uint64
	gen   uint64
	seen  time.Time
}

// dnsCollector holds each client's DNS counters and hands them to
// Prometheus at each scrape, with the same TTL as the dependency series.
type dnsCollector struct {
	opt Options

	queries, answers, timeouts, unparsed, latency, latencyMax, capped *prometheus.Desc

	mu        sync.Mutex
	series    map[dnsKey]*dnsSeries
	clients   map[[3]string]time.Time
	resolvers map[string]time.Time
	nCapped   uint64
	gen       uint64
}

func newDNSCollector(o Options) *dnsCollector {
	l := []string{"host", "process", "workload", "resolver", "proto"}
	return &dnsCollector{
		opt:      o,
		queries:  prometheus.NewDesc("deptrace_dns_queries_total", "DNS queries a client sent to a resolver.", l, nil),
		answers:  prometheus.NewDesc("deptrace_dns_answers_total", "DNS answers a client received, by response code: noerror, nxdomain, servfail, other.", append(l, "rcode"), nil),
		timeouts: prometheus.NewDesc("deptrace_dns_timeouts_total", "DNS queries that got no answer within the DNS watcher's timeout.", l, nil),
		unparsed: prometheus.NewDesc("deptrace_dns_unparsed_total", "DNS messages of a client the watcher could not parse or read.", l, nil),
		latency: prometheus.NewDesc("deptrace_dns_latency_seconds",
			"Time from a DNS query to its answer: _sum and _count over the answered queries, no quantiles.", l, nil),
		latencyMax: prometheus.NewDesc("deptrace_dns_latency_max_seconds", "Slowest DNS answer of the last interval that had answers.", l, nil),
		capped: prometheus.NewDesc("deptrace_metrics_dns_capped_total",
			"DNS records labelled \""+OtherIdentity+"\" because the cap on distinct clients or resolvers was reached.", nil, nil),
		series:    map[dnsKey]*dnsSeries{},
		clients:   map[[3]string]time.Time{},
		resolvers: map[string]time.Time{},
	}
}

func (c *dnsCollector) add(ds []tracer.DNS, host func(uint32) string) {
	if len(ds) == 0 {
		return
	}
	now := c.opt.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	c.gen++
	for _, d := range ds {
		client := [3]string{utf8(host(d.NetNS)), utf8(d.Comm), utf8(d.Workload)}
		if _, ok := c.clients[client]; !ok && len(c.clients) >= c.opt.MaxDNSClients {
			client = [3]string{OtherIdentity, OtherIdentity, OtherIdentity}
			c.nCapped++
		} else {
			c.clients[client] = now
		}
		resolver := utf8(d.Resolver)
		if _, ok := c.resolvers[resolver]; !ok && len(c.resolvers) >= c.opt.MaxDNSResolvers {
			resolver = OtherIdentity
			c.nCapped++
		} else {
			c.resolvers[resolver] = now
		}
		k := dnsKey{client[0], client[1], client[2], resolver, string(d.Proto)}
		s := c.series[k]
		if s == nil {
			if len(c.series) >= c.opt.MaxSeries {
				c.nCapped++
				continue
			}
			s = &dnsSeries{}
			c.series[k] = s
		}
		if d.LatencyCount > 0 {
			if s.gen == c.gen {
				s.maxUs = max(s.maxUs, d.LatencyMaxUs)
			} else {
				s.maxUs, s.gen = d.LatencyMaxUs, c.gen
			}
		}
		s.c.Add(d.DNSCounters)
		s.seen = now
	}
}

// expire drops series, clients and resolvers idle for longer than the
// TTL; c.mu is held.
func (c *dnsCollector) expire(now time.Time) {
	for k, s := range c.series {
		if now.Sub(s.seen) > c.opt.TTL {
			delete(c.series, k)
		}
	}
	for k, seen := range c.clients {
		if now.Sub(seen) > c.opt.TTL {
			delete(c.clients, k)
		}
	}
	for k, seen := range c.resolvers {
		if now.Sub(seen) > c.opt.TTL {
			delete(c.resolvers, k)
		}
	}
}

// Describe implements prometheus.Collector.
func (c *dnsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.queries, c.answers, c.timeouts, c.unparsed, c.latency, c.latencyMax, c.capped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *dnsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(c.opt.Now())
	for k, s := range c.series {
		lv := []string{k.host, k.process, k.workload, k.resolver, k.proto}
		ch <- prometheus.MustNewConstMetric(c.queries, prometheus.CounterValue, float64(s.c.Queries), lv...)
		for _, a := range []struct {
			rcode string
			n     uint64
		}{{"noerror", s.c.NoError}, {"nxdomain", s.c.NXDomain}, {"servfail", s.c.ServFail}, {"other", s.c.OtherErrors}} {
			ch <- prometheus.MustNewConstMetric(c.answers, prometheus.CounterValue, float64(a.n), append(lv, a.rcode)...)
		}
		ch <- prometheus.MustNewConstMetric(c.timeouts, prometheus.CounterValue, float64(s.c.Timeouts), lv...)
		ch <- prometheus.MustNewConstMetric(c.unparsed, prometheus.CounterValue, float64(s.c.Unparsed), lv...)
		ch <- prometheus.MustNewConstSummary(c.latency, s.c.LatencyCount, float64(s.c.LatencySumUs)/1e6, nil, lv...)
		ch <- prometheus.MustNewConstMetric(c.latencyMax, prometheus.GaugeValue, float64(s.maxUs)/1e6, lv...)
	}
	ch <- prometheus.MustNewConstMetric(c.capped, prometheus.CounterValue, float64(c.nCapped))
}
