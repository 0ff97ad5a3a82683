package measure

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
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
	if slices.Contains(args, "--realtime") {
		t.Errorf("--realtime without CompareConfig.Realtime: %v", args)
	}
	c.Realtime = true
	if args := c.loadArgs(ps[0]); !slices.Contains(args, "--realtime") {
		t.Errorf("no --realtime with CompareConfig.Realtime: %v", args)
	}
}

// The row of the issue that started these checks: 0.22 % of a core
// reported beside 2,384 ns per round trip at 4,968/s (about 1.18 %).
func TestCheckRowCatchesKernelCPUThatDisagreesWithNsTimesRate(t *testing.T) {
	good := Row{Method: Bundling, Rate: 4968, KernelRate: 5001, KernelNsPerRT: 2384, KernelCPU: 2384 * 5001 / 1e7, TracerCPU: 0.5}
	if err := CheckRow(good, 0.10); err != nil {
		t.Errorf("consistent row refused: %v", err)
	}
	bad := good
	bad.KernelCPU = 0.22
	err := CheckRow(bad, 0.10)
	if err == nil || !strings.Contains(err.Error(), "kernel programs CPU 0.220 %") || !strings.Contains(err.Error(), "2384 ns per round trip") {
		t.Errorf("0.22 %% against 2,384 ns × 5,001/s: %v", err)
	}
	// The bpf_stats run reached a fifth of the rate of the run whose
	// rate the table shows: its CPU agrees with its own rate only.
	mixed := Row{Method: Streaming, Rate: 4968, KernelRate: 1000, KernelNsPerRT: 2384, KernelCPU: 2384 * 1000 / 1e7}
	if err := CheckRow(mixed, 0.10); err == nil || !strings.Contains(err.Error(), "the achieved rate 4968/s") {
		t.Errorf("kernel figures of a run at 1,000/s beside an achieved 4,968/s: %v", err)
	}
	if err := CheckRow(Row{Method: Polling, Rate: 5000, TracerCPU: 20}, 0.10); err != nil {
		t.Errorf("polling has no kernel figures: %v", err)
	}
	// Within the tolerance.
	near := good
	near.KernelCPU *= 1.08
	if err := CheckRow(near, 0.10); err != nil {
		t.Errorf("8 %% off with a 10 %% tolerance: %v", err)
	}
}

// The net figures take bpf_stats' clock reads (runs × the floor) away,
// the CPU in the same proportion; a row without a measured floor keeps
// the measured figures, and CheckRow refuses a floor that is missing
// where runs were counted, or not below the method's own run time.
func TestNetFiguresTakeTheFloorAway(t *testing.T) {
	r := Row{Method: Bundling, Rate: 10000, KernelRate: 10000, TracerCPU: 0.10,
		KernelNsPerRT: 2885, KernelCPU: 2.885, KernelRunsPerRT: 30, FloorNs: 57}
	if got, want := r.NetKernelNsPerRT(), 2885-30*57.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("net ns per round trip %v, want %v", got, want)
	}
	if got, want := r.NetKernelCPU(), 2.885*(2885-30*57.0)/2885; math.Abs(got-want) > 1e-9 {
		t.Errorf("net kernel CPU %v, want %v", got, want)
	}
	if got, want := r.NetTotalCPU(), 0.10+r.NetKernelCPU(); got != want {
		t.Errorf("net total %v, want %v", got, want)
	}
	if err := CheckRow(r, 0.10); err != nil {
		t.Errorf("consistent row refused: %v", err)
	}
	old := r
	old.KernelRunsPerRT, old.FloorNs = 0, 0
	if old.NetKernelNsPerRT() != 2885 || old.NetTotalCPU() != old.TotalCPU() || CheckRow(old, 0.10) != nil {
		t.Errorf("an older sweep's row: net %v, total %v / %v, check %v", old.NetKernelNsPerRT(), old.NetTotalCPU(), old.TotalCPU(), CheckRow(old, 0.10))
	}
	noFloor := r
	noFloor.FloorNs = 0
	if err := CheckRow(noFloor, 0.10); err == nil || !strings.Contains(err.Error(), "floor was not measured") {
		t.Errorf("runs counted, no floor: %v", err)
	}
	disturbed := r
	disturbed.FloorNs = 200 // above 2,885 / 30
	if err := CheckRow(disturbed, 0.10); err == nil || !strings.Contains(err.Error(), "not below the method's own 96.2 ns per run") {
		t.Errorf("a floor above the method's runs: %v", err)
	}
}

func TestCheckReached(t *testing.T) {
	res := loadgen.Result{Rate: 1624, Missed: 16880, Clients: 16, Mean: 9 * time.Millisecond, Errors: 2, FirstError: "dial tcp: i/o timeout"}
	err := CheckReached("tcp-short rate=5000 peers=1000: baseline", res, 5000, 0.95)
	if err == nil {
		t.Fatal("1,624/s of 5,000/s passed")
	}
	for _, want := range []string{"peers=1000: baseline reached 1624/s of the 5000/s asked (32.5 %, below 95 %)", "16880 starts missed", "16 clients", "i/o timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("not one line: %q", err)
	}
	for _, ok := range []struct{ rate, target, min float64 }{{4750, 5000, 0.95}, {5100, 5000, 0.95}, {10, 5000, 0}, {10, 0, 0.95}} {
		if err := CheckReached("x", loadgen.Result{Rate: ok.rate}, ok.target, ok.min); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
}

// A run that falls short is made again, up to Attempts; one that never
// reaches fails the sweep with what it reached.
func TestReachingRetriesThenFails(t *testing.T) {
	var progress strings.Builder
	rates := []float64{3000, 4990}
	c := CompareConfig{MinReached: 0.95, Attempts: 3}
	n := 0
	res, retries, err := c.reaching(&progress, "udp rate=5000", 5000, func() (loadgen.Result, error) {
		n++
		return loadgen.Result{Rate: rates[min(n-1, len(rates)-1)]}, nil
	})
	if err != nil || retries != 1 || n != 2 || res.Rate != 4990 {
		t.Errorf("short once, then reached: %v, %d retries, %d runs, %.0f/s", err, retries, n, res.Rate)
	}
	if !strings.Contains(progress.String(), "udp rate=5000 reached 3000/s") || !strings.Contains(progress.String(), "running it again (2 of 3)") {
		t.Errorf("progress: %q", progress.String())
	}
	n = 0
	_, retries, err = c.reaching(&progress, "udp rate=5000", 5000, func() (loadgen.Result, error) {
		n++
		return loadgen.Result{Rate: 100}, nil
	})
	if err == nil || n != 3 || retries != 2 || !strings.Contains(err.Error(), "(3 runs)") {
		t.Errorf("never reached: %v after %d runs, %d retries", err, n, retries)
	}
	n = 0
	if _, _, err := c.reaching(&progress, "x", 5000, func() (loadgen.Result, error) {
		n++
		return loadgen.Result{}, errors.New("load failed")
	}); err == nil || n != 1 {
		t.Errorf("a failed run is not retried: %v, %d runs", err, n)
	}
}
