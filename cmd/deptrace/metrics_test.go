package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/deptrace/deptrace/internal/testnet"
)

// scrapeMetrics reads url and returns every sample as
// `name{label="value",...}` (labels sorted) -> value.
func scrapeMetrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %s\n%s", url, resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetSummary() != nil:
				out[strings.Replace(key, "{", "_count{", 1)] = float64(m.GetSummary().GetSampleCount())
			case m.GetHistogram() != nil:
				out[strings.Replace(key, "{", "_count{", 1)] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// pingPong makes n TCP connections from a to b:port; on each the client
// sends "ping!" (5 bytes) and the server, having read them, answers
// "pong" (4 bytes), which the client reads: every byte is sent and read.
// It returns the listening socket, still open.
func pingPong(t *testing.T, a, b *testnet.Host, port, n int) net.Listener {
	t.Helper()
	addr := fmt.Sprintf("%s:%d", b.IPv4, port)
	ln := b.Listen(t, "tcp4", addr)
	served := make(chan error, n)
	go func() {
		for range n {
			c, err := ln.Accept()
			if err != nil {
				served <- err
				return
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 5)
			_, err = io.ReadFull(c, buf)
			if err == nil {
				_, err = c.Write([]byte("pong"))
			}
			c.Close()
			served <- err
		}
	}()
	for range n {
		c, err := a.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("ping!")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		// Wait for EOF so the server's close is done before ours.
		if _, err := c.Read(buf); err != io.EOF {
			t.Fatalf("want EOF after pong, got %v", err)
		}
		c.Close()
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	}
	return ln
}

// The agent's /metrics counts exactly the traffic made in two test hosts,
// on both ends, and drops the series once they have been idle for the TTL.
func TestAgentMetricsCountTraffic(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	dir := t.TempDir()
	p := startReady(t, "msg=\"agent started\"", "agent", "--netns", "all", "--interval", "1s",
		"--host-id", "metricstest", "--store", filepath.Join(dir, "deptrace.db"), "--spool", filepath.Join(dir, "spool"),
		"--metrics-listen", "127.0.0.1:0", "--metrics-ttl", "3s", "--pin-path", testPinPath(t, "metrics"))
	m := regexp.MustCompile(`msg="metrics served" .*url=(\S+)`).FindStringSubmatch(p.errText())
	if m == nil {
		t.Fatalf("no metrics URL in the agent's log:\n%s", p.errText())
	}
	url := m[1]

	const port, n = 7300, 7
	ln := pingPong(t, a, b, port, n)

	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	proc := strings.TrimSpace(string(comm))
	out := fmt.Sprintf(`{host="metricstest/%s",port="%d",process=%q,proto="tcp",remote="%s"}`, a.Name, port, proc, b.IPv4)
	in := fmt.Sprintf(`{host="metricstest/%s",port="%d",process=%q,proto="tcp"}`, b.Name, port, proc)
	want := map[string]float64{
		"deptrace_outbound_connections_total" + out:        n,
		"deptrace_outbound_failed_connections_total" + out: 0,
		"deptrace_outbound_sent_bytes_total" + out:         5 * n,
		"deptrace_outbound_received_bytes_total" + out:     4 * n,
		"deptrace_inbound_connections_total" + in:          n,
		"deptrace_inbound_failed_connections_total" + in:   0,
		"deptrace_inbound_sent_bytes_total" + in:           4 * n,
		"deptrace_inbound_received_bytes_total" + in:       5 * n,
	}
	// Drains happen every second: poll (bounded) until every counter has
	// its value; a counter above its value fails at once.
	var got map[string]float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = scrapeMetrics(t, url)
		done := true
		for k, w := range want {
			if got[k] > w {
				t.Fatalf("%s = %v, more than the %v made\n%s", k, got[k], w, dump(got, a.Name, b.Name))
			}
			if got[k] != w {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters never reached the traffic; want %v\ngot:\n%s\nagent log:\n%s", want, dump(got, a.Name, b.Name), p.errText())
		}
		time.Sleep(500 * time.Millisecond)
	}
	// No other series for the two hosts: one dependency, one series each
	// way, no client address, pid or ephemeral port anywhere.
	for k := range got {
		if (strings.Contains(k, a.Name) || strings.Contains(k, b.Name)) && strings.Contains(k, "_connections_total{") && !strings.Contains(k, "failed") {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected series %s", k)
			}
		}
	}
	if s := dump(got, a.Name, b.Name); strings.Contains(s, fmt.Sprintf(`"%s"`, a.IPv4)) {
		t.Errorf("the client address is a label without --metrics-client-addr:\n%s", s)
	}
	// The listening socket: its backlog and no drops.
	lis := fmt.Sprintf(`{host="metricstest/%s",port="%d",process=%q}`, b.Name, port, proc)
	if got["deptrace_listener_backlog_limit"+lis] < 1 || got["deptrace_listener_drops_total"+lis] != 0 {
		t.Errorf("listener %s: backlog %v, drops %v; want a backlog and no drops\n%s", lis,
			got["deptrace_listener_backlog_limit"+lis], got["deptrace_listener_drops_total"+lis], dump(got, b.Name))
	}
	for _, k := range []string{`deptrace_events_lost_total{reason="flow_map_full"}`, `deptrace_drain_duration_seconds_count{}`, `deptrace_flows_total{}`, `deptrace_flow_map_capacity{}`} {
		if _, ok := got[k]; !ok {
			t.Errorf("self-metric %s missing", k)
		}
	}
	if got[`deptrace_drain_duration_seconds_count{}`] < 1 || got[`deptrace_flows_total{}`] < 2 {
		t.Errorf("drains not counted: %v drains, %v flows", got[`deptrace_drain_duration_seconds_count{}`], got[`deptrace_flows_total{}`])
	}

	// Idle, the listener closed: every series of the two hosts goes after
	// the 3 s TTL.
	ln.Close()
	deadline = time.Now().Add(30 * time.Second)
	for {
		got = scrapeMetrics(t, url)
		if dump(got, a.Name, b.Name) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("series still there long after the TTL:\n%s", dump(got, a.Name, b.Name))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if got[`deptrace_metrics_series_expired_total{}`] < 2 {
		t.Errorf("deptrace_metrics_series_expired_total = %v, want at least 2", got[`deptrace_metrics_series_expired_total{}`])
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
	// The port is released on exit.
	if c, err := net.DialTimeout("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics"), time.Second); err == nil {
		c.Close()
		t.Errorf("metrics still served after the agent stopped")
	}
}

// dump lists the samples that name one of the hosts.
func dump(got map[string]float64, hosts ...string) string {
	var lines []string
	for k, v := range got {
		for _, h := range hosts {
			if strings.Contains(k, h) {
				lines = append(lines, fmt.Sprintf("%s %v", k, v))
				break
			}
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
