package metrics

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deptrace/deptrace/tracer"
)

// clock is a settable clock for TTL tests.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func hostOf(ns uint32) string {
	if ns == 1 {
		return "web-1"
	}
	return "db-1"
}

func outbound(pid uint32, local, remote string, port uint16, c tracer.Counters) tracer.Flow {
	return tracer.Flow{Kind: tracer.KindFlow, NetNS: 1, Proto: tracer.ProtoTCP, Direction: tracer.Outbound,
		LocalAddr: local, RemoteAddr: remote, Port: port, PID: pid, Comm: "php-fpm", Counters: c}
}

func inbound(pid uint32, client string, c tracer.Counters) tracer.Flow {
	return tracer.Flow{Kind: tracer.KindFlow, NetNS: 2, Proto: tracer.ProtoTCP, Direction: tracer.Inbound,
		LocalAddr: "10.0.1.10", RemoteAddr: client, Port: 3306, PID: pid, Comm: "mysqld", Counters: c}
}

// scrape returns the exposition text of the given metric names.
func scrape(t *testing.T, m *Metrics, names ...string) string {
	t.Helper()
	var b strings.Builder
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, n := range names {
			if mf.GetName() == n {
				for _, mm := range mf.GetMetric() {
					b.WriteString(n + "{")
					for i, l := range mm.GetLabel() {
						if i > 0 {
							b.WriteString(",")
						}
						b.WriteString(l.GetName() + "=" + l.GetValue())
					}
					var v float64
					switch {
					case mm.GetCounter() != nil:
						v = mm.GetCounter().GetValue()
					case mm.GetGauge() != nil:
						v = mm.GetGauge().GetValue()
					}
					b.WriteString("} " + strconv.FormatFloat(v, 'g', -1, 64) + "\n")
				}
			}
		}
	}
	return b.String()
}

// Flows that differ only by pid and client address (an ephemeral port is
// never in a flow) are one outbound series; inbound clients aggregate
// unless ClientAddr is on.
func TestLabelsAreBounded(t *testing.T) {
	m := New(Options{})
	iv := tracer.Interval{Flows: []tracer.Flow{
		outbound(100, "10.0.1.9", "10.0.1.10", 3306, tracer.Counters{Connections: 2, BytesSent: 10}),
		outbound(101, "10.0.1.9", "10.0.1.10", 3306, tracer.Counters{Connections: 3, BytesSent: 5, FailedConnections: 1, FailedRefused: 1}),
		outbound(102, "10.0.1.8", "10.0.1.10", 3306, tracer.Counters{Connections: 1}),
		inbound(7, "10.0.1.9", tracer.Counters{Connections: 5, BytesReceived: 15}),
		inbound(8, "10.0.2.1", tracer.Counters{Connections: 1, BytesReceived: 1}),
	}}
	m.ObserveInterval(iv, hostOf, time.Millisecond)
	got := scrape(t, m, "deptrace_outbound_connections_total", "deptrace_outbound_sent_bytes_total", "deptrace_inbound_connections_total", "deptrace_inbound_received_bytes_total", "deptrace_outbound_failed_connections_by_cause_total")
	want := `deptrace_outbound_connections_total{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 6
deptrace_outbound_sent_bytes_total{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 15
deptrace_inbound_connections_total{host=db-1,port=3306,process=mysqld,proto=tcp} 6
deptrace_inbound_received_bytes_total{host=db-1,port=3306,process=mysqld,proto=tcp} 16
deptrace_outbound_failed_connections_by_cause_total{cause=refused,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 1
deptrace_outbound_failed_connections_by_cause_total{cause=reset,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0
deptrace_outbound_failed_connections_by_cause_total{cause=timeout,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0
deptrace_outbound_failed_connections_by_cause_total{cause=unreachable,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 0
`
	if !sameLines(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	for _, bad := range []string{"pid", "10.0.1.9", "10.0.1.8", "10.0.2.1", "local"} {
		text := exposition(t, m)
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "deptrace_") && strings.Contains(line, bad) {
				t.Errorf("unbounded value %q in a label: %s", bad, line)
			}
		}
	}

	// The opt-in client label splits inbound series by client address.
	mc := New(Options{ClientAddr: true})
	mc.ObserveInterval(iv, hostOf, time.Millisecond)
	got = scrape(t, mc, "deptrace_inbound_connections_total")
	want = `deptrace_inbound_connections_total{client=10.0.1.9,host=db-1,port=3306,process=mysqld,proto=tcp} 5
deptrace_inbound_connections_total{client=10.0.2.1,host=db-1,port=3306,process=mysqld,proto=tcp} 1
`
	if !sameLines(got, want) {
		t.Errorf("with ClientAddr got:\n%s\nwant:\n%s", got, want)
	}
}

// Counters are cumulative across intervals; a series idle longer than the
// TTL disappears, and comes back from zero when its flow returns.
func TestSeriesExpireAfterTTL(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	m := New(Options{TTL: time.Minute, Now: clk.now})
	a := outbound(1, "10.0.1.9", "10.0.1.10", 3306, tracer.Counters{Connections: 2})
	b := outbound(1, "10.0.1.9", "10.0.1.11", 6379, tracer.Counters{Connections: 1})
	m.ObserveInterval(tracer.Interval{Flows: []tracer.Flow{a, b}}, hostOf, 0)
	clk.advance(40 * time.Second)
	m.ObserveInterval(tracer.Interval{Flows: []tracer.Flow{a}}, hostOf, 0)
	if n := testutil.CollectAndCount(m.deps, "deptrace_outbound_connections_total"); n != 2 {
		t.Fatalf("after 40 s: %d series, want 2", n)
	}
	clk.advance(30 * time.Second) // b idle 70 s, a 30 s
	got := scrape(t, m, "deptrace_outbound_connections_total", "deptrace_metrics_series_expired_total")
	want := `deptrace_outbound_connections_total{host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10} 4
deptrace_metrics_series_expired_total{} 1
`
	if !sameLines(got, want) {
		t.Errorf("after b's TTL got:\n%s\nwant:\n%s", got, want)
	}
	clk.advance(time.Minute) // a idle 90 s too
	if n := testutil.CollectAndCount(m.deps, "deptrace_outbound_connections_total"); n != 0 {
		t.Errorf("after every TTL: %d series, want 0", n)
	}
	m.ObserveInterval(tracer.Interval{Flows: []tracer.Flow{b}}, hostOf, 0)
	got = scrape(t, m, "deptrace_outbound_connections_total")
	want = "deptrace_outbound_connections_total{host=web-1,port=6379,process=php-fpm,proto=tcp,remote=10.0.1.11} 1\n"
	if got != want {
		t.Errorf("returning series got:\n%s\nwant:\n%s", got, want)
	}
}

// Past MaxSeries a flow without a series counts in its direction and
// protocol's _other series (and is counted as dropped); existing series
// still count, and the sum over series is the whole traffic.
func TestSeriesLimit(t *testing.T) {
	m := New(Options{MaxSeries: 2})
	var flows []tracer.Flow
	for i := range 5 {
		flows = append(flows, outbound(1, "10.0.1.9", "10.0.1.10", uint16(1000+i), tracer.Counters{Connections: 1}))
	}
	m.ObserveInterval(tracer.Interval{Flows: flows}, hostOf, 0)
	m.ObserveInterval(tracer.Interval{Flows: flows[:1]}, hostOf, 0)
	got := scrape(t, m, "deptrace_outbound_connections_total", "deptrace_metrics_series_dropped_total", "deptrace_metrics_series")
	want := `deptrace_outbound_connections_total{host=web-1,port=1000,process=php-fpm,proto=tcp,remote=10.0.1.10} 2
deptrace_outbound_connections_total{host=web-1,port=1001,process=php-fpm,proto=tcp,remote=10.0.1.10} 1
deptrace_outbound_connections_total{host=_other,port=0,process=_other,proto=tcp,remote=_other} 3
deptrace_metrics_series_dropped_total{} 3
deptrace_metrics_series{} 3
`
	if !sameLines(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// UDP and unix series carry datagrams, not TCP health; a unix outbound
// series is named by its socket path; inbound unix has no port.
func TestProtocolsAndSelfMetrics(t *testing.T) {
	m := New(Options{FlowMapSize: 1024})
	iv := tracer.Interval{
		Flows: []tracer.Flow{
			{NetNS: 1, Proto: tracer.ProtoUDP, Direction: tracer.Outbound, LocalAddr: "10.0.1.9", RemoteAddr: "10.0.0.53", Port: 53, Comm: "resolver",
				Counters: tracer.Counters{DatagramsSent: 4, DatagramsReceived: 4, BytesSent: 120, BytesReceived: 400}},
			{NetNS: 1, Proto: tracer.ProtoUnix, Direction: tracer.Outbound, LocalAddr: "", RemoteAddr: "/run/pg/.s.PGSQL.5432", Comm: "app\xff",
				Counters: tracer.Counters{Connections: 3}},
			{NetNS: 2, Proto: tracer.ProtoUnix, Direction: tracer.Inbound, LocalAddr: "/run/pg/.s.PGSQL.5432", Comm: "postgres",
				Counters: tracer.Counters{Connections: 3}},
			{NetNS: 1, Proto: tracer.ProtoTCP, Direction: tracer.Outbound, LocalAddr: "10.0.1.9", RemoteAddr: "10.0.1.10", Port: 80, Comm: "curl",
				Counters: tracer.Counters{Connections: 2, ConnectLatencyCount: 2, ConnectLatencySumUs: 1500, Retransmits: 1}},
		},
		Lost: tracer.Losses{FlowMapFull: 7, UDPPeerUnknown: 1},
	}
	m.ObserveInterval(iv, hostOf, 3*time.Millisecond)
	text := exposition(t, m)
	for _, w := range []string{
		`deptrace_outbound_sent_datagrams_total{host="web-1",port="53",process="resolver",proto="udp",remote="10.0.0.53"} 4`,
		`deptrace_outbound_connections_total{host="web-1",port="",process="app` + "\uFFFD" + `",proto="unix",remote="/run/pg/.s.PGSQL.5432"} 3`,
		`deptrace_inbound_connections_total{host="db-1",port="",process="postgres",proto="unix"} 3`,
		`deptrace_outbound_connect_latency_seconds_sum{host="web-1",port="80",process="curl",proto="tcp",remote="10.0.1.10"} 0.0015`,
		`deptrace_outbound_connect_latency_seconds_count{host="web-1",port="80",process="curl",proto="tcp",remote="10.0.1.10"} 2`,
		`deptrace_outbound_retransmits_total{host="web-1",port="80",process="curl",proto="tcp",remote="10.0.1.10"} 1`,
		`deptrace_events_lost_total{reason="flow_map_full"} 7`,
		`deptrace_events_lost_total{reason="udp_peer_unknown"} 1`,
		`deptrace_events_lost_total{reason="recursion_misses"} 0`,
		`deptrace_flow_map_capacity 1024`,
		`deptrace_last_drain_flows 4`,
		`deptrace_flows_total 4`,
		`deptrace_drain_duration_seconds_count 1`,
		`deptrace_drain_duration_seconds_sum 0.003`,
	} {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("missing line %s", w)
		}
	}
	for _, bad := range []string{`deptrace_outbound_retransmits_total{host="web-1",port="53"`, `deptrace_outbound_sent_datagrams_total{host="web-1",port="80"`,
		`deptrace_outbound_failed_connections_by_cause_total{cause="refused",host="web-1",port="80"`} { // no failure yet: no cause series
		if strings.Contains(text, bad) {
			t.Errorf("metric for the wrong protocol: %s", bad)
		}
	}
}

func TestListenersStoreAndSpool(t *testing.T) {
	m := New(Options{})
	ls := []tracer.Listener{{Kind: tracer.KindListener, NetNS: 2, Proto: tracer.ProtoTCP, LocalAddr: "0.0.0.0", Port: 80, PID: 9, Comm: "nginx", BacklogLimit: 511, QueueMax: 12, Drops: 3}}
	m.ObserveListeners(ls, hostOf)
	ls[0].QueueMax, ls[0].Drops = 4, 2
	m.ObserveListeners(ls, hostOf)
	m.StoreWriteError()
	m.StoreWriteError()
	m.SetSpool(4096, 1)
	got := scrape(t, m, "deptrace_listener_drops_total", "deptrace_listener_queue_max", "deptrace_listener_backlog_limit", "deptrace_store_write_errors_total", "deptrace_spool_bytes", "deptrace_spool_dropped_batches_total")
	want := `deptrace_listener_drops_total{host=db-1,port=80,process=nginx} 5
deptrace_listener_queue_max{host=db-1,port=80,process=nginx} 4
deptrace_listener_backlog_limit{host=db-1,port=80,process=nginx} 511
deptrace_store_write_errors_total{} 2
deptrace_spool_bytes{} 4096
deptrace_spool_dropped_batches_total{} 1
`
	if !sameLines(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	var nilM *Metrics // disabled metrics record nothing and do not panic
	nilM.ObserveInterval(tracer.Interval{}, hostOf, 0)
	nilM.ObserveListeners(ls, hostOf)
	nilM.StoreWriteError()
	nilM.SetSpool(1, 1)
}

func TestServeAndCheckListen(t *testing.T) {
	for _, bad := range []string{"9477", "localhost", "127.0.0.1:"} {
		err := CheckListen(bad)
		if err == nil || !strings.Contains(err.Error(), "--metrics-listen") {
			t.Errorf("CheckListen(%q) = %v, want an error naming --metrics-listen", bad, err)
		}
	}
	if err := CheckListen(""); err != nil {
		t.Errorf("empty listen (disabled): %v", err)
	}
	// The port is checked with the syntax, not first at listen ("listen
	// tcp: address 99999: invalid port", without what is allowed).
	const allowed = `allowed host:port with a port from 1 to 65535 (0: any free one), e.g. 127.0.0.1:9477, or "" to disable`
	for _, c := range []struct{ addr, want string }{
		{"8.8.8.8:99999", `invalid --metrics-listen "8.8.8.8:99999": port 99999 is out of range; ` + allowed},
		{"127.0.0.1:65536", `invalid --metrics-listen "127.0.0.1:65536": port 65536 is out of range; ` + allowed},
		{"127.0.0.1:-1", `invalid --metrics-listen "127.0.0.1:-1": port -1 is out of range; ` + allowed},
		{"127.0.0.1:nosuchservice", `invalid --metrics-listen "127.0.0.1:nosuchservice": port "nosuchservice" is neither a number nor a known service; ` + allowed},
		{"9477", `invalid --metrics-listen "9477": ` + allowed},
		{"127.0.0.1:", `invalid --metrics-listen "127.0.0.1:": ` + allowed},
	} {
		if err := CheckListen(c.addr); err == nil || err.Error() != c.want {
			t.Errorf("CheckListen(%q) = %v,\nwant %s", c.addr, err, c.want)
		}
	}
	for _, ok := range []string{"127.0.0.1:0", "127.0.0.1:1", "[::1]:65535", "0.0.0.0:9477"} {
		if err := CheckListen(ok); err != nil {
			t.Errorf("CheckListen(%q) = %v, want nil", ok, err)
		}
	}
	m := New(Options{})
	m.StoreWriteError()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Serve(ctx, addr.String(), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--metrics-listen") {
		t.Errorf("second listener on a busy port: %v, want an error naming --metrics-listen", err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "deptrace_store_write_errors_total 1\n") {
		t.Errorf("GET /metrics: %d\n%s", resp.StatusCode, body)
	}
}

func exposition(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

func sameLines(a, b string) bool {
	as, bs := strings.Split(strings.TrimSpace(a), "\n"), strings.Split(strings.TrimSpace(b), "\n")
	if len(as) != len(bs) {
		return false
	}
	seen := map[string]int{}
	for _, l := range as {
		seen[l]++
	}
	for _, l := range bs {
		if seen[l] == 0 {
			return false
		}
		seen[l]--
	}
	return true
}
