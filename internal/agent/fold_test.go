package agent

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/tracer"
)

func capFlow(comm, dir string, remote string, port uint16, conns, failed uint64) tracer.Flow {
	f := tracer.Flow{NetNS: 1, Comm: comm, PID: 42, Direction: tracer.Direction(dir), Proto: tracer.ProtoTCP,
		LocalAddr: "192.0.2.1", RemoteAddr: remote, Port: port,
		FirstSeen: time.Unix(100, 0), LastSeen: time.Unix(101, 0)}
	f.Connections, f.FailedConnections, f.FailedRefused, f.BytesSent = conns, failed, failed, 10*conns
	return f
}

func total(flows []tracer.Flow) tracer.Counters {
	var c tracer.Counters
	for _, f := range flows {
		c.Add(f.Counters)
	}
	return c
}

// edges names each flow by its node and edge, with its connections.
func edges(flows []tracer.Flow) map[string]uint64 {
	out := map[string]uint64{}
	for _, f := range flows {
		out[fmt.Sprintf("%s %s %s %s:%d", f.Comm, f.Direction, f.LocalAddr, f.RemoteAddr, f.Port)] += f.Connections + f.FailedConnections
	}
	return out
}

func newCap(max int, now *time.Time) *EdgeCap {
	c := &EdgeCap{MaxEdgesPerNode: max}
	c.st = newFoldState(nil)
	c.st.now = func() time.Time { return *now }
	return c
}

func TestEdgeCapFoldsPastTheCapKeepingTotals(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCap(3, &now)
	var flows []tracer.Flow
	for i := range 10 {
		// A scan's failures first, then edges that worked: the ones that
		// worked are held first.
		conns, failed := uint64(0), uint64(1)
		if i >= 8 {
			conns, failed = 5, 0
		}
		flows = append(flows, capFlow("scan", "outbound", fmt.Sprintf("198.51.100.%d", i+1), uint16(1000+i), conns, failed))
	}
	flows = append(flows, capFlow("web", "outbound", "198.51.100.99", 5432, 7, 0))
	want := total(flows)
	iv := tracer.Interval{Flows: flows, BatchID: "b1"}
	var logBuf bytes.Buffer
	c.fold(&iv, slog.New(slog.NewTextHandler(&logBuf, nil)), nil, nil)
	if got := total(iv.Flows); got != want {
		t.Errorf("totals changed by folding: %+v, want %+v", got, want)
	}
	got := edges(iv.Flows)
	wantEdges := map[string]uint64{
		"scan outbound 192.0.2.1 198.51.100.9:1008":  5,
		"scan outbound 192.0.2.1 198.51.100.10:1009": 5,
		"scan outbound 192.0.2.1 198.51.100.1:1000":  1, // the first failed edge takes the last place
		"scan outbound  _other:0":                    7, // 7 scanned ports folded
		"web outbound 192.0.2.1 198.51.100.99:5432":  7,
	}
	if fmt.Sprint(got) != fmt.Sprint(wantEdges) {
		t.Errorf("edges %v\nwant %v", got, wantEdges)
	}
	if c.st.foldedFlows != 7 || c.st.held != 4 {
		t.Errorf("folded %d held %d, want 7 and 4", c.st.foldedFlows, c.st.held)
	}
	for _, w := range []string{"local end reached --max-edges-per-node", "process=scan", "flows folded into _other edges", "flows=7"} {
		if !strings.Contains(logBuf.String(), w) {
			t.Errorf("log lacks %q:\n%s", w, logBuf.String())
		}
	}
	if strings.Contains(logBuf.String(), "process=web") {
		t.Errorf("web was not capped:\n%s", logBuf.String())
	}
	for _, f := range iv.Flows {
		if f.RemoteAddr == Other && (f.PID != 42 || !f.FirstSeen.Equal(time.Unix(100, 0)) || !f.LastSeen.Equal(time.Unix(101, 0)) || f.FailedRefused != 7) {
			t.Errorf("folded flow %+v", f)
		}
	}

	// The next interval: held edges pass as they are, new ones fold, and
	// the same interval collected again is folded the same way but not
	// counted twice.
	now = now.Add(time.Minute)
	next := []tracer.Flow{
		capFlow("scan", "outbound", "198.51.100.1", 1000, 0, 2),
		capFlow("scan", "outbound", "198.51.100.50", 80, 3, 0),
	}
	for range 2 {
		iv = tracer.Interval{Flows: append([]tracer.Flow(nil), next...), BatchID: "b2"}
		c.fold(&iv, slog.New(slog.DiscardHandler), nil, nil)
		got = edges(iv.Flows)
		wantEdges = map[string]uint64{"scan outbound 192.0.2.1 198.51.100.1:1000": 2, "scan outbound  _other:0": 3}
		if fmt.Sprint(got) != fmt.Sprint(wantEdges) {
			t.Errorf("next interval: edges %v\nwant %v", got, wantEdges)
		}
	}
	if c.st.foldedFlows != 8 {
		t.Errorf("folded %d, want 8 (an interval collected again counts once)", c.st.foldedFlows)
	}

	// Past EdgeIdle without traffic, an edge's place goes to a new one.
	now = now.Add(EdgeIdle + 2*time.Minute)
	iv = tracer.Interval{Flows: []tracer.Flow{capFlow("scan", "outbound", "198.51.100.60", 81, 1, 0)}, BatchID: "b3"}
	c.fold(&iv, slog.New(slog.DiscardHandler), nil, nil)
	if got = edges(iv.Flows); fmt.Sprint(got) != fmt.Sprint(map[string]uint64{"scan outbound 192.0.2.1 198.51.100.60:81": 1}) {
		t.Errorf("after the idle time: %v", got)
	}
	if c.st.held != 1 || len(c.st.nodes) != 1 { // every older edge expired, web's too
		t.Errorf("held %d edges of %d local ends after expiry, want 1 of 1", c.st.held, len(c.st.nodes))
	}
}

// An edge that recurs is held from its last interval, not its first: a
// new peer of a full local end folds while the held edge still carries
// traffic, however long ago the edge was first held.
func TestEdgeCapHoldsAnEdgeWhileItRecurs(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCap(1, &now)
	held := capFlow("web", "outbound", "198.51.100.1", 5432, 1, 0)
	iv := tracer.Interval{Flows: []tracer.Flow{held}}
	c.fold(&iv, slog.New(slog.DiscardHandler), nil, nil)
	for _, step := range []time.Duration{EdgeIdle - 10*time.Minute, 20 * time.Minute} {
		now = now.Add(step)
		// The new peer carries more: with room, it would be held first.
		iv := tracer.Interval{Flows: []tracer.Flow{held, capFlow("web", "outbound", "198.51.100.2", 5432, 5, 0)}}
		c.fold(&iv, slog.New(slog.DiscardHandler), nil, nil)
		want := map[string]uint64{"web outbound 192.0.2.1 198.51.100.1:5432": 1, "web outbound  _other:0": 5}
		if got := edges(iv.Flows); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%v after the first interval: edges %v, want %v", now.Sub(time.Unix(1000, 0)), got, want)
		}
	}
}

// Inbound flows keep their local service (address and port): a server
// with many clients folds them per port it serves.
func TestEdgeCapInboundKeepsTheService(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCap(1, &now)
	var flows []tracer.Flow
	for i := range 4 {
		flows = append(flows, capFlow("dns", "inbound", fmt.Sprintf("198.51.100.%d", i+1), 53, 1, 0))
		flows = append(flows, capFlow("dns", "inbound", fmt.Sprintf("198.51.100.%d", i+1), 853, 1, 0))
	}
	iv := tracer.Interval{Flows: flows}
	c.fold(&iv, slog.New(slog.DiscardHandler), nil, nil)
	got := edges(iv.Flows)
	want := map[string]uint64{
		"dns inbound 192.0.2.1 198.51.100.1:53": 1,
		"dns inbound 192.0.2.1 _other:53":       3,
		"dns inbound 192.0.2.1 _other:853":      4,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("edges %v\nwant %v", got, want)
	}
}

func TestEdgeCapOffAndMetrics(t *testing.T) {
	flows := []tracer.Flow{capFlow("a", "outbound", "198.51.100.1", 1, 1, 0), capFlow("a", "outbound", "198.51.100.2", 1, 1, 0)}
	iv := tracer.Interval{Flows: flows}
	(&EdgeCap{}).fold(&iv, slog.New(slog.DiscardHandler), nil, nil)
	if len(iv.Flows) != 2 {
		t.Errorf("no cap folded: %v", edges(iv.Flows))
	}
	m := metrics.New(metrics.Options{})
	c := &EdgeCap{MaxEdgesPerNode: 1}
	iv = tracer.Interval{Flows: flows}
	c.fold(&iv, slog.New(slog.DiscardHandler), m, nil)
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			switch {
			case x.GetCounter() != nil:
				got[mf.GetName()] = x.GetCounter().GetValue()
			case x.GetGauge() != nil:
				got[mf.GetName()] = x.GetGauge().GetValue()
			}
		}
	}
	for name, want := range map[string]float64{"deptrace_edges_folded_flows_total": 1, "deptrace_edges_held": 1, "deptrace_local_ends_capped": 1} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

func TestIntFlag(t *testing.T) {
	var n int
	f := IntFlag(&n, 1000, 1, 50, "no cap")
	if n != 1000 || f.String() != "1000" {
		t.Fatalf("default %d %q", n, f.String())
	}
	for _, ok := range []string{"0", "1", "50"} {
		if err := f.Set(ok); err != nil {
			t.Errorf("Set(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"-1", "51", "x", ""} {
		if err := f.Set(bad); err == nil || err.Error() != "allowed 0 (no cap) or 1 to 50" {
			t.Errorf("Set(%q): %v", bad, err)
		}
	}
	g := IntFlag(&n, 5, 1, 9, "")
	if err := g.Set("0"); err == nil || err.Error() != "allowed 1 to 9" {
		t.Errorf("Set(0) without a meaning for 0: %v", err)
	}
}

func TestLostAttrsNameEveryCause(t *testing.T) {
	l := tracer.Losses{FlowMapFull: 3, FlowAllocFailed: 2, RecursionMisses: 1}
	got := fmt.Sprint(lostAttrs(l, tracer.Config{FlowMapSize: 64, PortMapSize: 128}))
	want := "[total 6 flow_map_full 3 flow_map_full_hint raise --flow-map-size (now 64) or shorten --interval flow_alloc_failed 2 recursion_misses 1]"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// sample is a metric's value summed over its series: a counter's or a
// gauge's, a histogram's sum and count.
func sample(t *testing.T, m *metrics.Metrics, name string) (value, count float64) {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		found = true
		for _, x := range mf.GetMetric() {
			switch {
			case x.GetCounter() != nil:
				value += x.GetCounter().GetValue()
			case x.GetGauge() != nil:
				value += x.GetGauge().GetValue()
			case x.GetHistogram() != nil:
				value += x.GetHistogram().GetSampleSum()
				count += float64(x.GetHistogram().GetSampleCount())
			}
		}
	}
	if !found {
		t.Fatalf("no metric %s", name)
	}
	return value, count
}

// The drain's metrics count the flows the kernel map held, before the
// cap folds them: with --max-edges-per-node 50, a scan of 1,344 ports
// read in one drain is 1,344 flows read (the map's fill), 50 held and
// 1,294 folded into one _other edge: 51 flows stored and in the
// dependency series, which keep every failed connect.
func TestDrainMetricsCountTheFlowsReadBeforeTheCap(t *testing.T) {
	const read, capEdges = 1344, 50
	var flows []tracer.Flow
	for i := range read {
		flows = append(flows, capFlow("scan", "outbound", "198.51.100.7", uint16(1+i), 0, 1))
	}
	var logs bytes.Buffer
	m := metrics.New(metrics.Options{FlowMapSize: 1024})
	cfg := Config{EdgeCap: EdgeCap{MaxEdgesPerNode: capEdges}}
	in := &intake{cfg: &cfg, log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: m, host: func(uint32) string { return "hostd/qa-d" }}
	iv := tracer.Interval{Flows: flows, BatchID: "b1", Lost: tracer.Losses{FlowMapFull: 3656}}
	in.take(&iv)
	if len(iv.Flows) != capEdges+1 {
		t.Fatalf("%d flows after the cap, want %d held and one _other", len(iv.Flows), capEdges)
	}
	again := tracer.Interval{Flows: append([]tracer.Flow(nil), flows...), BatchID: "b1", Recovered: true}
	in.take(&again) // collected again: not counted again
	for name, want := range map[string]float64{
		"deptrace_flows_total":                       read,
		"deptrace_last_drain_flows":                  read,
		"deptrace_flows_per_drain":                   read,
		"deptrace_flow_map_capacity":                 1024,
		"deptrace_edges_folded_flows_total":          read - capEdges,
		"deptrace_edges_held":                        capEdges,
		"deptrace_outbound_failed_connections_total": read,
		"deptrace_events_lost_total":                 3656,
	} {
		if got, _ := sample(t, m, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if _, n := sample(t, m, "deptrace_flows_per_drain"); n != 1 {
		t.Errorf("deptrace_flows_per_drain_count = %v, want 1 drain", n)
	}
	for _, w := range []string{`msg="local end reached --max-edges-per-node`, "host=hostd/qa-d process=scan", "flows=1294 flows_total=1294"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("log lacks %q:\n%s", w, logs.String())
		}
	}
	if strings.Contains(logs.String(), "netns=") {
		t.Errorf("the log names the namespace by its inode, not its host:\n%s", logs.String())
	}
}

// The "flows folded" lines, once a minute while folding goes on and one
// at stop, add up to every flow folded: each says how many since the
// last one.
func TestFoldLogLinesAddUpToTheFlowsFolded(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCap(1, &now)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	batch := 0
	scan := func(peers int) {
		batch++
		var flows []tracer.Flow
		for i := range peers {
			flows = append(flows, capFlow("scan", "outbound", fmt.Sprintf("198.51.%d.%d", batch, i), 80, 0, 1))
		}
		iv := tracer.Interval{Flows: flows, BatchID: fmt.Sprint(batch)}
		c.fold(&iv, log, nil, func(ns uint32) string { return fmt.Sprintf("hostd/netns:%d", ns) })
	}
	scan(4) // 1 held, 3 folded: logged at once
	now = now.Add(20 * time.Second)
	scan(10) // 10 folded, 20 s after the last line: not logged yet
	now = now.Add(20 * time.Second)
	scan(20)
	now = now.Add(25 * time.Second)
	scan(5) // 65 s after the last line: the 35 folded since
	now = now.Add(5 * time.Second)
	scan(7)
	c.logFolded(log) // the stop: the last 7
	c.logFolded(log) // nothing more
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "flows folded into _other edges") {
			lines = append(lines, l[strings.Index(l, "flows="):])
		}
	}
	want := []string{
		"flows=3 flows_total=3 local_ends_capped=1 edges_held=1",
		"flows=35 since=" + time.Unix(1000, 0).Format(time.RFC3339) + " flows_total=38 local_ends_capped=1 edges_held=1",
		"flows=7 since=" + time.Unix(1065, 0).Format(time.RFC3339) + " flows_total=45 local_ends_capped=1 edges_held=1",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("fold lines:\n%s\nwant:\n%s\nlog:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"), logs.String())
	}
	if !strings.Contains(logs.String(), "host=hostd/netns:1 process=scan") {
		t.Errorf("the capped local end is not named by its host:\n%s", logs.String())
	}
}
