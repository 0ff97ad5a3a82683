package measure

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/tracer"
)

func TestRecall(t *testing.T) {
	truth := []loadgen.Edge{
		{Client: "127.1.0.1", Server: "127.0.0.1", Port: 7000, Proto: "tcp"},
		{Client: "127.1.0.2", Server: "127.0.0.1", Port: 7000, Proto: "tcp"},
		{Client: "", Server: "127.0.0.1", Port: 7001, Proto: "udp"}, // kernel-chosen client
		{Client: "127.1.0.3", Server: "127.0.0.1", Port: 7002, Proto: "tcp"},
	}
	a := func(s string) string { return s }
	flows := []tracer.Flow{
		// seen from the client
		{Proto: "tcp", Direction: tracer.Outbound, LocalAddr: a("127.1.0.1"), RemoteAddr: a("127.0.0.1"), Port: 7000},
		// seen from the server
		{Proto: "tcp", Direction: tracer.Inbound, LocalAddr: a("127.0.0.1"), RemoteAddr: a("127.1.0.2"), Port: 7000},
		{Proto: "udp", Direction: tracer.Outbound, LocalAddr: a("0.0.0.0"), RemoteAddr: a("127.0.0.1"), Port: 7001},
		// wrong protocol for 7002: does not count
		{Proto: "udp", Direction: tracer.Outbound, LocalAddr: a("127.1.0.3"), RemoteAddr: a("127.0.0.1"), Port: 7002},
	}
	found, total := Recall(truth, flows)
	if found != 3 || total != 4 {
		t.Errorf("found %d of %d, want 3 of 4", found, total)
	}
	if found, total := Recall(truth, nil); found != 0 || total != 4 {
		t.Errorf("no flows: %d of %d", found, total)
	}
}

func TestParseLoadResult(t *testing.T) {
	r, err := ParseLoadResult([]byte(`{"workload":"udp","target_rate_per_s":500,"round_trips":1000,"errors":2,"elapsed_ns":2000000000,"rate_per_s":500,"reached":true,"p50_ns":50000,"p90_ns":90000,"p99_ns":99000,"edges":[{"client":"127.1.0.1","server":"127.0.0.1","port":7000,"proto":"udp","round_trips":1000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.RoundTrips != 1000 || r.Elapsed != 2*time.Second || r.P99 != 99*time.Microsecond || len(r.Edges) != 1 || r.Edges[0].Port != 7000 || !r.Reached {
		t.Errorf("%+v", r)
	}
	for _, bad := range []string{"", "not json", `{"round_trips":5}`} {
		if _, err := ParseLoadResult([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestResultsRoundTrip(t *testing.T) {
	rows := []Row{
		{Sweep: "rate", Workload: "tcp-short", TargetRate: 5000, Method: Bundling, Rate: 4990, Reached: true, TracerCPU: 0.2, KernelCPU: 0.5, Recall: 1, TrueEdges: 1, FoundEdges: 1, Records: 10},
		{Sweep: "peers", Workload: "tcp-short", TargetRate: 5000, Peers: 200, Method: Polling, Rate: 4990, TracerCPU: 3, Recall: 0.25},
	}
	dir := t.TempDir()
	if err := WriteResults(dir, rows); err != nil {
		t.Fatal(err)
	}
	got, err := ReadResults(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != rows[0] || got[1] != rows[1] {
		t.Errorf("round trip: %+v", got)
	}
	if rows[0].TotalCPU() != 0.7 {
		t.Errorf("total %v", rows[0].TotalCPU())
	}
	files, err := WritePlots(dir, rows)
	if err != nil || len(files) == 0 {
		t.Errorf("plots: %v %v", files, err)
	}
}

func TestPointsCoverTheSweep(t *testing.T) {
	c := CompareConfig{Workloads: []string{"tcp-short", "udp"}, Rates: []float64{1000, 2000, 3000}, Peers: []int{200, 400}, PeersRate: 5000, PeersWorkload: "udp",
		Concurrency: 4, Persistent: 50, MsgSize: 64, Duration: time.Second, LoadCommand: []string{"deptrace", "bench", "load"}}
	ps := c.points()
	if len(ps) != 2*3+2 {
		t.Fatalf("%d points", len(ps))
	}
	args := c.loadArgs(ps[len(ps)-1])
	want := map[string]string{"--workload": "udp", "--rate": "5000", "--clients": "400", "--concurrency": "4"}
	for i := 0; i+1 < len(args); i++ {
		if v, ok := want[args[i]]; ok && args[i+1] != v {
			t.Errorf("%s = %s, want %s", args[i], args[i+1], v)
		}
	}
}
