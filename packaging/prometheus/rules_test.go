// Package prometheus_test checks deptrace-rules.yml, the Prometheus rules
// that carry the graph's health rules over to deptrace's metrics, with
// promtool (Debian's prometheus package): the file must load, and every
// alert must fire, at the severity the graph gives, exactly where
// internal/graph judges the same counters unhealthy (critical) or
// degraded (warning).
package prometheus_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/tracer"
)

const rulesFile = "deptrace-rules.yml"

func TestRulesLoad(t *testing.T) {
	promtool := dockertest.Need(t, "promtool", "prometheus")
	out, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// ruleTest collects input series and the ALERTS samples expected at the
// end of a promtool unit test.
type ruleTest struct {
	series   []string
	expected []string
}

// counter adds a series that is 0 for the first 5 minutes and then n:
// its increase over the 5-minute window that ends at 10m is exactly n
// (the window holds samples from 5m to 10m, so nothing is extrapolated).
func (r *ruleTest) counter(name, labels string, n uint64) {
	r.series = append(r.series, fmt.Sprintf("  - series: '%s{%s}'\n    values: '0x5 %dx4'", name, labels, n))
}

// expect records the alert the graph's verdict st calls for.
func (r *ruleTest) expect(alert, st, labels string) {
	sev := map[string]string{graph.HealthUnhealthy: "critical", graph.HealthDegraded: "warning"}[st]
	if sev == "" {
		return
	}
	r.expected = append(r.expected, fmt.Sprintf("      - labels: 'ALERTS{alertname=\"%s\",alertstate=\"firing\",severity=\"%s\",%s}'\n        value: 1", alert, sev, labels))
}

func (r *ruleTest) run(t *testing.T) {
	t.Helper()
	promtool := dockertest.Need(t, "promtool", "prometheus")
	abs, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	exp := "    exp_samples: []"
	if len(r.expected) > 0 {
		exp = "    exp_samples:\n" + strings.Join(r.expected, "\n")
	}
	text := fmt.Sprintf(`rule_files: [%q]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
%s
  promql_expr_test:
  - expr: ALERTS{alertstate="firing"}
    eval_time: 10m
%s
`, abs, strings.Join(r.series, "\n"), exp)
	file := filepath.Join(t.TempDir(), "test.yml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s\n%d alerts expected from the graph's verdicts", err, out, len(r.expected))
	}
}

// edgeHealth is the graph's verdict on one edge's counters.
func edgeHealth(c tracer.Counters) string {
	g := graph.Graph{
		Nodes: []graph.Node{{ID: "a"}, {ID: "b"}},
		Edges: []graph.Edge{{From: "a", To: "b", Proto: "tcp", Port: 80, Counters: c}},
	}
	g.Judge(graph.DefaultHealth)
	return g.Edges[0].Health
}

// TestEdgeAlertsFollowTheGraph runs a grid of per-dependency counters
// around each rule's thresholds through the rules and through the graph,
// one rule at a time (each alert names one rule), and needs the same
// verdict from both: one retransmission in 90 connections alerts
// nowhere, three failed connects of 300 attempts are critical.
func TestEdgeAlertsFollowTheGraph(t *testing.T) {
	var r ruleTest
	conns := []uint64{0, 1, 50, 90, 100, 199, 200, 297, 300, 600, 1000}
	events := []uint64{0, 1, 2, 3, 4, 6, 10, 20, 61}
	port, fired, quiet := 0, 0, 0
	for _, c := range conns {
		for _, n := range events {
			for _, rule := range []struct {
				alert string
				set   func(*tracer.Counters)
				feed  func(labels string)
			}{
				{"DeptraceFailedConnections", func(x *tracer.Counters) { x.FailedConnections = n }, func(l string) {
					r.counter("deptrace_outbound_failed_connections_total", l, n)
				}},
				{"DeptraceResets", func(x *tracer.Counters) { x.ResetsSent, x.ResetsReceived = n/2, n-n/2 }, func(l string) {
					r.counter("deptrace_outbound_sent_resets_total", l, n/2)
					r.counter("deptrace_outbound_received_resets_total", l, n-n/2)
				}},
				{"DeptraceRetransmits", func(x *tracer.Counters) { x.Retransmits = n }, func(l string) {
					r.counter("deptrace_outbound_retransmits_total", l, n)
				}},
			} {
				port++
				labels := fmt.Sprintf(`host="web-1",process="app",remote="192.0.2.10",port="%d",proto="tcp"`, port)
				cs := tracer.Counters{Connections: c}
				rule.set(&cs)
				r.counter("deptrace_outbound_connections_total", labels, c)
				rule.feed(labels)
				st := edgeHealth(cs)
				r.expect(rule.alert, st, labels)
				if st == graph.HealthOK {
					quiet++
				} else {
					fired++
				}
			}
		}
	}
	// The grid must reach both sides of the thresholds, or it proves
	// nothing about them.
	if fired < 50 || quiet < 50 {
		t.Fatalf("grid gives %d alerts and %d quiet cases; want both sides of every threshold", fired, quiet)
	}
	if st := edgeHealth(tracer.Counters{Connections: 90, Retransmits: 1}); st != graph.HealthOK {
		t.Fatalf("graph: one retransmit in 90 connections is %s, want ok", st)
	}
	r.run(t)
}

// TestListenAndDNSAlertsFollowTheGraph does the same for a service's
// listen drops (over the connections its clients made + the drops) and
// a client's lookups through a resolver.
func TestListenAndDNSAlertsFollowTheGraph(t *testing.T) {
	var r ruleTest
	port, fired := 0, 0
	for _, accepted := range []uint64{0, 1, 100, 197, 297, 400, 1000} {
		for _, drops := range []uint64{0, 1, 2, 3, 5, 30} {
			port++
			g := graph.Graph{
				Nodes: []graph.Node{{ID: "client"}, {ID: "server", Services: []graph.Service{{Proto: "tcp", Port: uint16(port), Listener: &graph.ListenerState{Drops: drops}}}}},
				Edges: []graph.Edge{{From: "client", To: "server", Proto: "tcp", Port: uint16(port), Counters: tracer.Counters{Connections: accepted}}},
			}
			g.Judge(graph.DefaultHealth)
			st := g.Nodes[1].Services[0].Health
			labels := fmt.Sprintf(`host="db-1",process="postgres",port="%d"`, port)
			r.counter("deptrace_listener_drops_total", labels, drops)
			// Two clients' inbound series, which the rule sums.
			r.counter("deptrace_inbound_connections_total", labels+`,proto="tcp",client="192.0.2.1"`, accepted/2)
			r.counter("deptrace_inbound_connections_total", labels+`,proto="tcp",client="192.0.2.2"`, accepted-accepted/2)
			r.expect("DeptraceListenDrops", st, labels)
			if st != graph.HealthOK {
				fired++
			}
		}
	}
	for _, q := range []uint64{0, 1, 20, 40, 60, 100, 120, 1000} {
		for _, errs := range []uint64{0, 1, 2, 3, 5, 6, 50} {
			for _, nx := range []uint64{0, 3} {
				port++
				d := graph.DNSStats{Proto: "udp", Resolver: "127.0.0.53:53", DNSCounters: tracer.DNSCounters{
					Queries: q, ServFail: errs / 3, Timeouts: errs - errs/3, NXDomain: nx,
				}}
				if nx == 0 && q > errs {
					d.NoError = q - errs
				}
				d.Answers = d.NoError + d.NXDomain + d.ServFail
				d.Judge(graph.DefaultDNSHealth)
				labels := fmt.Sprintf(`host="web-1",process="app",workload="",resolver="127.0.0.53:%d",proto="udp"`, port)
				r.counter("deptrace_dns_queries_total", labels, q)
				r.counter("deptrace_dns_timeouts_total", labels, d.Timeouts)
				for _, a := range []struct {
					rcode string
					n     uint64
				}{{"noerror", d.NoError}, {"nxdomain", d.NXDomain}, {"servfail", d.ServFail}, {"other", 0}} {
					r.counter("deptrace_dns_answers_total", labels+`,rcode="`+a.rcode+`"`, a.n)
				}
				// Two alerts judge what the graph judges as one: errors,
				// and NXDOMAIN without any address.
				errSt := graph.HealthOK
				if errs > 0 {
					e := d
					e.NXDomain, e.NoError = 0, 1
					e.Judge(graph.DefaultDNSHealth)
					errSt = e.Health
				}
				nxSt := graph.HealthOK
				if nx >= graph.DefaultDNSHealth.MinEvents && d.NoError == 0 {
					nxSt = graph.HealthUnhealthy
				}
				if worst := worse(errSt, nxSt); worst != d.Health {
					t.Fatalf("dns %+v: graph says %s, the two rules %s and %s", d.DNSCounters, d.Health, errSt, nxSt)
				}
				r.expect("DeptraceDNSErrors", errSt, labels)
				r.expect("DeptraceDNSNXDomain", nxSt, labels)
				if d.Health != graph.HealthOK {
					fired++
				}
			}
		}
	}
	if fired < 20 {
		t.Fatalf("only %d cases alert; the grid misses the thresholds", fired)
	}
	r.run(t)
}

// worse is the worse of two health states.
func worse(a, b string) string {
	rank := map[string]int{graph.HealthOK: 0, graph.HealthDegraded: 1, graph.HealthUnhealthy: 2}
	if rank[b] > rank[a] {
		return b
	}
	return a
}
